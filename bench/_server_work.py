"""The Temporal dev server's work, from its own request counters (its Prometheus metrics,
`temporal server start-dev --metrics-port N`): what a bench level's workflows and activities
cost the server, per job."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The server's work a level's workflows and activities cause, by the dev server's request
# counters (operation, service), each operation counted on one service. The bench's own
# describes and history reads (`still_open`, `read_histories`) are other operations.
SERVER_WORK: dict[str, tuple[str, str]] = {
    "workflow tasks": ("RespondWorkflowTaskCompleted", "frontend"),
    "activity tasks": ("RespondActivityTaskCompleted", "frontend"),
    "signals": ("SignalWorkflowExecution", "history"),  # from clients and from workflows
    "queries": ("QueryWorkflow", "frontend"),
    "heartbeats": ("RecordActivityTaskHeartbeat", "frontend"),
}
PERSISTENCE_WRITES = ("UpdateWorkflowExecution", "CreateWorkflowExecution")


def server_work(metrics: str) -> dict[str, float]:
    """`SERVER_WORK`'s counts and the persistence writes, from the dev server's metrics text."""
    wanted = {key: name for name, key in SERVER_WORK.items()}
    work = dict.fromkeys([*SERVER_WORK, "persistence writes"], 0.0)
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:  # a counter's samples are named `<family>_total`
            operation = sample.labels.get("operation", "")
            if family.name == "service_requests":
                name = wanted.get((operation, sample.labels.get("service_name", "")))
                if name is not None:
                    work[name] += sample.value
            elif family.name == "persistence_requests" and operation in PERSISTENCE_WRITES:
                work["persistence writes"] += sample.value
    return work


async def read_server_work(port: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(f"http://127.0.0.1:{port}/metrics")
        response.raise_for_status()
        return server_work(response.text)


def given_metrics_port(server_args: list[str]) -> int | None:
    """The metrics port `--server-arg` gives the dev server (`--metrics-port N` or `=N`)."""
    for index, arg in enumerate(server_args):
        if arg == "--metrics-port" and index + 1 < len(server_args):
            return int(server_args[index + 1])
        if arg.startswith("--metrics-port="):
            return int(arg.split("=", 1)[1])
    return None
