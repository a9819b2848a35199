"""Sharded job watching at scale: thousands of concurrently running jobs across episodes.

    uv run python bench/watch_scale.py [--levels 100x10,1000x10|none] [--run-minutes 10]
        [--campaign 1000x10 [--campaign-window 200] [--agent-turns-per-second 6]]
        [--workflow-processes 2] [--server dev] [--full-collection-every-s 600]

Each level is EPISODESxJOBS: that many episodes, each submitting that many jobs (`jobs_submit`
on cpu-basic), all running at once. On the time-skipping test server, with an in-process worker
and the real `HfBackend` talking to the recording fake `HfApi` (tests/hf/fake_hub.py), as
bench/hub_api_load.py does: every job is scheduled for ~45 s and runs ~`--run-minutes`
(staggered per job), workflow time is skipped in steps while the fake Hub's clock follows it,
until every job workflow has ended. The watcher is sharded as the settings say
(`POSTTRAIN_WATCH_SHARDS`, default 16; `--shards`). `--workflow-processes N`: workflow code runs
in N worker processes of its own (`workflow_only_worker`) and this process runs the activities
only, as a deployment with several workers spreads them (one process runs workflow code on one
core at a time: the GIL).

Reported per level, and how each grows from the first level to the last:
- the largest payload any workflow sent or received (inputs, results, signals, continue-as-new
  carries; every watcher shard and a sample of episodes and jobs): target <= 512 KiB;
- history events per job workflow (the sample; jobs that ran to their end: a job its episode
  asked to cancel as it ended, even one that had just ended, is reported apart), without the
  three events of each workflow task that timed out or failed and was retried (a worker starved
  of CPU; their count is the `retried` column, and the summary gives the largest history as
  recorded too): target <= 30;
- workflow-task latency, scheduled to completed, p50/p99 over every workflow task of the
  sampled workflows and all shards: target p99 <= 1 s;
- Hub status calls per job per 30 s of its life on the Hub (created to ended: the watcher
  follows a job while it is scheduled too): target <= 1;
- jobs per shard (largest), shard runs (continued as new), submit time.

`--campaign ROLLOUTSxJOBS` (e.g. 1000x10) adds a campaign level after the others: one campaign
of that many rollouts, all in flight at once (`--campaign-window N`: N at a time), whose
scripted agent submits JOBS jobs, waits for the last to end and stops (its jobs all run alike;
one whose end is not reported yet when the agent stops is cancelled, and counted apart). Its
agent turns run in this process (`InProcessTurns`: the scripted agent's code, without the
process each turn gets in production), so what is measured is the workflows.
`--agent-turns-per-second N` paces their queue as `posttrain-env agent-worker --turns-per-second
N` does; the report then gives the turns' wait to start. The same figures,
over a sample of the rollouts' jobs and episodes, every rollout and campaign run and every shard.

`--server dev` runs the levels on Temporal's dev server instead (`temporal server start-dev`,
file-backed SQLite in WAL mode, as the embedded server runs), in real time: the fake Hub follows
the real clock, jobs run `--run-minutes` of real time from their submission, and nothing is
skipped. The test server holds every workflow in memory and slows as they accumulate (a
1000x10 campaign did not finish on it); the dev server is what a one-machine deployment runs.
There the report also gives the server's work per job, from the dev server's own request counts
(its Prometheus metrics, read once every workflow has ended): workflow tasks, activity tasks,
signals, queries, activity heartbeats and persistence writes (the bench's own reads left out).

To tell where the slow workflow tasks' time goes, the report ends with: the slow tasks' time
scheduled to started (waiting for a worker) against started to completed, and which worker took
them; each process's full garbage collections of 50 ms or more (`main`: the activities and the
bench; `wf-N`: the workflow-only processes); each process's CPU (and the dev server's) by
minute; and, for each minute with 10 or more slow tasks, that minute's CPU and collections.
The bench's worker processes collect their oldest generation as a worker does
(`POSTTRAIN_WORKER_FULL_COLLECTION_EVERY_S`); `--full-collection-every-s 0` gives them Python's
own schedule, as before that setting.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Bytecode cached as a deployment caches it. The sandbox imports a workflow's module afresh for
# every workflow instance; without `__pycache__` (PYTHONDONTWRITEBYTECODE=1, as on this
# machine) each of those imports compiles the source again, a third of a workflow process's
# time at thousands of new workflows. The workflow processes inherit the environment.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from activities.campaigns.agent_turns import AgentTurnActivities  # noqa: E402
from activities.campaigns.store import CampaignStore  # noqa: E402
from bench._pauses import (  # noqa: E402
    CpuByMinute,
    Pauses,
    log_full_collections,
    pid_running,
    read_pauses,
)
from bench._server_work import given_metrics_port, read_server_work  # noqa: E402
from bench._topology import free_port  # noqa: E402
from bench.hub_api_load import (  # noqa: E402
    MODEL,
    SCHEDULING_S,
    SKIP_STEP,
    STATUS_CALLS,
    TASK_ID,
    _binary,
    _by_key,
    job_closed,
    staggered_hub,
)
from posttrain_common.campaigns.spec import parse_spec  # noqa: E402
from posttrain_common.contracts.episode_calls import ToolCall  # noqa: E402
from posttrain_common.keys import ServerKey  # noqa: E402
from posttrain_common.settings import Settings  # noqa: E402
from posttrain_env.agents.runner import TurnReply, TurnRequest, take_turn  # noqa: E402
from posttrain_server.full_collections import full_collections_every  # noqa: E402
from posttrain_server.shutdown import exit_now  # noqa: E402
from posttrain_server.temporal.dev_server import dynamic_config_flags, sqlite_flags  # noqa: E402
from posttrain_server.temporal.setup import add_search_attributes  # noqa: E402
from posttrain_server.worker import build_worker, workflow_only_worker  # noqa: E402
from tests.leaked_locks import LeakedLocks  # noqa: E402
from workflows.campaign.contract import CampaignInput  # noqa: E402
from workflows.campaign.workflow import CampaignWorkflow  # noqa: E402
from workflows.episode.session import ResetRequest, SessionState, SessionWorkflow  # noqa: E402
from workflows.episode.workflow import EpisodeWorkflow  # noqa: E402
from workflows.ids import (  # noqa: E402
    campaign_workflow_id,
    episode_workflow_id,
    rollout_episode_id,
    rollout_workflow_id,
    watcher_shard_ids,
    watcher_workflow_id,
)
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES  # noqa: E402

PAYLOAD_TARGET = 512 * 1024
EVENTS_TARGET = 30
TASK_P99_TARGET_S = 1.0
SAMPLE_EPISODES = 50
SAMPLE_JOBS = 300
RUN_LIMIT_S = 3 * 3600

TASK = """
id = "{task}"
prompt = "Benchmark task."
flavors = ["cpu-basic"]
max_timeout_minutes = 600
budget_usd = 100.0
max_steps = 1000
time_limit_s = 172800
score_timeout_s = 600
max_concurrent_jobs = {jobs}
max_dev_evaluations = 2
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "{model}"
revision = "main"
"""


@dataclass
class Level:
    episodes: int
    jobs_per_episode: int
    campaign: bool = False
    # A campaign's concurrency (rollouts in flight at once); None: every rollout at once.
    window: int | None = None
    # The agent task queue's dispatch rate (`posttrain-env agent-worker --turns-per-second`);
    # None: turns start as soon as a slot is free.
    turns_per_second: float | None = None
    submit_s: float = 0.0
    wall_s: float = 0.0
    # Seconds the jobs spent on the Hub, created to ended (scheduled, then running).
    on_hub_s: float = 0.0
    # The most jobs on the Hub at once (created, not ended): in real time (`--server dev`) the
    # first jobs may end before the last are submitted.
    peak_on_hub: int = 0
    status_calls: int = 0
    job_events: list[int] = field(default_factory=list)
    # Jobs their episode cancelled as it ended (their end not yet reported to it): a cancel's
    # activities and confirmation are history a job that ran to its end does not have.
    cancelled_job_events: list[int] = field(default_factory=list)
    # Workflow-task latencies by kind of workflow (job, episode, rollout, campaign, shard):
    # which kind's tasks make the p99.
    latency_by_kind: dict[str, list[float]] = field(default_factory=dict)
    # A campaign's agent turns: seconds from scheduled to started (where a paced agent queue,
    # `turns_per_second`, holds the work the server is not offered yet).
    turn_waits: list[float] = field(default_factory=list)
    # When the level started (epoch seconds), and when each workflow task over the latency
    # target was scheduled: which phase of the level (submitting, running, ending) the slow
    # tasks come from.
    started_at: float = 0.0
    slow_tasks_at: list[float] = field(default_factory=list)
    # Each slow task's seconds from scheduled to started (waiting for a worker to take it) and
    # from started to completed (the worker's run and its reply), and the worker that took it.
    slow_tasks_split: list[tuple[float, float, str]] = field(default_factory=list)
    # Each process's full garbage collections (main: the activities and the bench; wf-N: the
    # workflow-only processes), and each process's (and the dev server's) CPU by minute.
    pauses: dict[str, Pauses] = field(default_factory=dict)
    cpu_minutes: list[dict[str, float]] = field(default_factory=list)
    # Workflow tasks of the sampled jobs that timed out or failed and were retried (a loaded
    # machine: each adds its timeout or failure and the retry's scheduled and started events,
    # which `job_events` leaves out and `job_events_recorded` keeps).
    retried_tasks: int = 0
    job_events_recorded: list[int] = field(default_factory=list)
    largest_payload: int = 0
    largest_payload_of: str = ""
    shard_runs: int = 0
    largest_shard: int = 0
    # Time-skipping locks the test server leaked and the bench released (tests/leaked_locks:
    # an episode closing after its rollout, a job after its episode).
    leaked_locks: int = 0
    # The dev server's own request counts for the level (bench/_server_work.py); empty on the
    # test server.
    server_work: dict[str, float] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return self.episodes * self.jobs_per_episode

    @property
    def label(self) -> str:
        label = f"{'c' if self.campaign else ''}{self.episodes}x{self.jobs_per_episode}"
        if self.window is not None:
            label = f"{label}w{self.window}"
        if self.turns_per_second is not None:
            label = f"{label}r{self.turns_per_second:g}"
        return label

    @property
    def status_per_job_per_30s(self) -> float:
        return self.status_calls / max(1.0, self.on_hub_s / 30)

    def quantile(self, q: float, kind: str | None = None) -> float:
        if kind is None:
            latencies = [s for by_kind in self.latency_by_kind.values() for s in by_kind]
        else:
            latencies = self.latency_by_kind.get(kind, [])
        return quantile(latencies, q)


def slow_by_minute(level: Level) -> dict[int, int]:
    """How many of the slow tasks each minute of the level holds."""
    minutes: dict[int, int] = {}
    for at in level.slow_tasks_at:
        minute = int((at - level.started_at) // 60)
        minutes[minute] = minutes.get(minute, 0) + 1
    return minutes


def slow_minutes(level: Level) -> str:
    """`m3 12, m4 40`: how many of the slow tasks each minute of the level holds."""
    minutes = sorted(slow_by_minute(level).items())
    return ", ".join(f"m{minute} {count}" for minute, count in minutes)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def event_payload_bytes(event: HistoryEvent) -> int:
    """The largest payload set an event carries (input, result, signal, carry)."""
    largest = 0
    for attributes in (
        event.workflow_execution_started_event_attributes.input,
        event.workflow_execution_signaled_event_attributes.input,
        event.workflow_execution_completed_event_attributes.result,
        event.workflow_execution_continued_as_new_event_attributes.input,
        event.activity_task_scheduled_event_attributes.input,
        event.activity_task_completed_event_attributes.result,
        event.signal_external_workflow_execution_initiated_event_attributes.input,
        event.start_child_workflow_execution_initiated_event_attributes.input,
        event.workflow_execution_update_accepted_event_attributes.accepted_request.input.args,
        event.workflow_execution_update_completed_event_attributes.outcome.success,
    ):
        largest = max(largest, sum(len(p.data) for p in attributes.payloads))
    return largest


async def histories_of(client: Client, workflow_id: str) -> list[list[HistoryEvent]]:
    """Every run of a workflow, latest first, following continue-as-new back (the test server
    cannot list workflows)."""
    runs: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        try:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        except RPCError:
            return runs  # not found: no job hashed to this shard
        runs.append(list(history.events))
        started = history.events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id or None
        if run_id is None:
            return runs


# A workflow task that timed out (its worker starved of CPU) or failed, and was scheduled and
# started again: three events the workflow's own design does not make.
RETRIED = (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
RETRY_EVENTS = 3


def cancelled(runs: list[list[HistoryEvent]]) -> bool:
    """Whether a job workflow was asked to cancel its job: by its episode's `cancel` signal
    (also when the job had already ended and its report was on its way: the signal and its
    workflow task are four events more), or by scheduling `cancel_job` itself."""
    return any(
        (
            event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and event.workflow_execution_signaled_event_attributes.signal_name == "cancel"
        )
        or (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and event.activity_task_scheduled_event_attributes.activity_type.name == "cancel_job"
        )
        for events in runs
        for event in events
    )


async def read_histories(
    client: Client, workflow_ids: list[str], level: Level, kind: str, jobs: bool = False
) -> list[int]:
    """Fold every run of each workflow into the level's figures; events per workflow, without
    those of workflow tasks retried (for `jobs`, per job that ran to its end: the cancelled ones
    go to `cancelled_job_events`)."""
    lengths: list[int] = []
    for workflow_id in workflow_ids:
        runs = await histories_of(client, workflow_id)
        recorded = sum(len(events) for events in runs)
        retried = sum(1 for events in runs for event in events if event.event_type in RETRIED)
        length = recorded - RETRY_EVENTS * retried
        if jobs and cancelled(runs):
            level.cancelled_job_events.append(length)
        else:
            lengths.append(length)
            if jobs:
                level.retried_tasks += retried
                level.job_events_recorded.append(recorded)
        for events in runs:
            scheduled: dict[int, float] = {}
            started_at: dict[int, tuple[float, str]] = {}
            turns: dict[int, float] = {}
            for event in events:
                size = event_payload_bytes(event)
                if size > level.largest_payload:
                    level.largest_payload, level.largest_payload_of = size, workflow_id
                at = event.event_time.ToMicroseconds() / 1e6
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                    scheduled[event.event_id] = at
                elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    attrs_started = event.workflow_task_started_event_attributes
                    started_at[attrs_started.scheduled_event_id] = (at, attrs_started.identity)
                elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                    attrs = event.workflow_task_completed_event_attributes
                    if attrs.scheduled_event_id in scheduled:
                        latency = at - scheduled[attrs.scheduled_event_id]
                        level.latency_by_kind.setdefault(kind, []).append(latency)
                        if latency > TASK_P99_TARGET_S:
                            level.slow_tasks_at.append(scheduled[attrs.scheduled_event_id])
                            began, identity = started_at.get(
                                attrs.scheduled_event_id, (scheduled[attrs.scheduled_event_id], "")
                            )
                            level.slow_tasks_split.append(
                                (began - scheduled[attrs.scheduled_event_id], at - began, identity)
                            )
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    activity_type = event.activity_task_scheduled_event_attributes.activity_type
                    if activity_type.name == "agent_turn":
                        turns[event.event_id] = at
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    turn = event.activity_task_started_event_attributes.scheduled_event_id
                    if turn in turns:
                        level.turn_waits.append(at - turns[turn])
    return lengths


async def start_episode(
    client: Client, queue: str, jobs: int, timeout_minutes: int
) -> tuple[str, list[str]]:
    session = await client.start_workflow(
        SessionWorkflow.run, SessionState(), id=f"session-{uuid.uuid4().hex}", task_queue=queue
    )
    reset = await session.execute_update(SessionWorkflow.reset, ResetRequest(task_id=TASK_ID))
    episode = client.get_workflow_handle_for(EpisodeWorkflow.run, reset.workflow_id)
    for n in range(1, jobs + 1):
        submitted = await episode.execute_update(
            EpisodeWorkflow.call_tool,
            ToolCall(
                request_id=f"submit-{n}",
                tool="jobs_submit",
                arguments={
                    "script": f"print('bench {n}')\n",
                    "flavor": "cpu-basic",
                    "timeout_minutes": timeout_minutes,
                },
            ),
            id=f"{reset.episode_id}:submit-{n}",
        )
        if "error" in submitted.data:
            raise RuntimeError(f"jobs_submit failed: {submitted.data}")
    return reset.workflow_id, [f"{reset.workflow_id}/job/{n}" for n in range(1, jobs + 1)]


def start_workflow_processes(
    n: int, address: str, queue: str, cache: int, workdir: Path, full_collection_every_s: float
) -> list[subprocess.Popen[bytes]]:
    """N workflow-only processes; process `k` logs its full collections to `gc-wf-k.log`."""
    command = [sys.executable, __file__, "--serve-workflows", address, queue, str(cache)]
    command.append(str(full_collection_every_s))
    return [subprocess.Popen([*command, str(workdir / f"gc-wf-{k}.log")]) for k in range(1, n + 1)]


async def serve_workflows(
    address: str, queue: str, cache: int, full_collection_every_s: float, gc_log: Path
) -> None:
    """A workflow-only worker process (`--workflow-processes`): until it is terminated. Its
    full garbage collections come on the schedule a worker's do."""
    log_full_collections(gc_log)
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    every_s = full_collection_every_s
    async with full_collections_every(every_s), workflow_only_worker(client, queue, cache):
        await asyncio.Event().wait()


class InProcessTurns(AgentTurnActivities):
    """The agent worker's turns, the agent's code run in this process (`take_turn`, what the
    turn's process runs) instead of a process per turn: thousands of rollouts' turns on two
    cores would measure process start-up, not the workflows."""

    async def _run(self, request: TurnRequest, timeout_s: float) -> TurnReply:
        reply = await take_turn(request)
        if reply.error is not None:
            raise RuntimeError(f"the scripted agent failed: {reply.error}")
        return reply


def scripted_calls(jobs: int, timeout_minutes: int) -> list[dict[str, object]]:
    """Submit `jobs` jobs, wait for the last to end, stop."""
    submits: list[dict[str, object]] = [
        {
            "tool": "jobs_submit",
            "arguments": {
                "script": f"print('bench {n}')\n",
                "flavor": "cpu-basic",
                "timeout_minutes": timeout_minutes,
            },
        }
        for n in range(1, jobs + 1)
    ]
    return [*submits, {"wait": True}, {"stop": True}]


RUNNING_STEPS = 5  # skip steps taken at once while every job is still running
LONG_STEP_S = RUNNING_STEPS * SKIP_STEP.total_seconds()
STALLED_STEPS = 10  # steps past the time limit without a workflow closing: the level failed
CLOSED_BATCH = 50  # describes at once: 10,000 at once upset the server
# How often leaked locks are looked for while a step is in flight: each look lists every
# closed workflow (the test server returns them all at once), 11,000 at the largest level.
LEAK_PERIOD_S = 5.0
# A step's deadline: the server skips time once the tasks in flight are done, which at 10,000
# jobs on two cores takes minutes.
STEP_DEADLINE = timedelta(minutes=15)


# Not seen closed this step, looked at again the next: not started yet, or a describe the
# loaded server dropped (a level beside a CI run once failed on one at 586 s).
UNSEEN = frozenset(
    {
        RPCStatusCode.NOT_FOUND,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)


async def is_closed(client: Client, workflow_id: str) -> bool:
    """Whether the workflow has closed (not when it is open, or not started yet: with a
    campaign window, the jobs of the rollouts still waiting for their turn). Read raw: the
    SDK's `describe()` cannot decode every search attribute the time-skipping server
    returns."""
    try:
        described = await client.workflow_service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(
                namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id)
            )
        )
    except RPCError as err:
        if err.status in UNSEEN:
            return False
        raise
    return described.workflow_execution_info.HasField("close_time")


async def still_open(client: Client, open_ids: set[str], rng: random.Random) -> set[str]:
    """The workflows of `open_ids` not yet closed, looked up in random batches until a batch
    finds none closed: a step where few have ended costs a batch, not a describe per job
    (10,000 per step at the largest level, most of the server's time). One still open keeps
    the caller stepping, so every workflow is seen closed before the level ends."""
    remaining = set(open_ids)

    async def look(batch: list[str]) -> bool:
        """Whether any of `batch` has closed."""
        closed = await asyncio.gather(*(is_closed(client, w) for w in batch))
        remaining.difference_update(w for w, c in zip(batch, closed, strict=True) if c)
        return any(closed)

    order = sorted(remaining)
    rng.shuffle(order)
    for start in range(0, len(order), CLOSED_BATCH):
        if not await look(order[start : start + CLOSED_BATCH]):
            break
    return remaining


async def run_level(
    episodes: int,
    jobs: int,
    run_minutes: float,
    shards: int,
    workdir: Path,
    workflow_processes: int = 0,
    campaign: bool = False,
    server_args: list[str] | None = None,
    window: int | None = None,
    server: str = "test",
    turns_per_second: float | None = None,
    full_collection_every_s: float | None = None,
) -> Level:
    window = window if campaign and window is not None and window < episodes else None
    turns_per_second = turns_per_second if campaign else None
    level = Level(episodes, jobs, campaign, window, turns_per_second)
    in_flight = window or episodes  # rollouts (or episodes) whose jobs run at once
    tasks_dir = workdir / "tasks"
    (tasks_dir / TASK_ID).mkdir(parents=True)
    (tasks_dir / TASK_ID / "task.toml").write_text(
        TASK.format(task=TASK_ID, jobs=jobs, model=MODEL)
    )
    run_s = run_minutes * 60
    timeout_minutes = int(run_minutes) + 30
    # A campaign's jobs run alike: its agent waits for its last job, and its episode's end
    # would cancel any still running (a cancelled job's history is not the running one's).
    real_time = server == "dev"
    hub, backend = staggered_hub(
        run_s,
        stagger_s=0 if campaign else 20,
        clock=(lambda: datetime.now(UTC)) if real_time else None,
    )
    server_args = server_args or []
    metrics_port = None
    if real_time:
        metrics_port = given_metrics_port(server_args)
        if metrics_port is None:
            metrics_port = free_port()
            server_args = ["--metrics-port", str(metrics_port), *server_args]
    env = await start_server(server, workdir, server_args)
    started = time.monotonic()
    level.started_at = time.time()
    helpers: list[subprocess.Popen[bytes]] = []
    stop_main_log = log_full_collections(workdir / "gc-main.log")
    sampling: asyncio.Task[None] | None = None
    try:
        client, queue = env.client, f"watch-scale-{uuid.uuid4().hex[:8]}"
        # Every open workflow stays cached (the SDK's default of 1,000 would replay evicted ones).
        settings = Settings(
            state_dir=workdir / "state",
            backend="fake",
            watch_shards=shards,
            max_cached_workflows=2 * episodes * (jobs + 3) + 100,
            campaigns_dir=workdir / "campaigns",
        )
        if full_collection_every_s is not None:
            settings = settings.model_copy(
                update={"worker_full_collection_every_s": full_collection_every_s}
            )
        if workflow_processes:
            address = client.service_client.config.target_host
            helpers = start_workflow_processes(
                workflow_processes,
                address,
                queue,
                settings.max_cached_workflows,
                workdir,
                settings.worker_full_collection_every_s,
            )
        worker = build_worker(
            client, settings, backend, task_queue=queue, tasks_dir=tasks_dir,
            key=ServerKey.load_or_create(settings.server_key_path),
            run_workflows=not workflow_processes,
        )  # fmt: skip
        agent_queue = f"{queue}-agents"
        turns = InProcessTurns(CampaignStore(settings.campaign_root), {})
        agents = Worker(
            client,
            task_queue=agent_queue,
            activities=[turns.agent_turn, turns.check_agents],
            max_concurrent_activities=32,
            max_task_queue_activities_per_second=turns_per_second,
        )
        pids = {"main": os.getpid()} | {f"wf-{k}": h.pid for k, h in enumerate(helpers, 1)}
        server_pid = pid_running(str(workdir / "temporal.db")) if real_time else None
        if server_pid is not None:
            pids["server"] = server_pid
        sampling = asyncio.create_task(sample_cpu(CpuByMinute(pids), level, started))
        every_s = settings.worker_full_collection_every_s
        async with full_collections_every(every_s), worker, agents:
            if campaign:
                campaign_id = f"watch-scale-{uuid.uuid4().hex[:8]}"
                spec = parse_spec(
                    {
                        "name": "watch-scale",
                        "tasks": [TASK_ID],
                        "agents": [
                            {
                                "name": "s",
                                "agent": "scripted",
                                "args": {"calls": scripted_calls(jobs, timeout_minutes)},
                            }
                        ],
                        "epochs": episodes,
                        "concurrency": in_flight,
                        "budget_usd": episodes * 100.0,
                    }
                )
                rollout_ids = [f"{campaign_id}/{TASK_ID}/s/{n}" for n in range(1, episodes + 1)]
                episode_ids = [episode_workflow_id(rollout_episode_id(r, 1)) for r in rollout_ids]
                job_ids = [f"{e}/job/{n}" for e in episode_ids for n in range(1, jobs + 1)]
                # Every job of the rollouts in flight submitted under a paused clock, as the
                # sessions' level does; with a window, the next rollouts start as time is
                # skipped and those before them end.
                first_jobs = in_flight * jobs
                with env.auto_time_skipping_disabled():
                    handle = await client.start_workflow(
                        CampaignWorkflow.run,
                        CampaignInput(
                            campaign_id=campaign_id, spec=spec, agent_task_queue=agent_queue
                        ),
                        id=campaign_workflow_id(campaign_id),
                        task_queue=queue,
                    )
                    while len(hub.jobs) < first_jobs:
                        progress(started, level.label, f"{len(hub.jobs)} jobs submitted")
                        if await job_closed(client, handle.id):
                            raise RuntimeError(
                                "the campaign ended before its jobs all started: "
                                f"{await handle.result()}"
                            )
                        await asyncio.sleep(10)
                extra_ids = [handle.id] + [rollout_workflow_id(r, 1) for r in rollout_ids]
            else:
                gate = asyncio.Semaphore(20)

                async def one() -> tuple[str, list[str]]:
                    async with gate:
                        result = await start_episode(client, queue, jobs, timeout_minutes)
                    done.append(result[0])
                    if len(done) % max(1, episodes // 10) == 0:
                        progress(started, level.label, f"{len(done)} episodes submitted")
                    return result

                done: list[str] = []

                # Submitting under a paused clock: every job is running before time moves on.
                with env.auto_time_skipping_disabled():
                    submitted = await asyncio.gather(*(one() for _ in range(episodes)))
                episode_ids = [e for e, _ in submitted]
                job_ids = [j for _, js in submitted for j in js]
                extra_ids = []
            level.submit_s = time.monotonic() - started
            progress(started, level.label, f"{len(hub.jobs)} jobs submitted")
            stem = watcher_workflow_id(client.namespace, queue)
            shard_ids = watcher_shard_ids(stem, settings.watch_shards)
            for shard in shard_ids:
                try:
                    watched = await client.get_workflow_handle(shard).query("watched")
                except RPCError:
                    continue
                level.largest_shard = max(level.largest_shard, len(watched))
            # Until every job workflow (and the campaign, its rollouts, their episodes) ended.
            open_ids = set(job_ids) | set(extra_ids) | (set(episode_ids) if campaign else set())
            # Every job has ended on the Hub by `limit`; past it, the level fails only once no
            # workflow has closed for STALLED_STEPS steps (on a slow server, thousands of ends
            # take many steps to be delivered, but they keep coming).
            waves = -(-episodes // in_flight)
            limit = waves * (run_s + SCHEDULING_S + 20 * 4) + 600
            skipped, stalled = 0.0, 0
            looking = random.Random(11)
            # Released as they leak: each would make the rest of the level pass in real time.
            locks = LeakedLocks(client, period_s=LEAK_PERIOD_S)
            while open_ids and (skipped < limit or stalled < STALLED_STEPS):
                # While no job can end yet, in long steps: every step costs the test server
                # time of its own at thousands of open workflows (looks happen as often).
                # In real time, short steps: jobs ran while others were submitted, so any may
                # have ended.
                long_steps = not real_time and skipped + LONG_STEP_S < run_s
                step = SKIP_STEP * (RUNNING_STEPS if long_steps else 1)
                if real_time:
                    await asyncio.sleep(step.total_seconds())
                else:
                    await locks.skip(step, STEP_DEADLINE)
                    hub.advance(step.total_seconds())
                skipped += step.total_seconds()
                before = len(open_ids)
                if real_time or skipped > run_s:
                    open_ids = await still_open(client, open_ids, looking)
                stalled = stalled + 1 if len(open_ids) == before else 0
                leaks = "" if real_time else f", {locks.released} leaked locks released"
                progress(
                    started,
                    level.label,
                    f"{skipped:.0f} s {'waited' if real_time else 'skipped'}, "
                    f"{len(open_ids)} open{leaks}",
                )
            if open_ids:
                raise RuntimeError(f"{len(open_ids)} workflows did not end")
            level.wall_s = time.monotonic() - started
            level.leaked_locks = locks.released
            if metrics_port is not None:
                level.server_work = await read_server_work(metrics_port)
            progress(started, level.label, "every workflow ended; reading histories")
            rng = random.Random(7)
            sample_jobs = rng.sample(job_ids, min(SAMPLE_JOBS, len(job_ids)))
            sample_episodes = rng.sample(episode_ids, min(SAMPLE_EPISODES, len(episode_ids)))
            level.job_events = await read_histories(client, sample_jobs, level, "job", jobs=True)
            await read_histories(client, sample_episodes, level, "episode")
            if extra_ids:
                await read_histories(client, extra_ids[:1], level, "campaign")
                await read_histories(client, extra_ids[1 : SAMPLE_EPISODES + 1], level, "rollout")
            for shard in shard_ids:
                level.shard_runs += len(await histories_of(client, shard))
            await read_histories(client, shard_ids, level, "shard")
    finally:
        if sampling is not None:
            sampling.cancel()
        stop_main_log()
        for helper in helpers:
            helper.terminate()
            helper.wait()
        await env.shutdown()
        level.pauses = await asyncio.to_thread(read_pauses, workdir)
    status = [c for c in hub.calls if c.method in STATUS_CALLS and not _by_key(c.args)]
    level.status_calls = len(status)
    lives: list[tuple[float, float]] = []
    for job_id in hub.jobs:
        durations = hub.info(job_id).durations
        on_hub_s = float(durations.total_secs or 0) if durations else 0.0
        level.on_hub_s += on_hub_s
        created = hub.jobs[job_id].created_at.timestamp()
        lives.append((created, created + on_hub_s))
    level.peak_on_hub = most_at_once(lives)
    return level


async def start_server(server: str, workdir: Path, server_args: list[str]) -> WorkflowEnvironment:
    """The time-skipping test server ("test"), or the dev server file-backed in WAL mode as the
    embedded server runs ("dev"), with the operator's search attributes."""
    if server == "dev":
        return await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=_binary("temporal"),
            dev_server_database_filename=str(workdir / "temporal.db"),
            dev_server_log_level="error",
            dev_server_extra_args=[*sqlite_flags(), *dynamic_config_flags(), *server_args],
            search_attributes=SEARCH_ATTRIBUTES,
        )
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=_binary("temporal-test-server"),
        test_server_extra_args=server_args,
    )
    try:
        await add_search_attributes(env.client)
    except BaseException:
        await env.shutdown()
        raise
    return env


async def sample_cpu(cpu: CpuByMinute, level: Level, started: float) -> None:
    """Each process's CPU, every minute of the level, into `level` and the progress lines."""
    cpu.sample()
    while True:
        await asyncio.sleep(60)
        shares = cpu.sample()
        level.cpu_minutes.append(shares)
        progress(
            started,
            level.label,
            "CPU % of a core: " + ", ".join(f"{n} {s:.0f}" for n, s in shares.items()),
        )


def most_at_once(lives: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one moment (one ending as another starts: not
    both)."""
    edges = sorted([(start, 1) for start, _ in lives] + [(end, -1) for _, end in lives])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def progress(started: float, label: str, message: str) -> None:
    """A phase's progress on stderr: a long level shows where its time goes."""
    print(f"[{time.monotonic() - started:7.0f} s] {label}: {message}", file=sys.stderr, flush=True)


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


SERVERS = {
    "test": "the time-skipping test server",
    "dev": "the dev server (file-backed SQLite, WAL), in real time",
}


def report(levels: list[Level], shards: int, server: str = "test") -> list[str]:
    lines = [f"watcher shards: {shards}; Temporal: {SERVERS[server]}"]
    header = (
        f"{'level':>10} {'jobs':>6} {'payload KiB':>11} {'events/job':>10} "
        f"{'task p50 ms':>11} {'task p99 ms':>11} {'status/job/30s':>14} "
        f"{'largest shard':>13} {'shard runs':>10} {'submit s':>8} {'wall s':>7} "
        f"{'retried':>7}"
    )
    lines.append(header)
    for lv in levels:
        lines.append(
            f"{lv.label:>10} {lv.jobs:>6} "
            f"{lv.largest_payload / 1024:>11.1f} {max(lv.job_events, default=0):>10} "
            f"{lv.quantile(0.5) * 1000:>11.1f} {lv.quantile(0.99) * 1000:>11.1f} "
            f"{lv.status_per_job_per_30s:>14.4f} {lv.largest_shard:>13} {lv.shard_runs:>10} "
            f"{lv.submit_s:>8.0f} {lv.wall_s:>7.0f} {lv.retried_tasks:>7}"
        )
    last = levels[-1]
    payload_ok = last.largest_payload <= PAYLOAD_TARGET
    lines += [
        f"largest payload: {last.largest_payload / 1024:.1f} KiB ({last.largest_payload_of}) "
        f"(target <= {PAYLOAD_TARGET // 1024} KiB)  {verdict(payload_ok)}",
        f"history events per job: mean {statistics.mean(last.job_events or [0]):.1f}, max "
        f"{max(last.job_events, default=0)} (as recorded: max "
        f"{max(last.job_events_recorded, default=0)}, with {last.retried_tasks} workflow tasks "
        f"retried under load, 3 events each) (target <= {EVENTS_TARGET})  "
        f"{verdict(max(last.job_events, default=0) <= EVENTS_TARGET)}",
        f"workflow-task latency p99: {last.quantile(0.99) * 1000:.0f} ms "
        f"(target <= {TASK_P99_TARGET_S * 1000:.0f} ms)  "
        f"{verdict(last.quantile(0.99) <= TASK_P99_TARGET_S)}",
        "workflow-task latency p99 by workflow: "
        + ", ".join(
            f"{kind} {last.quantile(0.99, kind) * 1000:.0f} ms "
            f"({len(last.latency_by_kind[kind])} tasks)"
            for kind in ("job", "episode", "rollout", "campaign", "shard")
            if kind in last.latency_by_kind
        ),
        f"Hub status calls per job per 30 s: {last.status_per_job_per_30s:.4f} (target <= 1)  "
        f"{verdict(last.status_per_job_per_30s <= 1)}",
    ]
    lines += [
        f"agent turns' wait to start ({lv.label}, scheduled to started, "
        f"{len(lv.turn_waits)} turns): p50 {quantile(lv.turn_waits, 0.5) * 1000:.0f} ms, "
        f"p99 {quantile(lv.turn_waits, 0.99) * 1000:.0f} ms"
        + ("" if lv.turns_per_second is None else f" (paced at {lv.turns_per_second:g}/s)")
        for lv in levels
        if lv.turn_waits
    ]
    lines += [
        f"workflow tasks over {TASK_P99_TARGET_S * 1000:.0f} ms ({lv.label}, "
        f"{len(lv.slow_tasks_at)}), by minute of the level they were scheduled in "
        f"(submitted by {lv.submit_s / 60:.1f}): " + slow_minutes(lv)
        for lv in levels
        if lv.slow_tasks_at
    ]
    lines.append(
        "jobs on the Hub at once (most): "
        + ", ".join(f"{lv.label} {lv.peak_on_hub} of {lv.jobs}" for lv in levels)
    )
    if any(lv.leaked_locks for lv in levels):
        lines.append(
            "time-skipping locks the test server leaked (a child closing after its parent), "
            "released by the bench: " + ", ".join(f"{lv.label} {lv.leaked_locks}" for lv in levels)
        )
    lines += [
        f"server work per job ({lv.label}, the dev server's request counts): "
        + ", ".join(f"{name} {count / lv.jobs:.2f}" for name, count in lv.server_work.items())
        for lv in levels
        if lv.server_work
    ]
    lines += diagnosis(last)
    if last.cancelled_job_events:
        lines.append(
            f"jobs cancelled by their episode's end: {len(last.cancelled_job_events)} of the "
            f"sample, max {max(last.cancelled_job_events)} events"
        )
    if len(levels) > 1:
        first = levels[0]
        scale = last.jobs / first.jobs
        payload = last.largest_payload / max(first.largest_payload, 1)
        events = max(last.job_events, default=0) / max(max(first.job_events, default=1), 1)
        p99 = last.quantile(0.99) / max(first.quantile(0.99), 1e-6)
        calls = last.status_per_job_per_30s / max(first.status_per_job_per_30s, 1e-9)
        lines.append(
            f"growth x{scale:g} in jobs: payload x{payload:.2f}, events/job x{events:.2f}, "
            f"task p99 x{p99:.2f}, status/job/30s x{calls:.2f}"
        )
    return lines


def diagnosis(level: Level) -> list[str]:
    """Where the slow tasks' time went: waiting for a worker or in its run, which worker, and
    what each process (and the dev server) did in the minutes they came in."""
    lines: list[str] = []
    split = level.slow_tasks_split
    if split:
        waits = [wait for wait, _, _ in split]
        runs = [run for _, run, _ in split]
        by_worker: dict[str, int] = {}
        for _, _, identity in split:
            by_worker[identity] = by_worker.get(identity, 0) + 1
        lines.append(
            f"workflow tasks over {TASK_P99_TARGET_S * 1000:.0f} ms ({level.label}): scheduled "
            f"to started p50 {quantile(waits, 0.5) * 1000:.0f} ms (mean "
            f"{statistics.mean(waits) * 1000:.0f}), started to completed p50 "
            f"{quantile(runs, 0.5) * 1000:.0f} ms (mean {statistics.mean(runs) * 1000:.0f}); "
            "by worker: " + ", ".join(f"{who or '?'} {n}" for who, n in sorted(by_worker.items()))
        )
    lines += [
        f"full garbage collections ({level.label}, {name}): {pauses.summary()}"
        for name, pauses in level.pauses.items()
    ]
    if level.cpu_minutes:
        mean = {
            name: statistics.mean(m.get(name, 0.0) for m in level.cpu_minutes)
            for name in level.cpu_minutes[0]
        }
        lines.append(
            f"CPU % of a core, mean over the level ({level.label}): "
            + ", ".join(f"{name} {share:.0f}" for name, share in mean.items())
        )
    collected = {name: p.by_minute(level.started_at) for name, p in level.pauses.items()}
    for minute, count in sorted(slow_by_minute(level).items()):
        if count < 10:
            continue
        # `cpu_minutes[k]` covers minute k of the level (sampled at its end).
        shares = level.cpu_minutes[minute] if minute < len(level.cpu_minutes) else {}
        lines.append(
            f"  m{minute}: {count} slow tasks; CPU % "
            + ", ".join(f"{name} {share:.0f}" for name, share in shares.items())
            + "; full collections "
            + ", ".join(f"{name} {by.get(minute, 0.0):.1f} s" for name, by in collected.items())
        )
    return lines


def parse_levels(text: str) -> list[tuple[int, int]]:
    """`100x10,1000x10`; `none`: no level (a campaign level alone)."""
    if text.strip() == "none":
        return []
    levels = []
    for item in text.split(","):
        episodes, _, jobs = item.strip().partition("x")
        if not episodes.isdigit() or not jobs.isdigit() or int(episodes) < 1 or int(jobs) < 1:
            raise argparse.ArgumentTypeError(f"a level is EPISODESxJOBS, e.g. 1000x10: {item!r}")
        levels.append((int(episodes), int(jobs)))
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--levels",
        type=parse_levels,
        default=parse_levels("100x10,1000x10"),
        help="EPISODESxJOBS,...: the sessions' levels, in order (none: the campaign level alone)",
    )
    parser.add_argument("--run-minutes", type=float, default=10.0, help="running time per job")
    parser.add_argument("--shards", type=int, default=Settings().watch_shards)
    parser.add_argument(
        "--workflow-processes", type=int, default=0, help="workflow-only worker processes"
    )
    parser.add_argument(
        "--campaign",
        type=parse_levels,
        default=[],
        help="ROLLOUTSxJOBS: a campaign level after the others",
    )
    parser.add_argument(
        "--campaign-window",
        type=int,
        default=None,
        help="the campaign's concurrency: rollouts in flight at once (default: all of them)",
    )
    parser.add_argument(
        "--agent-turns-per-second",
        type=float,
        default=None,
        help="the campaign's agent turns started per second, as `posttrain-env agent-worker "
        "--turns-per-second` paces them (default: no pace)",
    )
    parser.add_argument(
        "--server",
        choices=sorted(SERVERS),
        default="test",
        help="the Temporal server: the time-skipping test server, or the dev server in real time",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="an argument for the server (the test server is a GraalVM native image: e.g. "
        "-XX:+VerboseGC)",
    )
    parser.add_argument(
        "--full-collection-every-s",
        type=float,
        default=None,
        help="the workers' full garbage collections, every N s (POSTTRAIN_WORKER_FULL_COLLECTION_"
        "EVERY_S; default: the setting's default; 0: Python's own schedule)",
    )
    parser.add_argument("--serve-workflows", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.levels and not args.campaign:
        parser.error("no level to run: give --levels, --campaign, or both")
    if args.agent_turns_per_second is not None and not 0 < args.agent_turns_per_second < math.inf:
        parser.error("--agent-turns-per-second must be a number above 0")
    every_s = args.full_collection_every_s
    if every_s is not None and not 0 <= every_s <= 86_400:
        parser.error("--full-collection-every-s must be between 0 and 86400")
    if args.serve_workflows:
        address, queue, cache, every_s, gc_log = args.serve_workflows
        asyncio.run(serve_workflows(address, queue, int(cache), float(every_s), Path(gc_log)))
        return
    logging.basicConfig(level=logging.ERROR)
    levels: list[Level] = []

    async def run_all() -> None:
        # A terminated bench still stops the test server and the processes it started: the
        # level is cancelled, so its `finally` runs.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        plan = [(e, j, False) for e, j in args.levels] + [(e, j, True) for e, j in args.campaign]
        for episodes, jobs, campaign in plan:
            with tempfile.TemporaryDirectory(prefix="watch-scale-") as tmp:
                levels.append(
                    await run_level(
                        episodes,
                        jobs,
                        args.run_minutes,
                        args.shards,
                        Path(tmp),
                        args.workflow_processes,
                        campaign,
                        args.server_arg,
                        args.campaign_window,
                        args.server,
                        args.agent_turns_per_second,
                        args.full_collection_every_s,
                    )
                )
            # Each level's row as soon as it is measured: a later level may not finish.
            row = report(levels, args.shards, args.server)[2 + len(levels) - 1]
            print(row, file=sys.stderr, flush=True)

    status = 0
    try:
        asyncio.run(asyncio.wait_for(run_all(), RUN_LIMIT_S))
    except TimeoutError:
        print(f"the benchmark did not finish within {RUN_LIMIT_S} s", file=sys.stderr)
        status = 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("the benchmark was stopped", file=sys.stderr)
        status = 1
    except Exception as err:  # a level that failed: the levels before it are still reported
        print(f"level {len(levels) + 1} failed: {err!r}", file=sys.stderr)
        traceback.print_exc()
        status = 1
    if levels:
        print("\n".join(report(levels, args.shards, args.server)))
    exit_now(status)


if __name__ == "__main__":
    main()
