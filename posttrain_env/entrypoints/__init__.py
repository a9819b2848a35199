"""The roof: the entry points, and the only place that imports every layer.

cli.py              `posttrain-env` (server, worker, demo, hub)
server.py           `uv run server`: the gateway, a worker, the embedded Temporal
worker.py           the Temporal worker: every workflow and activity
wiring.py           backends from settings; the calls activities make to other workflows
temporal_client.py  connecting to Temporal (runtime, data converter, core log forwarding)
temporal_dev.py     the embedded, file-backed Temporal dev server
demo.py             `posttrain-env demo`: one whole episode on this machine
hub_cli.py          `posttrain-env hub`: the local backend's models and datasets
"""
