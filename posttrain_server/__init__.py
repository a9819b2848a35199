"""Layer 5, the roof: the entry points, and the only place that imports every layer.

cli.py                `posttrain-env`: every subcommand below
server.py             `uv run server`: the gateway, a worker, the embedded Temporal
worker.py             the Temporal worker: every workflow and activity
agent_worker.py       `posttrain-env agent-worker`: the only process that runs agent code
wiring.py             backends from settings; the calls activities make to other workflows
temporal_client.py    connecting to Temporal (runtime, data converter, core log forwarding)
temporal_dev.py       the embedded, file-backed Temporal dev server
temporal_setup.py, temporal_cli.py  the search attributes (`posttrain-env temporal setup`)
demo.py               `posttrain-env demo`: one whole episode on this machine
hub_cli.py            `posttrain-env hub`: the local backend's models and datasets
episodes_cli.py       `posttrain-env episodes`: find, read and cancel episodes;
                      episode_queries.py: its filters as visibility queries
audit_trail.py        an episode's audit record, read from its Temporal history
campaign_cli.py       `posttrain-env campaign run|status|list|cancel|resume|retry|report`;
                      campaign_progress.py, campaign_retry.py, campaign_report_cli.py: its parts
"""
