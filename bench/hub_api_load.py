"""Hub API calls and Temporal history events per job lifecycle, at many concurrent jobs.

    uv run python bench/hub_api_load.py [--jobs 100] [--run-minutes 20]

On the time-skipping test server, with an in-process worker and the real `HfBackend` talking to
the recording fake `HfApi` (tests/hf/fake_hub.py): `--jobs` episodes each submit one job
(`jobs_submit` on cpu-basic), and every job is scheduled for ~45 s and runs ~`--run-minutes`
(staggered by a few seconds per job, deterministically). Workflow time is skipped in unaligned
steps while the fake Hub's clock follows it, until every job workflow has ended. The watcher
looks every `--interval-s`; nobody calls `jobs_wait`, so this is the steady-state cost.

Counted by the fake: every Hub call, split into submit (find_by_key's listing, run_uv_job),
status (the watcher's listings and its per-job looks at ended jobs) and other calls. Counted by
Temporal: the events in each job workflow's history (and the watcher's, shared by all jobs).

Targets (issue 7): on average at most one Hub status call per job per 30 s of running time;
at most 30 history events per job.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.backends.hf.backend import HfBackend, HfBackendConfig
from activities.backends.hf.labels import LABEL_JOB, LABEL_KEY
from posttrain_common.contracts.episode_calls import ToolCall
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.shutdown import exit_now
from posttrain_server.temporal.setup import add_search_attributes
from posttrain_server.worker import build_worker
from tests.hf.fake_hub import FakeHub, JobPlan, model_json
from workflows.episode.session import ResetRequest, SessionState, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import watcher_shard_ids, watcher_workflow_id

RUN_LIMIT_S = 900
TASK_ID = "t_hub_load"
MODEL = "bench-org/tiny-model"
TASK = f"""
id = "{TASK_ID}"
prompt = "Benchmark task."
flavors = ["cpu-basic"]
max_timeout_minutes = 600
budget_usd = 10.0
max_steps = 1000
time_limit_s = 172800
score_timeout_s = 600
max_concurrent_jobs = 2
max_dev_evaluations = 2
eval_flavor = "cpu-basic"
eval_timeout_minutes = 10

[base_model]
repo_id = "{MODEL}"
revision = "main"
"""
# Not a divisor of the watcher's 30 s (the test server stalls when a signal meets a timer).
SKIP_STEP = timedelta(seconds=31.37)
SCHEDULING_S = 45.0
STATUS_CALLS = ("list_jobs", "inspect_job")


@dataclass
class Figures:
    jobs: int
    running_s: float
    submit_calls: int
    status_calls: int
    other_calls: int
    job_events: list[int]
    watcher_events: int

    @property
    def status_per_job_per_30s(self) -> float:
        return self.status_calls / max(1.0, self.running_s / 30)


async def start_episode(client: Client, queue: str, timeout_minutes: int) -> str:
    session = await client.start_workflow(
        SessionWorkflow.run, SessionState(), id=f"session-{uuid.uuid4().hex}", task_queue=queue
    )
    reset = await session.execute_update(SessionWorkflow.reset, ResetRequest(task_id=TASK_ID))
    episode = client.get_workflow_handle_for(EpisodeWorkflow.run, reset.workflow_id)
    submitted = await episode.execute_update(
        EpisodeWorkflow.call_tool,
        ToolCall(
            request_id="submit",
            tool="jobs_submit",
            arguments={
                "script": "print('bench')\n",
                "flavor": "cpu-basic",
                "timeout_minutes": timeout_minutes,
            },
        ),
        id=f"{reset.episode_id}:submit",
    )
    if "error" in submitted.data:
        raise RuntimeError(f"jobs_submit failed: {submitted.data}")
    return f"{reset.workflow_id}/job/1"


async def job_closed(client: Client, workflow_id: str) -> bool:
    """Whether the workflow's latest run has closed. Read raw: the SDK's `describe()` cannot
    decode the datetime search attributes the time-skipping server returns (a rollout's)."""
    described = await client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id)
        )
    )
    return described.workflow_execution_info.HasField("close_time")


def staggered_hub(
    run_s: float, stagger_s: int = 20, clock: Callable[[], datetime] | None = None
) -> tuple[FakeHub, HfBackend]:
    """The recording fake Hub, whose jobs are scheduled ~45 s and run ~`run_s` (staggered by up
    to `stagger_s` seconds per job, deterministically; 0: all alike), and an HfBackend on it
    that follows its clock (`clock`: e.g. the real one; default: the fake Hub's own, moved by
    `hub.advance`)."""
    hub = FakeHub(clock=clock)
    hub.models[MODEL] = model_json(MODEL, "b" * 40)

    def plan(labels: dict[str, str]) -> JobPlan:
        stagger = int(labels.get(LABEL_JOB, "0")[-3:], 16) % stagger_s if stagger_s else 0
        return JobPlan(scheduling_s=SCHEDULING_S + stagger, running_s=run_s + 3 * stagger)

    hub.plan_for = plan
    backend = HfBackend(
        hub.api("hf_benchBrokerToken0123456789"),  # type: ignore[arg-type]
        hub.api(False),  # type: ignore[arg-type]
        deployment="dbench",
        namespace=hub.namespace,
        config=HfBackendConfig(cancel_confirm_interval_s=0.0),
        clock=hub.clock,
    )
    return hub, backend


async def bench(jobs: int, run_minutes: float, interval_s: float, workdir: Path) -> Figures:
    tasks_dir = workdir / "tasks"
    (tasks_dir / TASK_ID).mkdir(parents=True)
    (tasks_dir / TASK_ID / "task.toml").write_text(TASK)
    run_s = run_minutes * 60
    hub, backend = staggered_hub(run_s)
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=_binary("temporal-test-server"),
    )
    try:
        # Episodes upsert the operator's search attributes: an unknown one fails their tasks.
        await add_search_attributes(env.client)
        client, queue = env.client, f"hub-load-{uuid.uuid4().hex[:8]}"
        settings = Settings(state_dir=workdir / "state", backend="fake")
        worker = build_worker(
            client, settings, backend, task_queue=queue, tasks_dir=tasks_dir,
            watch_interval_s=interval_s, key=ServerKey.load_or_create(settings.server_key_path),
        )  # fmt: skip
        async with worker:
            gate = asyncio.Semaphore(10)

            async def one() -> str:
                async with gate:
                    return await start_episode(client, queue, int(run_minutes) + 30)

            job_ids = await asyncio.gather(*(one() for _ in range(jobs)))
            open_jobs = set(job_ids)
            limit = run_s + SCHEDULING_S + 20 * 4 + 600
            skipped = 0.0
            while open_jobs and skipped < limit:
                await env.sleep(SKIP_STEP)
                hub.advance(SKIP_STEP.total_seconds())
                skipped += SKIP_STEP.total_seconds()
                if skipped > run_s:  # look for ended job workflows only near the end
                    current = sorted(open_jobs)
                    ended = await asyncio.gather(*(job_closed(client, j) for j in current))
                    open_jobs -= {j for j, done in zip(current, ended, strict=True) if done}
            if open_jobs:
                raise RuntimeError(f"{len(open_jobs)} job workflows did not end")
            job_events = [
                len((await client.get_workflow_handle(j).fetch_history()).events) for j in job_ids
            ]
            stem = watcher_workflow_id(client.namespace, queue)
            watcher_events = 0
            for shard in watcher_shard_ids(stem, settings.watch_shards):
                try:
                    history = await client.get_workflow_handle(shard).fetch_history()
                except RPCError:
                    continue  # no job of this run hashed to that shard
                watcher_events += len(history.events)
    finally:
        await env.shutdown()
    # find_by_key's listings (by the idempotency label) are part of submitting, not watching.
    submit = [c for c in hub.calls if c.method == "run_uv_job" or _by_key(c.args)]
    status = [c for c in hub.calls if c.method in STATUS_CALLS and not _by_key(c.args)]
    running_s = 0.0
    for job_id in hub.jobs:
        durations = hub.info(job_id).durations
        running_s += float(durations.running_secs or 0) if durations else 0.0
    return Figures(
        jobs=jobs,
        running_s=running_s,
        submit_calls=len(submit),
        status_calls=len(status),
        other_calls=len(hub.calls) - len(submit) - len(status),
        job_events=job_events,
        watcher_events=watcher_events,
    )


def _by_key(args: dict) -> bool:
    return LABEL_KEY in (args.get("labels") or {})


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not on PATH; run with `uv run`")
    return path


def report(f: Figures, run_minutes: float, interval_s: float) -> list[str]:
    per_job = f.status_per_job_per_30s
    events_mean = statistics.mean(f.job_events)
    return [
        f"{f.jobs} concurrent jobs, ~{run_minutes:g} min running each, "
        f"watcher every {interval_s:g} s",
        f"Hub calls per job: submit {f.submit_calls / f.jobs:.2f}, "
        f"status {f.status_calls / f.jobs:.2f}, other {f.other_calls / f.jobs:.2f} "
        f"(status calls in all: {f.status_calls} for {f.running_s / 60:.0f} job-minutes running)",
        f"status calls per job per 30 s of running: {per_job:.4f}  (target <= 1)  "
        f"{'OK' if per_job <= 1 else 'MISSED'}",
        f"history events per job workflow: mean {events_mean:.1f}, max {max(f.job_events)}  "
        f"(target <= 30)  {'OK' if max(f.job_events) <= 30 else 'MISSED'}",
        f"watcher history events: {f.watcher_events} in all, "
        f"{f.watcher_events / f.jobs:.1f} per job (shared)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="concurrent jobs (one per episode)")
    parser.add_argument("--run-minutes", type=float, default=20.0, help="running time per job")
    parser.add_argument("--interval-s", type=float, default=30.0, help="the watcher's interval")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    status = 0
    with tempfile.TemporaryDirectory(prefix="hub-api-load-") as tmp:
        try:
            figures = asyncio.run(
                asyncio.wait_for(
                    bench(args.jobs, args.run_minutes, args.interval_s, Path(tmp)), RUN_LIMIT_S
                )
            )
            print("\n".join(report(figures, args.run_minutes, args.interval_s)))
        except TimeoutError:
            print(f"the benchmark did not finish within {RUN_LIMIT_S} s", file=sys.stderr)
            status = 1
    exit_now(status)


if __name__ == "__main__":
    main()
