"""The session's and the server-wide account's continue-as-new carries bounded by size (issue
27), each filled to its cap and measured as the data converter encodes it against
CARRY_BUDGET_BYTES, and what happens at each cap (the campaign's and the rollout's are in
tests/campaigns/test_carry_bounds.py, the episode's in tests/test_limits.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pydantic_core
import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import posttrain_env.limits
from posttrain_common.contracts.episodes import EpisodeSetup, FlavorLimits, JobLimits
from posttrain_env.limits import CARRY_BUDGET_BYTES, MAX_TASK_SPEC_BYTES, MAX_TRACKED_EPISODES
from posttrain_env.models import FlavorPrice
from posttrain_server.worker import workflow_runner
from tasks.registry import TaskSpecError, load_task
from tests.workflows.harness import write_task
from tests.workflows.largest import largest_setup
from workflows.episode.session import SessionState
from workflows.operations.account import AccountState, AccountWorkflow, Admission


def encoded(value: object) -> int:
    return len(pydantic_core.to_json(value))


def test_the_accounts_carry_at_its_cap_stays_within_the_budget() -> None:
    state = AccountState(live={f"ep-{n:016x}": 2**63 - 1 for n in range(MAX_TRACKED_EPISODES)})
    size = encoded(state)
    print(f"account continue-as-new input at its cap: {size} bytes")
    assert size <= CARRY_BUDGET_BYTES


async def test_the_account_refuses_an_episode_past_its_cap_even_with_no_count_set(
    time_skipping_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real cap (10,000 episodes) is measured above; 3 shows the rule at work.
    monkeypatch.setattr(posttrain_env.limits, "MAX_TRACKED_EPISODES", 3)
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    client = time_skipping_env.client
    async with Worker(
        client, task_queue=queue, workflows=[AccountWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            AccountWorkflow.run, AccountState(), id=f"account-{queue}", task_queue=queue
        )
        for n in range(3):
            await handle.execute_update(AccountWorkflow.admit, Admission(episode_id=f"ep-{n}"))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AccountWorkflow.admit, Admission(episode_id="ep-3"))
        assert "maximum of 3 live episodes" in str(refused.value.cause)
        # One already admitted is admitted again, and one that ended makes room.
        await handle.execute_update(AccountWorkflow.admit, Admission(episode_id="ep-0"))
        await handle.signal(AccountWorkflow.retire, "ep-0")
        await handle.execute_update(AccountWorkflow.admit, Admission(episode_id="ep-3"))
        assert sorted(await handle.query(AccountWorkflow.live)) == ["ep-1", "ep-2", "ep-3"]
        await handle.terminate("test over")


def largest_allowed_setup(tmp_path: Path) -> EpisodeSetup:
    """The setup of a task as large as a task may be, with every flavor priced and limited."""
    write_task(tmp_path, "t_big")
    base = load_task("t_big", tmp_path)
    room = MAX_TASK_SPEC_BYTES - len(base.model_dump_json().encode())
    path = tmp_path / "t_big" / "task.toml"
    text = path.read_text()
    padded = text.replace(
        'prompt = "Write a checkpoint to /data/outputs."',
        f'prompt = "Write a checkpoint to /data/outputs.{"x" * room}"',
    )
    path.write_text(padded)
    task = load_task("t_big", tmp_path)
    assert len(task.model_dump_json().encode()) == MAX_TASK_SPEC_BYTES
    setup = largest_setup()
    limits = FlavorLimits(
        vcpus=64, memory_bytes=2**40, processes=2**20, disk_bytes=2**50, files=2**40
    )
    return setup.model_copy(
        update={
            "task": task,
            "prices": {f: FlavorPrice(name=f, micro_usd_per_minute=10**12) for f in task.flavors},
            "job_limits": JobLimits(flavors={f: limits for f in task.flavors}),
            "session_workflow_id": "session-" + "s" * 64,
        }
    )


def test_the_sessions_carry_with_the_largest_task_stays_within_the_budget(
    tmp_path: Path,
) -> None:
    state = SessionState(current=largest_allowed_setup(tmp_path), closed=True)
    size = encoded(state)
    print(f"session continue-as-new input with the largest task: {size} bytes")
    assert size <= CARRY_BUDGET_BYTES


def test_a_task_larger_than_a_task_may_be_is_refused_where_it_is_loaded(tmp_path: Path) -> None:
    write_task(tmp_path, "t_huge")
    path = tmp_path / "t_huge" / "task.toml"
    path.write_text(
        path.read_text().replace('prompt = "Write', f'prompt = "{"x" * MAX_TASK_SPEC_BYTES} Write')
    )
    with pytest.raises(TaskSpecError, match=f"at most {MAX_TASK_SPEC_BYTES}"):
        load_task("t_huge", tmp_path)
