"""Wiring of the Temporal worker: the workflows, and the activities with their injected clients."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.worker import Worker

from activities.backend import JobsBackend
from activities.episodes import EpisodeActivities, EpisodeConfig
from activities.jobs import JobsActivities, WatcherSettings
from activities.keys import ServerKey
from posttrain_env.settings import Settings
from tasks.registry import TASKS_DIR
from workflows.account import AccountWorkflow
from workflows.episode import EpisodeWorkflow
from workflows.ids import account_workflow_id, watcher_workflow_id
from workflows.job import JobWorkflow
from workflows.session import SessionWorkflow
from workflows.watcher import WatcherWorkflow

# One Hub listing per look on Hugging Face (and the fake that stands in for it); reading job
# files locally costs nothing.
DEFAULT_WATCH_INTERVAL_S = 30.0
LOCAL_WATCH_INTERVAL_S = 2.0
LOCAL_BRISK_LOOK_S = 0.1
CORE_LOGGER = "temporalio.core"

WORKFLOWS: Sequence[type] = (
    SessionWorkflow,
    EpisodeWorkflow,
    JobWorkflow,
    WatcherWorkflow,
    AccountWorkflow,
)


@functools.cache
def core_runtime() -> Runtime:
    """The process's Temporal runtime (one per process), forwarding the SDK core's own log to
    Python logging as `temporalio.core`. That log is where a payload over Temporal's limit
    shows (`TMPRL1103` at ERROR: the workflow task then fails in a loop), so the server's log
    and the tests see it."""
    return Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(
                    logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
                ),
            )
        )
    )


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        runtime=core_runtime(),
    )


def make_backend(settings: Settings) -> JobsBackend:
    """The backend `POSTTRAIN_BACKEND` names. Raises SystemExit with a message a person can act
    on when it cannot be built (e.g. `hf` without `HF_TOKEN`)."""
    if settings.backend == "fake":
        from activities.fake_backend import FakeBackend

        return FakeBackend(settings.state_dir / "fake")
    if settings.backend == "local":
        from activities.local_backend import LocalBackend

        return LocalBackend.from_settings(settings)
    from activities.hf_backend import HfBackend

    return HfBackend.from_settings(settings)


def build_worker(
    client: Client,
    settings: Settings,
    backend: JobsBackend,
    *,
    task_queue: str | None = None,
    tasks_dir: Path | None = None,
    watch_interval_s: float | None = None,
) -> Worker:
    """A worker for `task_queue` (default: the settings') with every workflow and activity."""
    queue = task_queue or settings.task_queue
    tasks_dir = tasks_dir or settings.tasks_dir or TASKS_DIR
    namespace = client.namespace
    key = ServerKey.load_or_create(settings.state_dir / "server.key")
    watcher = WatcherSettings(
        workflow_id=watcher_workflow_id(namespace, queue),
        interval_s=watch_interval_s
        or settings.watch_interval_s
        or (LOCAL_WATCH_INTERVAL_S if backend.name == "local" else DEFAULT_WATCH_INTERVAL_S),
        # Local jobs are files: look again briskly after a change (short jobs end at once).
        min_interval_s=LOCAL_BRISK_LOOK_S if backend.name == "local" else None,
    )
    jobs = JobsActivities(backend, key, client, tasks_dir, watcher)
    episodes = EpisodeActivities(
        backend,
        client,
        EpisodeConfig(
            tasks_dir=tasks_dir,
            watcher_workflow_id=watcher.workflow_id,
            account_workflow_id=account_workflow_id(namespace, queue),
            cancel_confirm_s=settings.cancel_confirm_s,
            max_live_episodes=settings.max_live_episodes,
            spend_cap_micro_usd=settings.spend_cap_micro_usd,
            continue_as_new_events=settings.continue_as_new_events,
            continue_as_new_bytes=settings.continue_as_new_bytes,
        ),
    )
    workflows = list(WORKFLOWS)
    activities: list[Callable[..., Any]] = [
        jobs.submit_job,
        jobs.observe_jobs,
        jobs.cancel_job,
        jobs.job_logs,
        jobs.read_score,
        jobs.resolve_datasets,
        episodes.prepare_episode,
        episodes.reserve_server_spend,
    ]
    if backend.name == "hf":
        workflows_hf, activities_hf = _orphan_reaper(client, backend, queue)
        workflows += workflows_hf
        activities += activities_hf
    return Worker(client, task_queue=queue, workflows=workflows, activities=activities)


def _orphan_reaper(
    client: Client, backend: JobsBackend, queue: str
) -> tuple[list[type], list[Callable[..., Any]]]:
    """The hf backend's orphan reaper: its workflow, its activities, and its Schedule (created
    in the background of the running loop; see ReaperActivities.ensure_schedule_soon)."""
    from activities.hf.reaper import ReaperActivities
    from activities.hf_backend import HfBackend
    from workflows.reaper import ReaperWorkflow

    assert isinstance(backend, HfBackend)
    reaper = ReaperActivities(backend, client)
    reaper.ensure_schedule_soon(queue)
    return [ReaperWorkflow], [reaper.find_orphan_jobs, reaper.cancel_orphan_job]
