"""Every Prometheus metric we export, declared once (names, help, labels).

The gateway serves them on its own `/metrics`; a worker on `POSTTRAIN_WORKER_METRICS_PORT`
(`posttrain-env worker`), or through the gateway's `/metrics` when it runs inside `server`.
They live in prometheus-client's process registry (`REGISTRY`), where its process and
Python collectors are too.

Labels are bounded sets only: a tool of the catalogue (else `other`), a tool path, an error
type or exception class, an episode or job state, a backend name, an activity type. Never an
episode, session or job id (one series each would grow without end) and never a secret.
`deploy/alerts.yml` names these metrics; tests/operator/test_metrics_rules.py checks that
every name it uses is declared here.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

PREFIX = "posttrain_"
# Tool calls take from milliseconds (a status) to minutes (`jobs_wait`, `submit`).
TOOL_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# -- the gateway ---------------------------------------------------------------------------------

TOOL_CALL_SECONDS = Histogram(
    "posttrain_gateway_tool_call_seconds",
    "Tool calls answered by the gateway, from the call to its answer, by tool and path "
    "(step: OpenEnv step over /ws or /step; openenv_mcp: tools/call over POST /mcp; mcp: an "
    "episode's MCP endpoint). Calls that failed before an answer are not timed.",
    ["tool", "path"],
    buckets=TOOL_CALL_BUCKETS,
)
TOOL_CALL_ERRORS = Counter(
    "posttrain_gateway_tool_call_errors_total",
    "Tool calls answered with an error, by tool and kind: the episode's error type (e.g. "
    "budget_exhausted) or the gateway's (unavailable: Temporal did not answer; payload_too_large; "
    "unknown_episode; internal).",
    ["tool", "kind"],
)
PAYLOAD_REFUSALS = Counter(
    "posttrain_gateway_payload_refusals_total",
    "Requests the gateway refused for their size, by kind (body: an episode MCP request body "
    "over the limit; tool_call: a call over Temporal's update limit once encoded). Plain routes' "
    "413 and WebSocket frames closed with 1009 are refused by Starlette and uvicorn themselves, "
    "before our code runs, and are not counted.",
    ["kind"],
)

# -- the worker ----------------------------------------------------------------------------------

WORKER_INFO = Gauge(
    "posttrain_worker_info",
    "1 while a worker of this process runs, labelled with its jobs backend.",
    ["backend"],
)
ACTIVITY_RETRIES = Counter(
    "posttrain_activity_retries_total",
    "Activity attempts after the first (attempt > 1), by activity type.",
    ["activity_type"],
)
BACKEND_CALLS = Counter(
    "posttrain_backend_calls_total",
    "Attempts of the activities that call the jobs backend or the Hub, by activity type.",
    ["activity_type"],
)
BACKEND_ERRORS = Counter(
    "posttrain_backend_errors_total",
    "Failed attempts of the activities that call the jobs backend or the Hub, by activity type "
    "and kind (the ApplicationError's type, else the exception's class).",
    ["activity_type", "kind"],
)

# -- Temporal visibility, read by a worker every VISIBILITY_EVERY_S ------------------------------

EPISODES = Gauge(
    "posttrain_episodes",
    "Running episode workflows by PtState (running, ending, ended; unknown: not yet set).",
    ["state"],
)
JOBS = Gauge(
    "posttrain_jobs",
    "Running job workflows by PtState (the job's state) and backend.",
    ["state", "backend"],
)
UNCONFIRMED_CANCELLATIONS = Gauge(
    "posttrain_unconfirmed_cancellations",
    "Running job workflows whose cancellation is not confirmed yet (PtCancelPendingSince set).",
)
OLDEST_UNCONFIRMED_CANCELLATION_AGE = Gauge(
    "posttrain_oldest_unconfirmed_cancellation_age_seconds",
    "How long the oldest unconfirmed cancellation has been pending (0 when none is).",
)
RESERVED_MICRO_USD = Gauge(
    "posttrain_reserved_micro_usd",
    "Reserved spend of running episodes (sum of PtReservedMicroUsd), in micro-USD.",
)
SETTLED_MICRO_USD = Gauge(
    "posttrain_settled_micro_usd",
    "Settled spend of running episodes (sum of PtSpendMicroUsd), in micro-USD.",
)
ENDED_EPISODE_RESERVATIONS = Gauge(
    "posttrain_ended_episode_reservations",
    "Episodes that ended (PtState ended, or the workflow closed) and still hold a reservation "
    "(PtReservedMicroUsd > 0): money held for nothing.",
)
STORED_BYTES = Gauge(
    "posttrain_stored_bytes",
    "Host disk the backend's job folders hold, by holder: running (what running jobs may still "
    "take), live (artifacts of live episodes), retained (artifacts of ended episodes kept for "
    "retention). Only where the backend keeps its folders on this host (local). Per episode: "
    "its service_spend's storage block, `posttrain-env episodes show`.",
    ["holder"],
)
VISIBILITY_ERRORS = Counter(
    "posttrain_visibility_errors_total",
    "Failed reads of Temporal visibility by the metrics collector, by kind (the RPC status).",
    ["kind"],
)
VISIBILITY_TRUNCATED = Gauge(
    "posttrain_visibility_truncated",
    "1 when the last visibility read stopped at its cap (VISIBILITY_CAP workflows of a kind): "
    "the gauges then undercount.",
)
VISIBILITY_LAST_SUCCESS = Gauge(
    "posttrain_visibility_last_success_timestamp_seconds",
    "When the visibility gauges were last read in full (Unix time).",
)


def metric_names() -> set[str]:
    """Every sample name our metrics export (a counter `x_total` also exports `x_created`; a
    histogram `x_bucket`, `x_sum`, `x_count`, `x_created`)."""
    names: set[str] = set()
    for metric in REGISTRY.collect():
        if metric.name.startswith(PREFIX):
            names.update(_sample_names(metric.name, metric.type))
    return names


def _sample_names(name: str, kind: str) -> set[str]:
    """The sample names a metric family exports, even before it has a series (a labelled
    metric with no series yet has no samples to read them from)."""
    if kind == "counter":
        return {f"{name}_total", f"{name}_created"}
    if kind == "histogram":
        return {f"{name}_{suffix}" for suffix in ("bucket", "sum", "count", "created")}
    return {name}
