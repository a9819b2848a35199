"""The agent task queue can be paced: `posttrain-env agent-worker --turns-per-second N` (or
`POSTTRAIN_AGENT_TURNS_PER_SECOND`) has the Temporal server start at most about N turns a second
on the queue, whichever agent worker polls, so a campaign of many rollouts cannot offer the
server more work than it sustains (docs/deployment.md#capacity). Bad values are refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from posttrain_common.contracts.campaigns import CheckAgents
from posttrain_common.settings import Settings
from posttrain_server.agent_worker import build_agent_worker
from posttrain_server.temporal.client import core_runtime
from tests.campaigns.harness import agent_env
from tests.conftest import binary
from tests.startup import DEV_SERVER_STARTUP

REPO = Path(__file__).resolve().parents[2]
ACTIVITIES = 8


@workflow.defn(sandboxed=False)
class ChecksAtOnce:
    """Schedules `count` agent-queue activities at once (a check of no agent: nothing to run)."""

    @workflow.run
    async def run(self, queue: str, count: int) -> None:
        await asyncio.gather(
            *(
                workflow.execute_activity(
                    "check_agents",
                    CheckAgents(agents=[]),
                    task_queue=queue,
                    start_to_close_timeout=timedelta(seconds=60),
                )
                for _ in range(count)
            )
        )


async def started_span_s(tmp_path: Path, turns_per_second: float | None) -> float:
    """Seconds from the first of the activities' starts to the last, on the dev server."""
    env = await WorkflowEnvironment.start_local(
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        runtime=core_runtime(),
        dev_server_log_level="error",
    )
    try:
        settings = Settings(state_dir=tmp_path / "state", agent_turns_per_second=turns_per_second)
        queue, agent_queue = f"q-{uuid.uuid4().hex[:8]}", f"agents-{uuid.uuid4().hex[:8]}"
        agents = build_agent_worker(env.client, settings, agent_env(), task_queue=agent_queue)
        host = Worker(env.client, task_queue=queue, workflows=[ChecksAtOnce])
        async with agents, host:
            handle = await env.client.start_workflow(
                ChecksAtOnce.run, args=[agent_queue, ACTIVITIES], id=queue, task_queue=queue
            )
            await handle.result()
            starts = [
                event.event_time.ToDatetime()
                async for event in handle.fetch_history_events()
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            ]
        assert len(starts) == ACTIVITIES
        return (max(starts) - min(starts)).total_seconds()
    finally:
        await env.shutdown()


async def test_a_paced_agent_queue_starts_its_turns_no_faster_than_the_pace(
    tmp_path: Path,
) -> None:
    # 8 at 2 a second: the server lets a burst of about one second's worth through at once,
    # the rest a second apart at least (a loaded machine only spreads them further).
    paced = await started_span_s(tmp_path / "paced", 2.0)
    assert paced >= 2.0, paced
    # Unpaced, the same 8 start together (the worker runs 16 at once): the pace made the gap.
    unpaced = await started_span_s(tmp_path / "unpaced", None)
    assert unpaced < paced, (unpaced, paced)


def test_the_pace_and_the_slots_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.agent_turns_per_second is None and settings.agent_turns_at_once == 16
    monkeypatch.setenv("POSTTRAIN_AGENT_TURNS_PER_SECOND", "2.5")
    monkeypatch.setenv("POSTTRAIN_AGENT_TURNS_AT_ONCE", "4")
    settings = Settings()
    assert settings.agent_turns_per_second == 2.5 and settings.agent_turns_at_once == 4


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_a_pace_that_is_not_a_positive_number_is_refused(rate: float) -> None:
    with pytest.raises(ValidationError, match="agent_turns_per_second"):
        Settings(agent_turns_per_second=rate)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--turns-per-second", "0"], "agent_turns_per_second"),
        (["--turns-per-second", "fast"], "invalid float value"),
        (["--turns-at-once", "0"], "agent_turns_at_once"),
    ],
)
def test_the_agent_worker_refuses_a_bad_pace_or_slot_count_before_it_connects(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "POSTTRAIN_STATE_DIR": str(tmp_path / "state"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # it must refuse before it connects anywhere
    }
    done = subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", "agent-worker", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2, done
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_turns_at_once_are_bounded_on_both_sides() -> None:
    assert Settings(agent_turns_at_once=1).agent_turns_at_once == 1
    assert Settings(agent_turns_at_once=1024).agent_turns_at_once == 1024
    for bad in (0, 1025):
        with pytest.raises(ValidationError, match="agent_turns_at_once"):
            Settings(agent_turns_at_once=bad)
