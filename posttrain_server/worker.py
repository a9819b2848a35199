"""The Temporal worker: every workflow, and the activities with their injected clients and
interfaces (`wiring.py`). `posttrain-env worker` runs one on its own; `server` runs one beside
the gateway unless `--no-worker`."""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, cast

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.backends.interface import JobsBackend, OrphanSource
from activities.backends.registry import backend_info
from activities.backends.storage import JobStorage, NoStorage
from activities.campaigns.activities import CampaignActivities, CampaignConfig
from activities.campaigns.store import CampaignStore
from activities.contamination.activities import ContaminationActivities
from activities.episodes.activities import EpisodeActivities, EpisodeConfig
from activities.jobs.activities import JobsActivities
from activities.jobs.reaper import ReaperActivities
from activities.jobs.reconciler import ReconcilerActivities
from activities.records.audit import AuditActivities
from activities.records.retention import RetentionActivities
from posttrain_common.keys import ServerKey, ServerKeyError
from posttrain_common.settings import Settings
from posttrain_env.models import MICRO
from posttrain_server.deployment_key import check_deployment, resolve_server_key
from posttrain_server.full_collections import full_collections_every
from posttrain_server.reconcile import TemporalStrandedWorkflows
from posttrain_server.shutdown import ShutdownDeadline, stop_on_signals
from posttrain_server.temporal.client import connect, sdk_metrics_address
from posttrain_server.temporal.setup import require_search_attributes
from posttrain_server.wiring import (
    TemporalAccount,
    TemporalEpisodeCalls,
    TemporalEpisodeLiveness,
    TemporalEpisodeTrail,
    TemporalJobWatch,
    WatcherSettings,
    make_backend,
    schedule_reaper_soon,
    schedule_retention_soon,
)
from posttrain_server.worker_metrics import (
    ActivityMetricsInterceptor,
    MetricsEndpointError,
    serving_worker_metrics,
)
from tasks.registry import TASKS_DIR
from workflows.campaign.rollout import RolloutWorkflow
from workflows.campaign.workflow import CampaignWorkflow
from workflows.episode.session import SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import account_workflow_id, watcher_workflow_id
from workflows.job.watcher import WatcherWorkflow
from workflows.job.workflow import JobWorkflow
from workflows.operations.account import AccountWorkflow
from workflows.operations.deployment import DeploymentWorkflow
from workflows.operations.reaper import ReaperWorkflow
from workflows.operations.retention import RetentionWorkflow

log = logging.getLogger(__name__)
# Workflow tasks one worker runs at once. A worker process runs workflow code on one core at a
# time (the GIL), so past a handful more slots only queue tasks inside the process, where their
# wait counts against the workflow task timeout (10 s). At the SDK's default of 100, a burst of
# 50 resets timed tasks out in a loop (each retry redone from scratch) and clients got
# FAILED_PRECONDITION (issue 18); bounded, the backlog waits on the Temporal server instead,
# where no timeout runs, and another worker may take it.
MAX_WORKFLOW_TASKS = 10

WORKFLOWS: Sequence[type] = (
    DeploymentWorkflow,
    SessionWorkflow,
    EpisodeWorkflow,
    JobWorkflow,
    WatcherWorkflow,
    AccountWorkflow,
    CampaignWorkflow,
    RolloutWorkflow,
    RetentionWorkflow,
    ReaperWorkflow,
)


def build_worker(
    client: Client,
    settings: Settings,
    backend: JobsBackend,
    *,
    key: ServerKey,
    task_queue: str | None = None,
    tasks_dir: Path | None = None,
    watch_interval_s: float | None = None,
    storage: JobStorage | None = None,
    run_workflows: bool = True,
) -> Worker:
    """A worker for `task_queue` (default: the settings') with every workflow and activity.
    `key`: the deployment's server key (`deployment_key.resolve_server_key`; a test passes its
    own); `storage`: where the backend keeps job folders (default: the backend's own);
    `run_workflows=False`: activities only, beside `workflow_only_worker`s in other processes
    (a process runs workflow code on one core: the GIL)."""
    queue = task_queue or settings.task_queue
    info = backend_info(backend.name)
    capabilities = info.capabilities
    storage = storage or backend.storage()
    audit_dir = settings.audit_folder
    tasks_dir = tasks_dir or settings.tasks_dir or TASKS_DIR
    namespace = client.namespace
    watcher = WatcherSettings(
        workflow_id=watcher_workflow_id(namespace, queue),
        interval_s=watch_interval_s or settings.watch_interval_s or capabilities.watch_interval_s,
        min_interval_s=capabilities.brisk_look_s,
    )
    jobs = JobsActivities(backend, key, TemporalJobWatch(client, watcher, queue), tasks_dir)
    episodes = EpisodeActivities(
        backend,
        TemporalAccount(client, queue),
        EpisodeConfig(
            tasks_dir=tasks_dir,
            watcher_workflow_id=watcher.workflow_id,
            watch_shards=settings.watch_shards,
            account_workflow_id=account_workflow_id(namespace, queue),
            cancel_confirm_s=settings.cancel_confirm_s,
            max_live_episodes=settings.max_live_episodes,
            spend_cap_micro_usd=settings.spend_cap_micro_usd,
            continue_as_new_events=settings.continue_as_new_events,
            continue_as_new_bytes=settings.continue_as_new_bytes,
            deployment=settings.deployment,
            accept_unchecked_rewards=settings.accept_unchecked_rewards,
            storage_micro_usd_per_tb_month=round(settings.storage_usd_per_tb_month * MICRO),
            storage_billed_days=settings.storage_billed_days,
        ),
    )
    audit = AuditActivities(TemporalEpisodeTrail(client), backend, key, audit_dir, storage)
    retention = RetentionActivities(
        storage, TemporalEpisodeLiveness(client), audit_dir, settings.retention_policy
    )
    # Grader-side: on this worker, which runs no agent code.
    contamination = ContaminationActivities(
        TemporalEpisodeTrail(client),
        backend,
        tasks_dir,
        accept_unchecked=settings.accept_unchecked_rewards,
    )
    campaigns = CampaignActivities(
        backend,
        CampaignStore(settings.campaign_root),
        TemporalEpisodeCalls(client),
        CampaignConfig(tasks_dir=tasks_dir, project_version=project_version()),
    )
    workflows = list(WORKFLOWS) if run_workflows else []
    activities: list[Callable[..., Any]] = [
        jobs.submit_job,
        jobs.start_known_job,
        jobs.observe_jobs,
        jobs.cancel_job,
        jobs.job_logs,
        jobs.read_score,
        jobs.keep_outputs,
        jobs.resolve_datasets,
        jobs.check_script,
        episodes.prepare_episode,
        episodes.reserve_server_spend,
        audit.write_audit,
        retention.sweep_retention,
        contamination.check_contamination,
        campaigns.plan_campaign,
        campaigns.open_conversation,
        campaigns.send_call,
        campaigns.collect_answer,
        campaigns.finish_attempt,
        campaigns.pick_retries,
        campaigns.reopen_campaign,
    ]
    # Every backend that keeps job folders has them swept (the fake keeps none).
    if settings.retention_policy.deletes_anything and not isinstance(storage, NoStorage):
        schedule_retention_soon(client, queue)
    # The reconciler runs on every backend; the orphan reaper where the backend lists its jobs.
    reconciler = ReconcilerActivities(TemporalStrandedWorkflows(client, queue))
    activities += [reconciler.find_stranded_workflows, reconciler.wind_down_workflow]
    reaper_every = timedelta(seconds=settings.reaper_every_s)
    schedule_reaper_soon(client, queue, reaper_every, orphans=capabilities.reaps_orphans)
    if capabilities.reaps_orphans:
        reaper = ReaperActivities(cast(OrphanSource, backend), TemporalEpisodeLiveness(client))
        activities += [reaper.find_orphan_jobs, reaper.cancel_orphan_job]
    interceptors: list[Interceptor] = [*info.interceptors(), ActivityMetricsInterceptor()]
    return Worker(
        client,
        task_queue=queue,
        workflows=workflows,
        activities=activities,
        interceptors=interceptors,
        workflow_runner=workflow_runner(),
        max_concurrent_workflow_tasks=MAX_WORKFLOW_TASKS,
        max_cached_workflows=settings.max_cached_workflows,
    )


def workflow_only_worker(client: Client, task_queue: str, max_cached_workflows: int) -> Worker:
    """A worker that runs our workflows and no activity, for a process of its own beside one
    built with `build_worker(..., run_workflows=False)`: workflow code then spreads over cores."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        workflow_runner=workflow_runner(),
        max_concurrent_workflow_tasks=MAX_WORKFLOW_TASKS,
        max_cached_workflows=max_cached_workflows,
    )


def workflow_runner() -> SandboxedWorkflowRunner:
    """The SDK's workflow sandbox, with beartype passed through.

    beartype's import hook (`beartype.claw`, installed process-wide by py-key-value, which
    openenv's server side imports through fastmcp) loads every module the sandbox imports, and
    imports parts of beartype while doing so. Inside the sandbox those are fresh imports of the
    whole beartype package for every workflow instance (a new workflow, a continue-as-new, a
    replay after eviction): 0.4-0.6 s each in the all-in-one server, on the event loop its
    gateway shares, which is where issue 18's multi-second stalls came from. Passed through,
    an instance costs 6-24 ms. Workflow code never calls beartype, so nothing it relies on for
    determinism changes."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("beartype")
    )


def project_version() -> str:
    """The installed posttrain-env's version (records name it)."""
    try:
        return importlib.metadata.version("posttrain-env")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def run_worker() -> None:
    """`posttrain-env worker`: a worker of its own, until SIGINT or SIGTERM. A server key that
    is missing, bad or not the deployment's stops it with status 2 (SystemExit) and the reason."""
    settings = Settings()
    try:
        key = resolve_server_key(settings)
    except ServerKeyError as exc:
        refuse(exc)
    backend = make_backend(settings, key.key)
    client = await connect(settings, serve_sdk_metrics=True)
    await require_search_attributes(client, settings.temporal_address)
    try:
        await check_deployment(client, settings.task_queue, key)
    except ServerKeyError as exc:
        refuse(exc)
    worker = build_worker(client, settings, backend, key=key.key)
    deadline = ShutdownDeadline("the worker")
    stop = stop_on_signals(deadline)
    log.info(
        "worker on task queue %r at %s (backend %s, key fingerprint %s)",
        settings.task_queue,
        settings.temporal_address,
        backend.name,
        key.fingerprint,
    )
    port = settings.worker_metrics_port
    try:
        async with serving_worker_metrics(
            settings, client, backend.name, port=port, storage=backend.storage()
        ) as url:
            log_metrics_endpoints(settings, url)
            async with full_collections_every(settings.worker_full_collection_every_s), worker:
                await stop.wait()
    except MetricsEndpointError as exc:
        print(f"posttrain-env worker: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def log_metrics_endpoints(settings: Settings, worker_url: str | None) -> None:
    """Where this worker's metrics are, in the startup log."""
    if worker_url is not None:
        log.info("worker metrics: %s", worker_url)
    else:
        log.info("worker metrics: not served (set POSTTRAIN_WORKER_METRICS_PORT)")
    sdk = sdk_metrics_address(settings)
    if sdk is not None:
        log.info("Temporal SDK metrics: http://%s/metrics", sdk)


def refuse(problem: ServerKeyError) -> NoReturn:
    print(f"posttrain-env worker: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(2)
