"""Storage is part of the ledger (issue 30, tracked as 41): every agent job's artifact counts
against its episode's storage cap, is reserved before the job starts and settled at what it
kept, priced, reported in `service_spend` and on the job; outputs over a cap are refused whole,
typed, and can be neither evaluated nor submitted. On the fake backend (time skipping), both
ways a backend measures outputs: as the job ends (local) and afterwards, by the job's workflow
(`keep_outputs`, as on Hugging Face)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.settings import Settings
from posttrain_env.limits import (
    HF_ARTIFACT_CAP_BYTES,
    HF_EPISODE_STORAGE_BYTES,
    STORAGE_DAYS_WHEN_KEPT_FOREVER,
    STORAGE_USD_PER_TB_MONTH,
)
from tests.workflows.harness import running_worker
from workflows.episode.ledger import storage_cost_micro_usd

MB = 10**6
GIB = 1 << 30
# $25 per TB-month, kept 15 days: half a month.
PRICED = {"storage_usd_per_tb_month": 25.0, "job_retention_days": 15.0}


def outputs(marker: str, size: int, *, at_end: bool = True) -> FakeJobScript:
    return FakeJobScript(
        role=JobRole.agent,
        script_contains=marker,
        run_s=30,
        outputs={"model.safetensors": "w"},
        outputs_bytes=size,
        outputs_measured_at_end=at_end,
    )


def scenario(*rules: FakeJobScript) -> FakeScenario:
    return FakeScenario(jobs=[*rules, FakeJobScript(role=JobRole.grader, score=0.5, run_s=10)])


@pytest.mark.parametrize("at_end", [True, False], ids=["measured_at_end", "kept_afterwards"])
async def test_an_artifact_is_counted_charged_and_reported(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, at_end: bool
) -> None:
    rules = scenario(outputs("SMALL", 3 * MB, at_end=at_end))
    async with running_worker(
        time_skipping_env, tmp_path, rules, task_extra="storage_cap_bytes = 10000000", **PRICED
    ) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script="print('SMALL')\n")
        live = (await ep.call("jobs_status", job_id=job_id)).metadata["service_spend"]
        # Reserved: what the job may keep (the episode's 10 MB, below the 20 GiB artifact
        # cap) and that much storage's price, beside its 5 minutes of cpu-basic.
        assert live["storage"]["reserved_bytes"] == 10 * MB
        held = storage_cost_micro_usd(10 * MB, 25_000_000, 15.0)
        assert live["reserved"]["usd"] == pytest.approx((5 * 167 + held) / 1e6)
        done = await ep.wait_job(job_id)
        assert done.data["state"] == "succeeded" and done.data["stored_bytes"] == 3 * MB
        assert done.data.get("outputs_error") is None
        kept = storage_cost_micro_usd(3 * MB, 25_000_000, 15.0)
        assert done.data["cost_usd"] == pytest.approx((167 + kept) / 1e6)
        spend = done.metadata["service_spend"]
        assert spend["version"] == 2
        assert spend["storage"] == {
            "bytes": 3 * MB,
            "reserved_bytes": 0,
            "cap_bytes": 10 * MB,
            "usd": kept / 1e6,
        }
        assert spend["settled"]["usd"] == pytest.approx((167 + kept) / 1e6)
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.reward == 0.5


@pytest.mark.parametrize("at_end", [True, False], ids=["measured_at_end", "kept_afterwards"])
async def test_outputs_over_what_the_episode_may_keep_are_refused_typed_and_cannot_be_scored(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, at_end: bool
) -> None:
    rules = scenario(
        outputs("FIRST", 6 * MB, at_end=at_end), outputs("SECOND", 6 * MB, at_end=at_end)
    )
    async with running_worker(
        time_skipping_env, tmp_path, rules, task_extra="storage_cap_bytes = 10000000", **PRICED
    ) as h:
        ep = await h.episode()
        first = await ep.submit_job(script="print('FIRST')\n")
        assert (await ep.wait_job(first)).data["stored_bytes"] == 6 * MB
        second = await ep.submit_job(script="print('SECOND')\n")
        ended = await ep.wait_job(second)
        assert ended.data["state"] == "failed" and ended.data["stored_bytes"] == 0
        error = ended.data["outputs_error"]
        assert error["type"] == "limit_reached" and error["cap"] == "storage"
        assert error["cap_bytes"] == 10 * MB and error["over_by_bytes"] == 2 * MB
        assert "nothing was kept" in ended.data["message"]
        # Its storage costs nothing (it kept nothing): only its minute of cpu-basic.
        assert ended.data["cost_usd"] == pytest.approx(167 / 1e6)
        assert ended.metadata["service_spend"]["storage"]["bytes"] == 6 * MB
        for tool in ("dev_evaluate", "submit"):
            answer = await ep.call(tool, job_id=second)
            assert answer.data["error"]["type"] == "limit_reached", answer.data  # not not_ready
            assert answer.data["error"]["over_by_bytes"] == 2 * MB
            assert "outputs were not kept" in answer.data["error"]["message"]
            assert not answer.done


async def test_outputs_over_the_jobs_artifact_cap_name_that_cap(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    rules = scenario(outputs("BIG", 5 * MB, at_end=False))
    extra = "artifact_cap_bytes = 4000000\nstorage_cap_bytes = 100000000"
    async with running_worker(time_skipping_env, tmp_path, rules, task_extra=extra) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script="print('BIG')\n")
        ended = await ep.wait_job(job_id)
        error = ended.data["outputs_error"]
        assert (error["cap"], error["cap_bytes"], error["over_by_bytes"]) == (
            "artifact",
            4 * MB,
            MB,
        )
        # The hold was the job's artifact cap: never more than the job may keep.
        assert ended.metadata["service_spend"]["storage"]["bytes"] == 0


async def test_live_jobs_share_what_the_episode_may_still_keep(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    extra = "artifact_cap_bytes = 6000000\nstorage_cap_bytes = 10000000"
    rules = scenario(FakeJobScript(role=JobRole.agent, run_s=3600))
    async with running_worker(time_skipping_env, tmp_path, rules, task_extra=extra) as h:
        ep = await h.episode()
        await ep.submit_job(script="print('a')\n", timeout_minutes=50)
        await ep.submit_job(script="print('b')\n", timeout_minutes=50)
        spend = (await ep.call("jobs_status")).metadata["service_spend"]
        # The first may keep its 6 MB cap, the second only the 4 MB left.
        assert spend["storage"]["reserved_bytes"] == 10 * MB


async def test_an_episode_with_nothing_valid_to_submit_ends_at_its_time_limit_with_reward_0(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    rules = scenario(outputs("BIG", 50 * MB))
    extra = "storage_cap_bytes = 10000000"
    async with running_worker(time_skipping_env, tmp_path, rules, task_extra=extra) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script="print('BIG')\n")
        assert (await ep.wait_job(job_id)).data["outputs_error"]["type"] == "limit_reached"
        await ep.skip(timedelta(hours=2, minutes=5))
        status = await ep.status()
        assert status.done and status.end is not None
        assert status.end.reason == "time_limit" and status.end.reward == 0.0  # never None


async def test_a_task_without_caps_of_its_own_gets_its_backends_defaults(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The defaults (posttrain_env/limits.py, docs/tasks.md): the fake stands in for Hugging
    Face, so an episode may keep 100 GiB and one artifact 20 GiB, charged for the job
    retention's 14 days at $25 per TB-month; kept forever, for a year."""
    rules = scenario(outputs("SMALL", 3 * MB))
    async with running_worker(
        time_skipping_env, tmp_path, rules, storage_usd_per_tb_month=25.0
    ) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script="print('SMALL')\n")
        live = (await ep.call("jobs_status", job_id=job_id)).metadata["service_spend"]
        assert live["storage"]["cap_bytes"] == HF_EPISODE_STORAGE_BYTES == 100 * GIB
        assert live["storage"]["reserved_bytes"] == HF_ARTIFACT_CAP_BYTES == 20 * GIB
        held = storage_cost_micro_usd(HF_ARTIFACT_CAP_BYTES, 25_000_000, 14.0)
        assert live["reserved"]["usd"] == pytest.approx((5 * 167 + held) / 1e6)
    forever = Settings(job_retention_days=0, submitted_retention_days=0)
    assert forever.storage_billed_days == STORAGE_DAYS_WHEN_KEPT_FOREVER
    assert STORAGE_DAYS_WHEN_KEPT_FOREVER == 365
    assert Settings().storage_usd_per_tb_month == STORAGE_USD_PER_TB_MONTH == 25.0
