"""A worker's metrics (declared in `posttrain_common.metrics`): activity retries and backend
errors (an activity interceptor), gauges read from Temporal visibility (`VisibilityCollector`),
and the HTTP endpoint that serves them (`serving_worker_metrics`).

The visibility gauges are read by a background task every VISIBILITY_EVERY_S, not at scrape
time: a scrape never waits on Temporal, and several Prometheus servers scraping cost Temporal
nothing more. Each read lists at most VISIBILITY_CAP running episodes and as many running jobs
(`posttrain_visibility_truncated` says when it stopped there). A failed read is counted
(`posttrain_visibility_errors_total`), logged once until a read succeeds again, and the gauges
keep their last values; it never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import start_http_server
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.backends.storage import JobStorage
from posttrain_common import metrics
from posttrain_common.settings import Settings
from posttrain_env.models import JobState
from workflows.operations import search_attributes as sa
from workflows.operations.search_attributes import EpisodePhase

log = logging.getLogger(__name__)
VISIBILITY_EVERY_S = 15.0
VISIBILITY_CAP = 10_000
# Closed episodes still holding money are few (each is an alert): at most this many are looked at.
CLOSED_CAP = 1_000
# The activities that call the jobs backend or the Hub: their failures are backend errors.
BACKEND_ACTIVITIES = frozenset(
    {
        "submit_job",
        "start_known_job",
        "observe_jobs",
        "cancel_job",
        "job_logs",
        "read_score",
        "resolve_datasets",
        "prepare_episode",
        "check_contamination",
        "find_orphan_jobs",
        "cancel_orphan_job",
    }
)
RUNNING_EPISODES = "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running'"
RUNNING_JOBS = "WorkflowType = 'JobWorkflow' AND ExecutionStatus = 'Running'"
# Closed episodes that still hold a reservation (running ones are counted from their list). A
# run that continued as new is closed too, but its episode goes on in the next run; so does a
# run terminated from outside once the reconciler started it again (only latest runs count).
CLOSED_HOLDING = (
    "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus != 'Running' "
    f"AND ExecutionStatus != 'ContinuedAsNew' AND {sa.RESERVED_MICRO_USD.name} > 0"
)
UNKNOWN_STATE = "unknown"


# -- activity retries and backend errors --------------------------------------------------------


class ActivityMetricsInterceptor(Interceptor):
    """Counts every activity attempt after the first, and the attempts and failures of the
    backend's activities (BACKEND_ACTIVITIES)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityMetrics(next)


class _ActivityMetrics(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        kind = info.activity_type
        if info.attempt > 1:
            metrics.ACTIVITY_RETRIES.labels(kind).inc()
        if kind not in BACKEND_ACTIVITIES:
            return await self.next.execute_activity(input)
        metrics.BACKEND_CALLS.labels(kind).inc()
        try:
            return await self.next.execute_activity(input)
        except Exception as err:  # a cancellation (BaseException) is not the backend's error
            metrics.BACKEND_ERRORS.labels(kind, error_kind(err)).inc()
            raise


def error_kind(err: BaseException) -> str:
    """An ApplicationError's type (our ErrorType values, a backend's failure kinds), else the
    exception's class: both sets are bounded by the code."""
    if isinstance(err, ApplicationError) and err.type:
        return err.type
    return type(err).__name__


# -- Temporal visibility ------------------------------------------------------------------------


@dataclass
class VisibilityReading:
    episodes: Counter[str] = field(default_factory=Counter)
    jobs: Counter[tuple[str, str]] = field(default_factory=Counter)
    reserved_micro_usd: int = 0
    settled_micro_usd: int = 0
    ended_holding: int = 0
    unconfirmed: int = 0
    oldest_unconfirmed_s: float = 0.0
    truncated: bool = False


class VisibilityCollector:
    """Reads Temporal visibility into the gauges, every `every_s` while `run()` runs."""

    def __init__(
        self,
        client: Client,
        backend: str,
        every_s: float = VISIBILITY_EVERY_S,
        cap: int = VISIBILITY_CAP,
    ) -> None:
        self._client = client
        self._backend = backend
        self._every_s = every_s
        self._cap = cap
        self._failing = False
        self._job_labels: set[tuple[str, str]] = set()
        self._episode_labels: set[str] = set()

    async def run(self) -> None:
        while True:
            await self.collect()
            await asyncio.sleep(self._every_s)

    async def collect(self) -> VisibilityReading | None:
        """One reading, published; None when Temporal could not be read (counted, logged)."""
        try:
            reading = await self.read()
        except RPCError as err:
            self._failed(err.status.name if err.status is not None else "unknown", err)
            return None
        except Exception as err:  # a bug here must not stop the worker either
            self._failed(type(err).__name__, err)
            return None
        if self._failing:
            log.info("metrics: Temporal visibility is read again")
        self._failing = False
        self.publish(reading)
        return reading

    async def read(self) -> VisibilityReading:
        reading = VisibilityReading()
        listed = 0
        async for execution in self._client.list_workflows(RUNNING_EPISODES, limit=self._cap):
            listed += 1
            attrs = execution.typed_search_attributes
            state = attrs.get(sa.STATE) or UNKNOWN_STATE
            reading.episodes[state] += 1
            reserved = attrs.get(sa.RESERVED_MICRO_USD) or 0
            reading.reserved_micro_usd += reserved
            reading.settled_micro_usd += attrs.get(sa.SPEND_MICRO_USD) or 0
            if state == EpisodePhase.ended and reserved > 0:
                reading.ended_holding += 1
        reading.truncated = listed >= self._cap
        listed = 0
        async for execution in self._client.list_workflows(RUNNING_JOBS, limit=self._cap):
            listed += 1
            attrs = execution.typed_search_attributes
            backend = attrs.get(sa.BACKEND) or self._backend
            reading.jobs[(attrs.get(sa.STATE) or UNKNOWN_STATE, backend)] += 1
            pending = attrs.get(sa.CANCEL_PENDING_SINCE)
            if pending is not None:
                reading.unconfirmed += 1
                # Measured as the job is seen: a clock read before the listing can precede a
                # cancellation requested while it ran, and its age would come out below 0.
                age = (datetime.now(UTC) - pending).total_seconds()
                reading.oldest_unconfirmed_s = max(reading.oldest_unconfirmed_s, age)
        reading.truncated = reading.truncated or listed >= self._cap
        async for execution in self._client.list_workflows(CLOSED_HOLDING, limit=CLOSED_CAP):
            # A run terminated from outside keeps the attributes it had; once the reconciler
            # started it again (posttrain_server/reconcile.py) its newer run holds the money.
            latest = await self._client.get_workflow_handle(execution.id).describe()
            if latest.run_id == execution.run_id:
                reading.ended_holding += 1
        return reading

    def publish(self, reading: VisibilityReading) -> None:
        """Set the gauges; states seen before and absent now go to 0 (never left stale)."""
        self._episode_labels |= {s.value for s in EpisodePhase} | set(reading.episodes)
        for state in self._episode_labels:
            metrics.EPISODES.labels(state).set(reading.episodes.get(state, 0))
        self._job_labels |= {(s.value, self._backend) for s in JobState} | set(reading.jobs)
        for state, backend in self._job_labels:
            metrics.JOBS.labels(state, backend).set(reading.jobs.get((state, backend), 0))
        metrics.RESERVED_MICRO_USD.set(reading.reserved_micro_usd)
        metrics.SETTLED_MICRO_USD.set(reading.settled_micro_usd)
        metrics.ENDED_EPISODE_RESERVATIONS.set(reading.ended_holding)
        metrics.UNCONFIRMED_CANCELLATIONS.set(reading.unconfirmed)
        metrics.OLDEST_UNCONFIRMED_CANCELLATION_AGE.set(reading.oldest_unconfirmed_s)
        metrics.VISIBILITY_TRUNCATED.set(1 if reading.truncated else 0)
        if reading.truncated:
            log.warning("metrics: visibility read stopped at %d workflows of a kind", self._cap)
        metrics.VISIBILITY_LAST_SUCCESS.set(time.time())

    def _failed(self, kind: str, err: BaseException) -> None:
        metrics.VISIBILITY_ERRORS.labels(kind).inc()
        if not self._failing:
            log.warning("metrics: Temporal visibility could not be read (%s): %s", kind, err)
        self._failing = True


# -- serving ------------------------------------------------------------------------------------


class MetricsEndpointError(RuntimeError):
    """The metrics endpoint cannot listen where the settings say (a port taken, say)."""


def metrics_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/metrics"


async def count_stored_bytes(storage: JobStorage, every_s: float) -> None:
    """`posttrain_stored_bytes`, every `every_s` (a walk of the job folders: never at scrape
    time). A backend that keeps no folders here leaves the gauge unset."""
    while True:
        try:
            held = await storage.held_bytes()
        except OSError as exc:
            log.warning("could not count the job folders' bytes: %s", exc)
            held = None
        for holder, size in (held or {}).items():
            metrics.STORED_BYTES.labels(holder).set(size)
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def serving_worker_metrics(
    settings: Settings,
    client: Client,
    backend: str,
    *,
    port: int | None = None,
    every_s: float = VISIBILITY_EVERY_S,
    storage: JobStorage | None = None,
) -> AsyncIterator[str | None]:
    """The worker's series while inside: its info gauge, the visibility collector, and the HTTP
    endpoint on `port` (None: none; `server` serves them on the gateway's /metrics). Yields the
    endpoint's URL, or None. Raises MetricsEndpointError when the port cannot be bound."""
    server = None
    url = None
    if port is not None:
        try:
            server, _thread = start_http_server(port, settings.metrics_host)
        except OSError as exc:
            raise MetricsEndpointError(
                f"cannot serve metrics on {settings.metrics_host}:{port} "
                f"(POSTTRAIN_WORKER_METRICS_PORT, POSTTRAIN_METRICS_HOST): {exc}"
            ) from None
        url = metrics_url(settings.metrics_host, port)
    metrics.WORKER_INFO.labels(backend).set(1)
    collector = asyncio.create_task(VisibilityCollector(client, backend, every_s).run())
    stored = asyncio.create_task(count_stored_bytes(storage, every_s)) if storage else None
    try:
        yield url
    finally:
        for task in (collector, stored):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        metrics.WORKER_INFO.remove(backend)
        if server is not None:
            await asyncio.to_thread(server.shutdown)  # waits out its poll (0.5 s)
            server.server_close()
