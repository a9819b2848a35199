"""A real restart: file-backed Temporal dev server, the worker as a real `posttrain-env worker`
process killed with SIGKILL mid-episode, and a new worker process finishing the same episode.

On the dev server workflow time is real time, so the fake's jobs last seconds here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import write_new_key
from posttrain_server.temporal.dev_server import start_dev_command
from tests.payload_limits import assert_no_violation_in
from tests.waiting import PROGRESS_S, eventually
from tests.workflows.harness import Answer, reset_new_session, write_task
from workflows.episode.workflow import EpisodeWorkflow

# An update sent while no worker runs waits for the next one (start-up + sticky-queue timeout).
UPDATE_RPC_TIMEOUT = timedelta(seconds=60)
SCRIPT = "print('training')\n"
ADMITTED = UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    """Signal the process group we started (the worker and anything it spawned), then reap."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def spawn_dev_server(db_file: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            start_dev_command(db_file, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@asynccontextmanager
async def dev_server(db_file: Path) -> AsyncIterator[tuple[str, Client]]:
    """A file-backed dev server on free ports, checked to be the process we spawned."""
    port = free_port()
    log = db_file.with_suffix(".log")
    proc = spawn_dev_server(db_file, port, log)
    address = f"127.0.0.1:{port}"
    try:
        client: Client | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while client is None:
            # A port taken by someone else makes our server exit: never talk to theirs.
            if proc.poll() is not None:
                raise RuntimeError(f"the dev server exited: {log.read_text()[-2000:]}")
            try:
                client = await Client.connect(address, data_converter=pydantic_data_converter)
            except RuntimeError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        assert proc.poll() is None
        yield address, client
    finally:
        stop(proc)


@contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`posttrain-env worker` in its own process group, its output in `log`."""
    exe = Path(sys.executable).with_name("posttrain-env")
    command = [str(exe)] if exe.exists() else [shutil.which("posttrain-env") or "posttrain-env"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*command, "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop(proc)
        assert_no_violation_in(log)  # the check in-process workers get from tests/conftest.py


async def call(
    handle: WorkflowHandle[Any, Any], episode_id: str, request_id: str, tool: str, **arguments: Any
) -> Answer:
    result = await handle.execute_update(
        EpisodeWorkflow.call_tool,
        ToolCall(request_id=request_id, tool=tool, arguments=arguments),
        id=f"{episode_id}:{request_id}",
        result_type=ToolResult,
        rpc_timeout=UPDATE_RPC_TIMEOUT,
    )
    return Answer.of(result, "step")


async def admitted(client: Client, workflow_id: str, update_id: str) -> bool:
    """Whether the server holds the update (it is admitted even while no worker runs)."""
    request = PollWorkflowExecutionUpdateRequest(
        namespace=client.namespace,
        update_ref=UpdateRef(
            workflow_execution=WorkflowExecution(workflow_id=workflow_id), update_id=update_id
        ),
        wait_policy=WaitPolicy(lifecycle_stage=ADMITTED),
    )
    try:
        await client.workflow_service.poll_workflow_execution_update(
            request, retry=False, timeout=timedelta(seconds=2)
        )
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def test_a_worker_killed_mid_episode_and_a_new_one_finish_the_same_episode_with_the_same_result(  # noqa: E501
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    write_task(tmp_path / "tasks")
    scenario = FakeScenario(
        jobs=[
            FakeJobScript(role=JobRole.agent, queue_s=1, run_s=6),
            FakeJobScript(role=JobRole.grader, queue_s=0.5, run_s=1, score=0.5),
        ]
    )
    (tmp_path / "scenario.json").write_text(scenario.model_dump_json())
    task_queue = f"tq-restart-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "worker.log"

    key = tmp_path / "server.key"
    write_new_key(key)

    async with dev_server(tmp_path / "temporal.db") as (address, client):
        env = {
            **os.environ,
            "POSTTRAIN_BACKEND": "fake",
            "POSTTRAIN_STATE_DIR": str(state_dir),
            "TEMPORAL_ADDRESS": address,
            "POSTTRAIN_TASK_QUEUE": task_queue,
            "POSTTRAIN_TASKS_DIR": str(tmp_path / "tasks"),
            "POSTTRAIN_WATCH_INTERVAL_S": "1",
            "POSTTRAIN_FAKE_SCENARIO": str(tmp_path / "scenario.json"),
            # With TEMPORAL_ADDRESS a worker needs the deployment's key: both workers hold it.
            "POSTTRAIN_SERVER_KEY_FILE": str(key),
        }

        def log_tail() -> str:
            return log.read_text(errors="replace")[-3000:] if log.exists() else ""

        with worker_process(env, log) as first:
            reset = await reset_new_session(client, task_queue, rpc_timeout=UPDATE_RPC_TIMEOUT)
            episode_id = reset.episode_id
            handle = client.get_workflow_handle(reset.workflow_id)
            submitted = await call(
                handle,
                episode_id,
                "r1",
                "jobs_submit",
                script=SCRIPT,
                flavor="cpu-basic",
                timeout_minutes=10,
            )
            job_id = submitted.data["job_id"]

            async def job_running() -> bool:
                status = await handle.query(EpisodeWorkflow.status, result_type=EpisodeStatus)
                return status.jobs[0]["state"] == "running"

            await eventually(job_running, PROGRESS_S, f"job {job_id} to run\n{log_tail()}")
            stop(first, signal.SIGKILL)
            assert first.returncode == -signal.SIGKILL

        # Sent while no worker runs: it must complete once the next worker is up.
        waiting = asyncio.create_task(
            call(handle, episode_id, "r2", "jobs_wait", job_id=job_id, timeout_s=30)
        )
        await eventually(
            lambda: admitted(client, reset.workflow_id, f"{episode_id}:r2"),
            15,
            "the server to hold the jobs_wait update",
        )
        assert not waiting.done()
        with worker_process(env, log):
            waited = await waiting
            n = 2
            while waited.data.get("state") != "succeeded":
                assert waited.data.get("state") in ("queued", "running"), (waited.data, log_tail())
                n += 1
                waited = await call(
                    handle, episode_id, f"r{n}", "jobs_wait", job_id=job_id, timeout_s=30
                )

            first_submit = await call(handle, episode_id, "r-submit", "submit", job_id=job_id)
            again = await call(handle, episode_id, "r-submit", "submit", job_id=job_id)
            status = await handle.query(EpisodeWorkflow.status, result_type=EpisodeStatus)

            assert first_submit.reward == 0.5, (first_submit, log_tail())
            assert first_submit.done
            assert first_submit.data["score"] == 0.5
            assert first_submit.metadata["episode_end"]["reason"] == "submitted"
            spend = first_submit.metadata["service_spend"]
            # 6 s of cpu-basic at 167 micro-USD/min settles as one minute; the grader is free.
            assert spend == {
                "version": 2,
                "final": True,
                "reserved": {"usd": 0.0},
                "settled": {"usd": 0.000167, "gpu_s": 0.0, "jobs": 1, "calls": 0},
                "storage": {"bytes": 0, "reserved_bytes": 0, "cap_bytes": 100 << 30, "usd": 0.0},
            }
            assert again == first_submit  # the same request id is answered once, after restart
            assert status.done and status.end is not None and status.end.reward == 0.5

    roles = [r.role for r in FakeBackend(state_dir / "fake", scenario).requests()]
    assert sorted(roles) == [JobRole.agent, JobRole.grader]
