"""The scale bench's server work per job is read from the dev server's request counters: the
operations it names are counted on the service it names, the bench's own reads are not; on
the port `--server-arg` gives the server, if it gives one."""

from __future__ import annotations

from bench._server_work import given_metrics_port, server_work


def counter(family: str, rows: list[tuple[str, str, int]]) -> str:
    """A counter family as the dev server prints it (its samples are `<family>_total`)."""
    lines = [f"# HELP {family} {family} counter", f"# TYPE {family} counter"]
    lines += [
        f'{family}{{namespace="default",operation="{op}",service_name="{service}"}} {value}'
        for op, service, value in rows
    ]
    return "\n".join(lines) + "\n"


METRICS = counter(
    "service_requests",
    [
        ("RespondWorkflowTaskCompleted", "frontend", 25),
        ("RespondWorkflowTaskCompleted", "history", 25),
        ("RespondActivityTaskCompleted", "frontend", 7),
        ("SignalWorkflowExecution", "frontend", 1),
        ("SignalWorkflowExecution", "history", 8),
        ("QueryWorkflow", "frontend", 3),
        ("DescribeWorkflowExecution", "frontend", 40),
        ("GetWorkflowExecutionHistory", "frontend", 9),
    ],
) + counter(
    "persistence_requests",
    [
        ("UpdateWorkflowExecution", "history", 90),
        ("CreateWorkflowExecution", "history", 2),
        ("ReadHistoryBranch", "history", 30),
    ],
)


def test_the_server_work_counts_each_operation_once_and_leaves_the_benchs_reads_out() -> None:
    assert server_work(METRICS) == {
        "workflow tasks": 25.0,  # the frontend's, not again the history service's
        "activity tasks": 7.0,
        "signals": 8.0,  # the history service's: from clients and from workflows
        "queries": 3.0,
        "heartbeats": 0.0,  # none sent: still reported
        "persistence writes": 92.0,  # updates and creations, not reads
    }


def test_the_metrics_port_given_to_the_server_is_the_one_read() -> None:
    assert given_metrics_port(["--metrics-port", "9391"]) == 9391
    assert given_metrics_port(["--log-level", "warn", "--metrics-port=9392"]) == 9392
    assert given_metrics_port(["--log-level", "warn"]) is None
