"""The runbook's commands (docs/operations.md, its titled `bash` blocks) run as written, on this
test's own ids, address and task queue, each in the state it is for, against the real dev
server (fake backend): each works, and the state it repairs is repaired."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
from pathlib import Path

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import JobState
from posttrain_server.temporal.dev_server import free_ports, port_busy
from posttrain_server.worker_metrics import VisibilityCollector
from tests.gateway.server import command
from tests.operator.dev_env import Done, Operated, operated
from tests.operator.test_outside_cancel import (
    LONG,
    audit_record,
    backend_state,
    start_job,
    status,
    workflow_status,
)
from tests.waiting import PROGRESS_S, eventually
from workflows.ids import episode_workflow_id
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
NEVER_CONFIRMED = FakeScenario(
    jobs=[FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=None)]
)
PAGE_ADDRESS = "127.0.0.1:7233"
PAGE_EPISODE = "ep-0123456789abcdef"
PAGE_JOB = "job-0123456789ab"


def block(title: str) -> list[str]:
    """The commands of the page's `bash` block with this title, one per line."""
    found = re.findall(
        rf'```bash title="{re.escape(title)}"\n(.*?)```', OPERATIONS.read_text(), re.S
    )
    assert len(found) == 1, f"one block titled {title!r} in {OPERATIONS.name}"
    return [line for line in found[0].strip().splitlines() if line.strip()]


async def run_line(op: Operated, line: str, **ids: str) -> Done:
    """One command of the page, as an operator types it, on this deployment."""
    line = line.replace(PAGE_ADDRESS, op.address)
    line = line.replace(
        "posttrain-reaper/default/posttrain", f"posttrain-reaper/default/{op.task_queue}"
    )
    for placeholder, value in ids.items():
        line = line.replace(placeholder, value)
    words = shlex.split(line)
    assert words[:2] == ["uv", "run"], line
    if words[2] == "posttrain-env":
        return await op.cli(*words[3:])
    assert words[2] == "temporal", line
    args = words[3:]
    at = args.index("--address")
    del args[at : at + 2]  # op.temporal gives the address itself
    return await op.temporal(*args)


async def test_the_embedded_server_commands_list_and_describe_an_episode(tmp_path: Path) -> None:
    async with operated(tmp_path) as op:
        episode_id = (await op.reset()).episode_id
        listing, describing = block("the embedded server")

        async def listed() -> bool:
            done = await run_line(op, listing, **{PAGE_EPISODE: episode_id})
            assert done.status == 0, done.stderr
            return episode_workflow_id(episode_id) in done.stdout

        await eventually(listed, PROGRESS_S, "the running episode is listed", every_s=0.5)
        described = await run_line(op, describing, **{PAGE_EPISODE: episode_id})
        assert described.status == 0, described.stderr
        assert episode_workflow_id(episode_id) in described.stdout
        assert "PtTask" in described.stdout and "t_test" in described.stdout  # decoded


async def test_a_stuck_cancellation_is_asked_again_then_confirmed_as_the_page_says(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, NEVER_CONFIRMED) as op:
        episode_id, job_id, _ref = await start_job(op)
        assert (await op.cli("episodes", "end", episode_id, "--reason", "stuck")).status == 0
        ids = {PAGE_EPISODE: episode_id, PAGE_JOB: job_id}
        for line in block("a stuck cancellation"):
            done = await run_line(op, line, **ids)
            assert done.status == 0, (line, done.stderr)
        record = await audit_record(op, episode_id)
        assert [a["action"] for a in record["operator_actions"]] == [
            "end",
            "retry_cancel",
            "confirm_cancelled",
        ]
        assert record["jobs"][0]["settled_micro_usd"] == 3 * 167  # the page's --minutes 3
        s = await status(op, episode_id)
        assert s.service_spend.reserved.usd == 0 and s.service_spend.final


async def test_an_episode_is_stopped_now_as_the_page_says(tmp_path: Path) -> None:
    async with operated(tmp_path, LONG) as op:
        episode_id, _job_id, ref = await start_job(op)
        (line,) = block("an episode that must stop now")
        done = await run_line(op, line, **{PAGE_EPISODE: episode_id})
        assert done.status == 0, done.stderr
        record = await audit_record(op, episode_id)
        assert record["end"]["reason"] == "cancelled_by_operator"
        assert backend_state(op, ref) is JobState.cancelled


async def test_a_terminated_episode_holds_money_until_the_pages_trigger_winds_it_down(
    tmp_path: Path,
) -> None:
    # A period no test outlives: only the page's trigger runs the reconciler.
    async with operated(tmp_path, LONG, reaper_every_s=86_400) as op:
        episode_id, _job_id, ref = await start_job(op)
        workflow_id = episode_workflow_id(episode_id)
        done = await op.temporal(
            "workflow", "terminate", "--workflow-id", workflow_id, "--reason", "runbook test"
        )
        assert done.status == 0, done.stderr
        collector = VisibilityCollector(op.client, "fake")

        async def held() -> bool:
            return (await collector.read()).ended_holding == 1

        await eventually(
            held, PROGRESS_S, "the terminated episode counts as holding money", every_s=0.5
        )
        assert backend_state(op, ref) is JobState.running

        (line,) = block("a terminated workflow")

        async def triggered() -> bool:  # the worker creates the Schedule as it starts
            return (await run_line(op, line)).status == 0

        await eventually(
            triggered, PROGRESS_S, "the reconciler's Schedule is triggered", every_s=0.5
        )
        record = await audit_record(op, episode_id)
        assert [a["action"] for a in record["operator_actions"]] == ["wind_down"]
        assert backend_state(op, ref) is JobState.cancelled

        async def released() -> bool:
            if await workflow_status(op, workflow_id) != "COMPLETED":
                return False
            reading = await collector.read()
            return reading.ended_holding == 0 and reading.reserved_micro_usd == 0

        await eventually(
            released, PROGRESS_S, "no money is held once it is wound down", every_s=0.5
        )


async def read_until(stream: asyncio.StreamReader, start: str, timeout_s: float) -> str:
    """The first line `stream` prints that starts with `start` (every line before it dropped)."""
    async with asyncio.timeout(timeout_s):
        while True:
            line = (await stream.readline()).decode()
            assert line, f"the command ended before printing {start!r}"
            if line.startswith(start):
                return line


async def test_the_temporal_dev_server_runs_alone_and_is_started_again_when_it_dies(
    tmp_path: Path,
) -> None:
    """The production shape's Temporal (the page's line, on ports and a state dir of this
    test's): it registers our search attributes, a workflow started before a SIGKILL of the
    server is there after the command started it again, and SIGTERM stops it (exit 0)."""
    (line,) = block("the Temporal server")
    port, ui_port = free_ports(2, set())
    line = line.replace("/var/lib/posttrain/temporal", str(tmp_path / "temporal"))
    line = line.replace("--port 7233", f"--port {port}").replace("8233", str(ui_port))
    words = shlex.split(line)
    assert words[:3] == ["uv", "run", "posttrain-env"], line
    proc = await asyncio.create_subprocess_exec(
        *command(), *words[3:], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert proc.stdout is not None
    try:
        started = await read_until(proc.stdout, "started:", 120)
        assert f"127.0.0.1:{port}" in started and f"UI http://127.0.0.1:{ui_port}" in started
        client = await Client.connect(f"127.0.0.1:{port}")
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        assert {key.name for key in SEARCH_ATTRIBUTES} <= set(listed.custom_attributes)
        # No worker serves it: it stays open, in the database.
        await client.start_workflow("Waiting", id="survives", task_queue="nobody")

        pid = int(re.search(r"\(pid (\d+)\)", started)[1])  # type: ignore[index]
        os.kill(pid, signal.SIGKILL)
        died = await read_until(proc.stdout, "the server exited", 60)
        assert "status -9" in died
        again = await read_until(proc.stdout, "started again:", 120)
        assert f"(pid {pid})" not in again
        client = await Client.connect(f"127.0.0.1:{port}")
        described = await client.get_workflow_handle("survives").describe()
        assert described.status is WorkflowExecutionStatus.RUNNING
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        rest = (await proc.stdout.read()).decode()
        assert await proc.wait() == 0, rest
    assert rest.strip().endswith("stopped")
    assert not port_busy(port)
