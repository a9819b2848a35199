"""Layer 6, the roof: the entry points, and the only place that imports every layer.

cli.py              `posttrain-env`: every subcommand below
server.py           `uv run server`: the gateway, a worker, the embedded Temporal
worker.py           the Temporal worker: every workflow and activity
full_collections.py a worker's full garbage collections on a schedule of its own
agent_worker.py     `posttrain-env agent-worker`: the only process that runs agent code
wiring.py           the backend from settings (through the registry); the calls activities make
                    to other workflows
deployment_key.py   the deployment's server key, resolved once per process and checked
shutdown.py         the bound on a process's shutdown
cluster_local.py    `posttrain-env cluster-local`: the production shape on one machine
demo.py             `posttrain-env demo`: one whole episode on this machine
audit_trail.py      an episode's audit record, read from its Temporal history
temporal/           connecting to Temporal (client.py), the embedded dev server (dev_server.py),
                    the search attributes a namespace needs (setup.py)
commands/           the operator's subcommands: episodes (and episode_queries), campaign (and
                    its progress, retry, report), hub, key, temporal
campaigns/          a campaign's report: its numbers, plots and files
"""
