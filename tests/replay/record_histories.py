"""Record the histories of real episodes, for the replay test (tests/replay/test_replay.py).

    uv run python -m tests.replay.record_histories --label <what changed> [scenarios...]

Each scenario runs against a real Temporal dev server with the project's own workers, and every
workflow execution it leaves (sessions, episodes, jobs, the watcher, the account; every run of a
workflow that continued as new) is written as Temporal's JSON history, into a folder of its own
(`histories/<date>-<label>/`). Run it with the code whose histories you want to keep, and keep
the older folders: committed histories prove that episodes started by that code keep running
after an upgrade (docs/development.md, "Changing workflow code").

Scenarios:
- `t0_artifact`: a whole episode on the local backend with the task's reference solution (the
  demo's flow: submit, wait, dev_evaluate, submit).
- `reset`: a session that resets while a job runs (the job is cancelled and confirmed), plays a
  little in the next episode and closes, with the server-wide caps on (the account workflow).
- `continue_as_new`: an episode that continues as new past 100 events with a job running, and
  goes on answering afterwards.
- `cancel_pending`: a job whose cancellation is never confirmed: the reset that asked for it
  fails, and the job's workflow re-issues the cancel.
- `sent_again`: the patched branches of the episode's end. A task with public test items: a
  `dev_evaluate` and a `submit` each sent again while they run (the second attaches to the
  first's work), the grader's contamination check, the audit record; then, while a cancelled job
  keeps the episode open, a `submit` sent again and another call after the end.
- `replay_miss`: the replay backend over the fake, falling through: a job recorded, then
  replayed in two episodes whose `dev_evaluate` and `submit` find no recording of their
  evaluation (each episode ends `replay_miss`).
- `known_runs`: the replay backend over the fake, falling through: a job, its dev evaluation
  and its grading recorded by one episode, then replayed by the next with no job workflows (the
  episode follows their known runs, beside a job with no recording that falls through and is
  cancelled at the end), and a third that cancels its replayed job while it runs.
- `outside_cancel`: cancels through Temporal (the UI's "Request Cancellation"): a job's
  workflow, the watcher, the account, then the episode's workflow; then another session's
  workflow (it ends its episode).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.startup import DEV_SERVER_STARTUP
from tests.waiting import eventually

HERE = Path(__file__).parent
DEFAULT_OUT = HERE / "histories"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def dev_server() -> WorkflowEnvironment:
    from posttrain_server.temporal.client import core_runtime
    from workflows.operations.search_attributes import SEARCH_ATTRIBUTES

    return await WorkflowEnvironment.start_local(
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=shutil.which("temporal"),
        runtime=core_runtime(),
        dev_server_log_level="error",
        search_attributes=SEARCH_ATTRIBUTES,
    )


async def save_all(client: Client, scenario: str, out: Path) -> list[Path]:
    """Every execution on the server, each run in its own file."""
    written: list[Path] = []
    seen: dict[str, int] = {}
    executions = [e async for e in client.list_workflows()]
    for execution in sorted(executions, key=lambda e: (e.start_time, e.id)):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        n = seen[execution.workflow_type] = seen.get(execution.workflow_type, 0) + 1
        path = out / f"{scenario}--{execution.workflow_type}--{n}.json"
        path.write_text(json.dumps(without_stack_traces(json.loads(history.to_json()))) + "\n")
        written.append(path)
    return written


async def settled(
    client: Client, closed_types: Sequence[str] = ("JobWorkflow",), timeout_s: float = 120
) -> None:
    """Until every workflow of `closed_types` has closed and no open workflow has a workflow
    task to run, on two looks in a row: whatever reached a workflow (a signal, a timer, an
    activity's result) is in its history before the histories are saved. (A signal on its way
    between two workflows is in neither's pending task, hence the second look.)"""
    deadline = asyncio.get_running_loop().time() + timeout_s
    quiet = 0
    while quiet < 2:
        busy = []
        async for execution in client.list_workflows():
            if execution.status is not WorkflowExecutionStatus.RUNNING:
                continue
            if execution.workflow_type in closed_types:
                busy.append(execution.id)
                continue
            handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
            if (await handle.describe()).raw_description.HasField("pending_workflow_task"):
                busy.append(execution.id)
        quiet = 0 if busy else quiet + 1
        if busy and asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"never settled: {busy}")
        await asyncio.sleep(0.2)  # pacing between two looks


async def activities_done(client: Client, workflow_id: str, activity: str) -> int:
    """How many `activity` activities of the workflow have completed."""
    scheduled: set[int] = set()
    done = 0
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity:
                scheduled.add(event.event_id)
        elif event.HasField("activity_task_completed_event_attributes"):
            done += event.activity_task_completed_event_attributes.scheduled_event_id in scheduled
    return done


def without_stack_traces(value: Any) -> Any:
    """The history with every failure's stack trace emptied: they name this machine's folders,
    and replay never reads them (it compares commands, not failures' texts)."""
    if isinstance(value, dict):
        return {k: "" if k == "stackTrace" else without_stack_traces(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_stack_traces(v) for v in value]
    return value


@contextlib.asynccontextmanager
async def fake_stack(
    env: WorkflowEnvironment, workdir: Path, scenario: Any, **settings: Any
) -> AsyncIterator[tuple[Client, str]]:
    from activities.backends.fake.backend import FakeBackend
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.worker import build_worker
    from tests.workflows.harness import write_task

    tasks_dir = workdir / "tasks"
    write_task(tasks_dir)
    config = Settings(state_dir=workdir / "state", backend="fake", **settings)
    backend = FakeBackend(config.state_dir / "fake", scenario)
    queue = f"record-{uuid.uuid4().hex[:8]}"
    key = ServerKey.load_or_create(config.server_key_path)
    async with build_worker(
        env.client, config, backend, key=key, task_queue=queue, tasks_dir=tasks_dir
    ):
        yield env.client, queue


async def session_reset(client: Client, queue: str, session: str, task_id: str = "t_test") -> Any:
    from workflows.episode.session import ResetRequest, ResetResult, SessionState, SessionWorkflow

    handle = await client.start_workflow(
        SessionWorkflow.run, SessionState(), id=f"session-{session}", task_queue=queue
    )
    return await handle.execute_update(
        SessionWorkflow.reset, ResetRequest(task_id=task_id), result_type=ResetResult
    )


async def call(client: Client, episode_id: str, tool: str, **arguments: Any) -> Any:
    from mcp_gateway.episode_calls import call_tool, tool_call

    return await call_tool(client, episode_id, tool_call(uuid.uuid4().hex, tool, arguments, "step"))


async def wait_state(client: Client, episode_id: str, job_id: str, states: set[str]) -> dict:
    for _ in range(120):
        view = (await call(client, episode_id, "jobs_wait", job_id=job_id, timeout_s=5)).data
        if view["state"] in states:
            return view
    raise RuntimeError(f"job {job_id} never reached {states}")


async def record_reset(out: Path, workdir: Path) -> list[Path]:
    from activities.backends.fake.backend import FakeDataset, FakeJobScript, FakeScenario
    from workflows.episode.session import SessionWorkflow

    scenario = FakeScenario(
        jobs=[
            FakeJobScript(script_contains="LONG", queue_s=1, run_s=3600, logs=["step 1"]),
            FakeJobScript(queue_s=1, run_s=2),
        ],
        datasets={"org/public": FakeDataset(revision="a" * 40)},
    )
    env = await dev_server()
    caps = {"max_live_episodes": 10, "spend_cap_usd": 100.0}
    async with env:
        async with fake_stack(env, workdir, scenario, **caps) as (client, queue):
            first = await session_reset(client, queue, "reset")
            submitted = await call(
                client,
                first.episode_id,
                "jobs_submit",
                script="LONG = 1\n",
                flavor="cpu-basic",
                timeout_minutes=60,
                datasets=["org/public"],
            )
            await wait_state(client, first.episode_id, submitted.data["job_id"], {"running"})
            await call(client, first.episode_id, "jobs_logs", job_id=submitted.data["job_id"])
            from workflows.episode.session import ResetRequest, ResetResult

            session = client.get_workflow_handle("session-reset")
            second = await session.execute_update(
                SessionWorkflow.reset, ResetRequest(task_id="t_test"), result_type=ResetResult
            )
            await call(client, second.episode_id, "task_info")
            quick = await call(
                client,
                second.episode_id,
                "jobs_submit",
                script="print(1)\n",
                flavor="cpu-basic",
                timeout_minutes=5,
            )
            await wait_state(client, second.episode_id, quick.data["job_id"], {"succeeded"})
            await session.execute_update(SessionWorkflow.close)
            await settled(client)
        return await save_all(env.client, "reset", out)


async def record_continue_as_new(out: Path, workdir: Path) -> list[Path]:
    from activities.backends.fake.backend import FakeJobScript, FakeScenario

    scenario = FakeScenario(jobs=[FakeJobScript(queue_s=1, run_s=3600)])
    env = await dev_server()
    async with env:
        async with fake_stack(env, workdir, scenario, continue_as_new_events=100) as (
            client,
            queue,
        ):
            episode = await session_reset(client, queue, "continue-as-new")
            job = await call(
                client,
                episode.episode_id,
                "jobs_submit",
                script="print(1)\n",
                flavor="cpu-basic",
                timeout_minutes=60,
            )
            handle = client.get_workflow_handle(episode.workflow_id)
            first_run = (await handle.describe()).run_id
            for _ in range(25):
                await call(client, episode.episode_id, "task_info")

            async def continued() -> bool:
                return (await handle.describe()).run_id != first_run

            await eventually(continued, 10, "the episode to continue as new")
            await call(client, episode.episode_id, "jobs_status", job_id=job.data["job_id"])
            await call(client, episode.episode_id, "jobs_cancel", job_id=job.data["job_id"])
            await settled(client)
        return await save_all(env.client, "continue_as_new", out)


async def record_cancel_pending(out: Path, workdir: Path) -> list[Path]:
    from activities.backends.fake.backend import FakeJobScript, FakeScenario
    from workflows.episode.session import ResetRequest, SessionWorkflow

    scenario = FakeScenario(
        jobs=[FakeJobScript(queue_s=1, run_s=3600, cancel_confirm_after_s=None)]
    )
    env = await dev_server()
    async with env:
        async with fake_stack(env, workdir, scenario, cancel_confirm_s=2) as (client, queue):
            episode = await session_reset(client, queue, "cancel-pending")
            job = await call(
                client,
                episode.episode_id,
                "jobs_submit",
                script="print(1)\n",
                flavor="cpu-basic",
                timeout_minutes=60,
            )
            await wait_state(client, episode.episode_id, job.data["job_id"], {"running"})
            session = client.get_workflow_handle("session-cancel-pending")
            try:
                await session.execute_update(SessionWorkflow.reset, ResetRequest(task_id="t_test"))
            except WorkflowUpdateFailedError:
                pass  # the cancellation was not confirmed in time: as it should
            else:
                raise RuntimeError("the reset should have failed")
            # The job's workflow re-issues its cancel after 15 s.
            [job_workflow] = [
                e.id async for e in client.list_workflows() if e.workflow_type == "JobWorkflow"
            ]

            async def asked_again() -> bool:
                return await activities_done(client, job_workflow, "cancel_job") >= 2

            await eventually(asked_again, 60, "the job's workflow to ask for the cancel again")
            await settled(client, closed_types=())
        return await save_all(env.client, "cancel_pending", out)


# A task whose test items the grader-side contamination check looks for; the agent's script
# embeds the first one, so the check flags it (its evidence goes to the audit record only).
TEST_ITEMS = [
    "Which river flows through the ancient city that was founded, according to legend, by twin "
    "brothers who were raised by a wolf?",
    "Name the only metal that is liquid at room temperature and was once used in thermometers, "
    "barometers and some old dental fillings.",
]


def write_items_task(tasks_dir: Path, task_id: str) -> None:
    from tests.workflows.harness import write_task

    write_task(tasks_dir, task_id)
    folder = tasks_dir / task_id
    table = '\n[contamination]\ntest_items = "test_items.jsonl"\npolicy = "report"\n'
    (folder / "task.toml").write_text((folder / "task.toml").read_text() + table)
    lines = [json.dumps({"id": f"q{n}", "text": text}) for n, text in enumerate(TEST_ITEMS)]
    (folder / "test_items.jsonl").write_text("\n".join(lines) + "\n")


async def jobs_seen(client: Client, workflow_id: str, count: int) -> None:
    """Until the episode has started `count` jobs (evaluations and graders count)."""
    from workflows.episode.workflow import EpisodeWorkflow

    handle = client.get_workflow_handle(workflow_id)

    async def started() -> bool:
        return len((await handle.query(EpisodeWorkflow.status)).jobs) >= count

    await eventually(started, 30, f"the episode to start {count} jobs")


async def closed(client: Client, workflow_id: str) -> None:
    handle = client.get_workflow_handle(workflow_id)

    async def completed() -> bool:
        return (await handle.describe()).status is WorkflowExecutionStatus.COMPLETED

    await eventually(completed, 60, f"{workflow_id} to complete")


async def record_sent_again(out: Path, workdir: Path) -> list[Path]:
    from activities.backends.fake.backend import FakeJobScript, FakeScenario
    from posttrain_common.contracts.jobs import JobRole

    scenario = FakeScenario(
        jobs=[
            # Cancelled by the end, and confirmed only a few seconds later: the episode stays
            # open meanwhile and answers calls after its end itself.
            FakeJobScript(script_contains="SLOW", queue_s=1, run_s=3600, cancel_confirm_after_s=3),
            FakeJobScript(role=JobRole.agent, queue_s=1, run_s=2),
            FakeJobScript(queue_s=1, run_s=4, score=0.75),
        ]
    )
    write_items_task(workdir / "tasks", "t_items")
    env = await dev_server()
    async with env:
        async with fake_stack(env, workdir, scenario) as (client, queue):
            episode = await session_reset(client, queue, "sent-again", task_id="t_items")
            eid = episode.episode_id
            script = f"QUESTIONS = [{TEST_ITEMS[0]!r}]\nprint('training on', QUESTIONS)\n"
            trained = await call(
                client, eid, "jobs_submit", script=script, flavor="cpu-basic", timeout_minutes=5
            )
            job_id = trained.data["job_id"]
            slow = await call(
                client,
                eid,
                "jobs_submit",
                script="SLOW = 1\n",
                flavor="cpu-basic",
                timeout_minutes=60,
            )
            await wait_state(client, eid, slow.data["job_id"], {"running"})
            await wait_state(client, eid, job_id, {"succeeded"})
            for tool, jobs in (("dev_evaluate", 3), ("submit", 4)):
                first = asyncio.create_task(call(client, eid, tool, job_id=job_id))
                await jobs_seen(client, episode.workflow_id, jobs)
                again = await call(client, eid, tool, job_id=job_id)  # attaches to the first
                if (await first).data != again.data or "error" in again.data:
                    raise RuntimeError(f"{tool} sent again did not attach: {again.data}")
            status = await client.get_workflow_handle(episode.workflow_id).describe()
            if status.status is not WorkflowExecutionStatus.RUNNING:
                raise RuntimeError("the episode closed before its cancelled job confirmed")
            await call(client, eid, "submit", job_id=job_id)  # the grading's answer again
            over = await call(client, eid, "task_info")
            if over.data.get("error", {}).get("type") != "episode_over":
                raise RuntimeError(f"a call after the end was answered {over.data}")
            await closed(client, episode.workflow_id)
            await settled(client)
        return await save_all(env.client, "sent_again", out)


async def record_t0_artifact(out: Path, workdir: Path) -> list[Path]:
    import uvicorn

    from mcp_gateway.app import create_app, uvicorn_config
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.demo import play
    from posttrain_server.wiring import make_backend
    from posttrain_server.worker import build_worker

    settings = Settings(state_dir=workdir / "state", backend="local")
    key = ServerKey.load_or_create(settings.server_key_path)
    env = await dev_server()
    async with env:
        backend = make_backend(settings, key)
        async with build_worker(env.client, settings, backend, key=key):
            port = free_port()
            server = uvicorn.Server(
                uvicorn_config(create_app(settings, env.client, key), "127.0.0.1", port)
            )
            serving = asyncio.create_task(server.serve())
            await started(server)
            try:
                run = await play(f"http://127.0.0.1:{port}", sys.stderr, lambda _name: None)
                if run.reward != 1.0:
                    raise RuntimeError(f"the episode did not score 1.0: {run}")
            finally:
                server.should_exit = True
                await serving
            await settled(env.client)  # the watcher and the job workflows see the ends
        return await save_all(env.client, "t0_artifact", out)


async def record_replay_miss(out: Path, workdir: Path) -> list[Path]:
    from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
    from activities.backends.replay.backend import ReplayBackend
    from activities.backends.replay.store import ReplayStore
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.worker import build_worker
    from tests.workflows.harness import write_task

    tasks_dir = workdir / "tasks"
    write_task(tasks_dir)
    config = Settings(state_dir=workdir / "state", backend="replay")
    inner = FakeBackend(config.state_dir / "fake", FakeScenario(jobs=[FakeJobScript(run_s=1)]))
    store = ReplayStore(workdir / "store")
    backend = ReplayBackend(config.state_dir / "replay", store, inner, fall_through=True)
    queue = f"record-{uuid.uuid4().hex[:8]}"
    key = ServerKey.load_or_create(config.server_key_path)
    script = "print('recorded once')\n"
    env = await dev_server()
    async with env:
        client = env.client
        async with build_worker(
            client, config, backend, key=key, task_queue=queue, tasks_dir=tasks_dir
        ):
            for session, last in (("first", None), ("dev", "dev_evaluate"), ("grade", "submit")):
                reset = await session_reset(client, queue, f"miss-{session}")
                submitted = await call(
                    client,
                    reset.episode_id,
                    "jobs_submit",
                    script=script,
                    flavor="cpu-basic",
                    timeout_minutes=5,
                )
                job_id = submitted.data["job_id"]
                await wait_state(client, reset.episode_id, job_id, {"succeeded"})
                if last is None:  # the first run fell through: recorded, its evaluations not
                    continue
                # The job was replayed; its evaluation has no recording and cannot fall through.
                missed = await call(client, reset.episode_id, last, job_id=job_id)
                end = missed.metadata.episode_end
                if end is None or end.reason.value != "replay_miss":
                    raise RuntimeError(f"{last} did not end replay_miss: {missed}")
            await settled(client)
        return await save_all(client, "replay_miss", out)


async def record_outside_cancel(out: Path, workdir: Path) -> list[Path]:
    """Cancels through Temporal, as the UI's "Request Cancellation" sends them: a job's
    workflow (its backend job is cancelled and its end reported), then the episode's (it ends as
    an operator's cancel), then the watcher and the account (both go on, as new)."""
    from activities.backends.fake.backend import FakeJobScript, FakeScenario
    from posttrain_common.settings import Settings
    from workflows.ids import (
        account_workflow_id,
        episode_workflow_id,
        job_workflow_id,
        watcher_shard_id,
        watcher_workflow_id,
    )

    scenario = FakeScenario(jobs=[FakeJobScript(queue_s=0, run_s=3600, cancel_confirm_after_s=1)])
    env = await dev_server()
    caps = {"max_live_episodes": 10, "spend_cap_usd": 100.0}
    async with env:
        async with fake_stack(env, workdir, scenario, **caps) as (client, queue):
            episode = await session_reset(client, queue, "outside-cancel")
            episode_id = episode.episode_id
            for n in (1, 2):
                job = await call(
                    client,
                    episode_id,
                    "jobs_submit",
                    script=f"print({n})\n",
                    flavor="cpu-basic",
                    timeout_minutes=60,
                )
                job_id = job.data["job_id"]
                await wait_state(client, episode_id, job_id, {"running"})
                if n == 1:
                    await client.get_workflow_handle(
                        f"{episode_workflow_id(episode_id)}/job/1"
                    ).cancel()
                    await wait_state(client, episode_id, job_id, {"cancelled"})
            # The shard that follows the job still running.
            watcher = watcher_shard_id(
                watcher_workflow_id(client.namespace, queue),
                Settings().watch_shards,
                job_workflow_id(episode_id, 2),
            )
            await client.get_workflow_handle(watcher).cancel()
            await client.get_workflow_handle(account_workflow_id(client.namespace, queue)).cancel()
            await client.get_workflow_handle(episode_workflow_id(episode_id)).cancel()
            await closed(client, episode_workflow_id(episode_id))
            # A second session, cancelled itself: it ends its episode.
            second = await session_reset(client, queue, "outside-cancel-2")
            await client.get_workflow_handle("session-outside-cancel-2").cancel()
            await closed(client, episode_workflow_id(second.episode_id))
            await settled(client)
        return await save_all(env.client, "outside_cancel", out)


async def record_watcher_shards(out: Path, workdir: Path) -> list[Path]:
    """A job followed by its shard (issue 27): the shard looks at the interval's boundaries,
    continues as new past its history budget (lowered here), and a retried submit's late
    registration of the job after its end is not followed again."""
    from datetime import UTC
    from datetime import datetime as clock

    from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
    from posttrain_common.settings import Settings
    from workflows.ids import (
        episode_workflow_id,
        job_workflow_id,
        watcher_shard_id,
        watcher_workflow_id,
    )
    from workflows.job.watcher import WatcherInput, WatcherWorkflow, WatchRequest

    scenario = FakeScenario(jobs=[FakeJobScript(queue_s=1, run_s=5)])
    env = await dev_server()
    async with env:
        async with fake_stack(env, workdir, scenario, watch_interval_s=2) as (client, queue):
            episode = await session_reset(client, queue, "watcher-shards")
            episode_id = episode.episode_id
            job_key = job_workflow_id(episode_id, 1)
            shard = watcher_shard_id(
                watcher_workflow_id(client.namespace, queue), Settings().watch_shards, job_key
            )
            # The shard is started first, with a history budget small enough to pass at once.
            await client.start_workflow(
                WatcherWorkflow.run,
                WatcherInput(interval_s=2, idle_exit_s=5, history_budget_bytes=1),
                id=shard,
                task_queue=queue,
            )
            job = await call(
                client,
                episode_id,
                "jobs_submit",
                script="print(1)\n",
                flavor="cpu-basic",
                timeout_minutes=5,
            )
            view = await wait_state(client, episode_id, job.data["job_id"], {"succeeded"})
            found = await FakeBackend(workdir / "state" / "fake", scenario).find_by_key(
                job_key, clock.now(UTC)
            )
            assert found is not None and view["state"] == "succeeded"
            late = WatchRequest(
                ref=found.ref,
                workflow_id=job_key,
                state="running",
                job_id=view["job_id"],
                episode_workflow_id=episode_workflow_id(episode_id),
            )
            await client.get_workflow_handle(shard).signal(WatcherWorkflow.watch, late)
            await closed(client, shard)  # it follows nothing, so it exits after idle_exit_s
            await settled(client)
        return await save_all(env.client, "watcher_shards", out)


async def record_known_runs(out: Path, workdir: Path) -> list[Path]:
    """Jobs whose runs the replay backend knows at their start (pt-known-runs-1): recorded by a
    first episode that falls through, then replayed with no job workflow: a second episode
    waits for its job through queued and running (the episode's own timers), has it dev
    evaluated and submits it, beside a job with no recording (it falls through, with a
    workflow, and is cancelled by the end); a third cancels its replayed job while it runs."""
    from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
    from activities.backends.replay.backend import ReplayBackend
    from activities.backends.replay.store import ReplayStore
    from posttrain_common.contracts.jobs import JobRole
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.worker import build_worker
    from tests.workflows.harness import write_task
    from workflows.episode.session import ResetRequest, ResetResult, SessionWorkflow

    tasks_dir = workdir / "tasks"
    write_task(tasks_dir)
    config = Settings(state_dir=workdir / "state", backend="replay")
    scenario = FakeScenario(
        jobs=[
            FakeJobScript(script_contains="SLOW", queue_s=1, run_s=3600),
            FakeJobScript(role=JobRole.agent, queue_s=1, run_s=3),
            FakeJobScript(role=JobRole.dev, queue_s=1, run_s=2, score=0.5),
            FakeJobScript(role=JobRole.grader, queue_s=1, run_s=2, score=0.75),
        ]
    )
    inner = FakeBackend(config.state_dir / "fake", scenario)
    store = ReplayStore(workdir / "store")
    backend = ReplayBackend(config.state_dir / "replay", store, inner, fall_through=True)
    queue = f"record-{uuid.uuid4().hex[:8]}"
    key = ServerKey.load_or_create(config.server_key_path)
    script = "print('recorded, then replayed')\n"
    env = await dev_server()
    async with env:
        client = env.client
        async with build_worker(
            client, config, backend, key=key, task_queue=queue, tasks_dir=tasks_dir
        ):
            for session in ("recorded", "replayed"):
                reset = await session_reset(client, queue, f"known-{session}")
                eid = reset.episode_id
                submitted = await call(
                    client, eid, "jobs_submit", script=script, flavor="cpu-basic", timeout_minutes=5
                )
                job_id = submitted.data["job_id"]
                if session == "replayed":
                    await call(
                        client,
                        eid,
                        "jobs_submit",
                        script="SLOW = 1\n",
                        flavor="cpu-basic",
                        timeout_minutes=60,
                    )
                await wait_state(client, eid, job_id, {"succeeded"})
                dev = await call(client, eid, "dev_evaluate", job_id=job_id)
                graded = await call(client, eid, "submit", job_id=job_id)
                end = graded.metadata.episode_end
                if dev.data.get("score") != 0.5 or end is None or end.reward != 0.75:
                    raise RuntimeError(f"{session}: {dev.data} {graded.data}")
                if session == "replayed" and end.replayed is not True:
                    raise RuntimeError(f"the second episode was not replayed: {end}")
                await closed(client, reset.workflow_id)
            cut = await session_reset(client, queue, "known-cut")
            submitted = await call(
                client,
                cut.episode_id,
                "jobs_submit",
                script=script,
                flavor="cpu-basic",
                timeout_minutes=5,
            )
            cancelled = await call(
                client, cut.episode_id, "jobs_cancel", job_id=submitted.data["job_id"]
            )
            if cancelled.data.get("state") != "cancelled":
                raise RuntimeError(f"the replayed job was not cancelled: {cancelled.data}")
            session = client.get_workflow_handle("session-known-cut")
            await session.execute_update(  # a reset ends it
                SessionWorkflow.reset, ResetRequest(task_id="t_test"), result_type=ResetResult
            )
            await closed(client, cut.workflow_id)
            await settled(client)
        return await save_all(client, "known_runs", out)


SCENARIOS = {
    "t0_artifact": record_t0_artifact,
    "reset": record_reset,
    "continue_as_new": record_continue_as_new,
    "cancel_pending": record_cancel_pending,
    "sent_again": record_sent_again,
    "outside_cancel": record_outside_cancel,
    "replay_miss": record_replay_miss,
    "watcher_shards": record_watcher_shards,
    "known_runs": record_known_runs,
}


async def started(server: Any) -> None:
    """Until uvicorn's server has started."""
    await eventually(lambda: server.started, 10, "the gateway to start", every_s=0.02)


Recorder = Callable[[Path, Path], Coroutine[Any, Any, list[Path]]]


def record_into(out: Path, scenarios: Mapping[str, Recorder], only: Sequence[str]) -> None:
    """Run each scenario (or those `only` names) in a temporary folder of its own, replacing
    its earlier histories in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    print(f"recording into {out}", file=sys.stderr)
    for name, record in scenarios.items():
        if only and name not in only:
            continue
        for old in out.glob(f"{name}--*.json"):
            old.unlink()
        with tempfile.TemporaryDirectory(prefix=f"record-{name}-") as tmp:
            written = asyncio.run(record(out, Path(tmp)))
        print(f"{name}: {len(written)} histories", file=sys.stderr)


def recorder_cli(description: str, scenarios: Mapping[str, Recorder], tag: str = "-") -> None:
    """`--label L [--out DIR] [scenarios...]`: into DIR, or histories/<date><tag><label>."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--label", required=True, help="what the recorded code is, e.g. a change")
    parser.add_argument(
        "--out", type=Path, help=f"another folder (default: histories/<date>{tag}<label>)"
    )
    parser.add_argument("scenarios", nargs="*", help=f"some of {', '.join(scenarios)}")
    args = parser.parse_args()
    label = "-".join(args.label.lower().split())
    day = datetime.date.today().isoformat()
    record_into(args.out or DEFAULT_OUT / f"{day}{tag}{label}", scenarios, args.scenarios)


if __name__ == "__main__":
    recorder_cli((__doc__ or "").splitlines()[0], SCENARIOS)
