"""Episodes on the replay backend, through the real workflows on the time-skipping test server:
an episode recorded on the fake backend, its store built from its audit record, and the same
episode replayed (rewards, flags and spends against the recorded ones); the budget and step
rules on replay; an unseen script answered `not_recorded` to the agent; fall-through charged as
usual."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from activities.backends.interface import JobsBackend
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.from_audit import build_store
from activities.backends.replay.store import ReplayStore
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.worker import build_worker
from tests.workflows.harness import Episode, Harness, write_task

CPU_PRICE = 167  # micro-USD per minute of cpu-basic in the fake's prices
SCRIPT = "print('train')\n"
RECORDED = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=5, run_s=125, logs=["trained"]),
        FakeJobScript(role=JobRole.dev, queue_s=2, run_s=61, score=0.375),
        FakeJobScript(role=JobRole.grader, queue_s=2, run_s=30, score=0.625),
    ]
)


@asynccontextmanager
async def worker_on(
    env: WorkflowEnvironment, tmp_path: Path, name: str, backend: JobsBackend
) -> AsyncIterator[Harness]:
    """A worker whose jobs backend is `backend` (tests/workflows/harness.py's, for any backend);
    each its own state dir and task queue, one tasks folder for all."""
    # Storage is free here unless a test prices it (tests/workflows/test_storage.py).
    config = Settings(state_dir=tmp_path / name, backend=backend.name, storage_usd_per_tb_month=0.0)
    key = ServerKey.load_or_create(config.server_key_path)
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    worker = build_worker(
        env.client,
        config,
        backend,
        key=key,
        task_queue=queue,
        tasks_dir=tmp_path / "tasks",
        watch_interval_s=30.0,
    )
    harness = Harness(env, env.client, queue, cast(FakeBackend, backend), config)
    async with worker:
        try:
            yield harness
        finally:
            await harness.terminate_all()


async def play(ep: Episode, grading: timedelta = timedelta(minutes=5)) -> dict[str, Any]:
    """One job, a dev evaluation and the submission (its grading given at most `grading` of
    workflow time): what the agent saw at each."""
    job_id = await ep.submit_job(script=SCRIPT, timeout_minutes=10)
    done = await ep.wait_job(job_id, step=timedelta(seconds=31))
    dev = await ep.call_over(timedelta(minutes=5), "dev_evaluate", job_id=job_id)
    final = await ep.call_over(grading, "submit", job_id=job_id)
    await ep.handle.result()
    return {"job": done.data, "dev": dev.data, "final": final}


def audit_of(h: Harness, episode_id: str) -> dict[str, Any]:
    return json.loads((h.settings.state_dir / "audit" / f"{episode_id}.json").read_text())


async def recorded_on_the_fake(
    env: WorkflowEnvironment,
    tmp_path: Path,
    scenario: FakeScenario = RECORDED,
    grading: timedelta = timedelta(minutes=5),
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """One episode played on the fake backend: what the agent saw, its audit record, and the
    audit folder that holds it."""
    write_task(tmp_path / "tasks")
    fake = FakeBackend(tmp_path / "fake", scenario)
    async with worker_on(env, tmp_path, "recorded", fake) as h:
        ep = await h.episode()
        recorded = await play(ep, grading)
        return recorded, audit_of(h, ep.episode_id), h.settings.state_dir / "audit"


async def test_an_episode_recorded_on_the_fake_replays_with_its_rewards_and_spends_flagged(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    recorded, recorded_audit, audit_dir = await recorded_on_the_fake(time_skipping_env, tmp_path)
    assert recorded["final"].reward == 0.625
    assert "replayed" not in recorded["final"].metadata["episode_end"]
    assert "replayed" not in recorded["final"].metadata["service_spend"]

    store = ReplayStore(tmp_path / "store")
    report = build_store(audit_dir, tmp_path / "tasks", store)
    assert (report.episodes, report.recorded, report.skipped) == (1, 3, {})

    # The replay's underlying fake would answer otherwise (score 0.5, 60 s): it is never asked.
    inner = FakeBackend(tmp_path / "inner")
    replay = ReplayBackend(tmp_path / "replay", store, inner, time_scale=0.5)
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep = await h.episode()
        replayed = await play(ep)
        replayed_audit = audit_of(h, ep.episode_id)
    assert inner.requests() == []

    final = replayed["final"]
    assert final.done and final.reward == recorded["final"].reward == 0.625
    assert final.metadata["episode_end"] == {
        "reason": "submitted",
        "reward": 0.625,
        "replayed": True,
    }
    assert replayed["dev"]["score"] == recorded["dev"]["score"] == 0.375
    for field in ("state", "running_s", "cost_usd"):
        assert replayed["job"][field] == recorded["job"][field], field
    # The agent's own view of the job says it never ran.
    assert replayed["job"]["replayed"] is True
    assert recorded["job"].get("replayed") is None
    spend = final.metadata["service_spend"]
    was = recorded["final"].metadata["service_spend"]
    assert spend["settled"] == was["settled"]
    # 125 s of the agent's job (3 minutes) and 61 s of the dev evaluation (2), as recorded.
    assert spend["settled"]["usd"] == 5 * CPU_PRICE / 1e6
    assert spend["replayed"] == {"usd": 5 * CPU_PRICE / 1e6, "jobs": 1, "calls": 1}

    assert replayed_audit["end"] == {
        "reason": "submitted",
        "reward": 0.625,
        "invalid_score": None,
        "replayed": True,
        "replay_miss": None,
        "replay_misses": None,
    }
    assert all(job["replayed"] is True for job in replayed_audit["jobs"])
    assert replayed_audit["final_spend_micro_usd"] == recorded_audit["final_spend_micro_usd"]
    assert recorded_audit["end"]["replayed"] is None


async def test_budget_and_step_rules_hold_on_replay_and_an_unseen_script_is_not_recorded(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # 12 minutes of cpu-basic: the recorded job (3 minutes) leaves 9; 4 steps.
    write_task(tmp_path / "tasks", budget_usd=12 * CPU_PRICE / 1e6, max_steps=4)
    fake = FakeBackend(tmp_path / "fake", RECORDED)
    async with worker_on(time_skipping_env, tmp_path, "recorded", fake) as h:
        ep = await h.episode()
        job_id = await ep.submit_job(script=SCRIPT, timeout_minutes=10)
        await ep.skip(timedelta(minutes=4))
        await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        await ep.handle.result()
    store = ReplayStore(tmp_path / "store")
    assert build_store(h.settings.state_dir / "audit", tmp_path / "tasks", store).recorded == 2

    replay = ReplayBackend(tmp_path / "replay", store, FakeBackend(tmp_path / "inner"))
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep = await h.episode()
        unseen = await ep.call(
            "jobs_submit", script="print('never run')\n", flavor="cpu-basic", timeout_minutes=1
        )
        error = unseen.data["error"]
        assert error["type"] == "not_recorded"
        assert error["nearest"][0]["differs"] == ["script_sha256"]
        assert unseen.metadata["service_spend"]["reserved"]["usd"] == 0.0  # released
        job_id = await ep.submit_job(script=SCRIPT, timeout_minutes=10)
        await ep.skip(timedelta(minutes=4))  # the watcher tells the episode of the end
        done = await ep.call("jobs_status", job_id=job_id)
        assert done.data["state"] == "succeeded" and done.data["cost_usd"] == 3 * CPU_PRICE / 1e6
        # The replayed charge counts against the budget: 9 minutes are left, not 10; and this
        # fourth call is the last step: the episode ends with reward 0, flagged replayed.
        over = await ep.call("jobs_submit", script=SCRIPT, flavor="cpu-basic", timeout_minutes=10)
        assert over.data["error"]["type"] == "budget_exhausted"
        assert over.data["error"]["remaining_usd"] == 9 * CPU_PRICE / 1e6
        assert over.done and over.metadata["episode_end"] == {
            "reason": "max_steps",
            "reward": 0.0,
            "replayed": True,
            "replay_misses": 1,  # the unseen script: the trainer is told its reward is no test
        }
        assert over.metadata["service_spend"]["replayed"]["jobs"] == 1


async def test_fall_through_charges_the_real_run_and_records_it_for_next_time(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    write_task(tmp_path / "tasks")
    store = ReplayStore(tmp_path / "store")
    inner = FakeBackend(tmp_path / "fake", RECORDED)
    replay = ReplayBackend(tmp_path / "replay", store, inner, fall_through=True)
    async with worker_on(time_skipping_env, tmp_path, "first", replay) as h:
        first = await play(await h.episode())
    assert len(inner.requests()) == 3  # the job and both evaluations ran on the fake
    assert first["final"].reward == 0.625
    assert "replayed" not in first["final"].metadata["episode_end"]
    assert "replayed" not in first["final"].metadata["service_spend"]
    assert len(store.keys()) == 3

    again = ReplayBackend(tmp_path / "replay2", store, inner, fall_through=True)
    async with worker_on(time_skipping_env, tmp_path, "second", again) as h:
        second = await play(await h.episode())
    assert len(inner.requests()) == 3  # nothing more ran
    assert second["final"].reward == 0.625
    assert second["final"].metadata["episode_end"]["replayed"] is True
    spend = second["final"].metadata["service_spend"]
    assert spend["settled"] == first["final"].metadata["service_spend"]["settled"]
    assert spend["replayed"]["usd"] == spend["settled"]["usd"]


GRADER_TIMES_OUT = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=5, run_s=125, logs=["trained"]),
        FakeJobScript(role=JobRole.dev, queue_s=2, run_s=61, score=0.375),
        # Past the task's score_timeout_s (600 s): the grader times out, the episode is unscored.
        FakeJobScript(role=JobRole.grader, queue_s=2, run_s=900, score=0.625),
    ]
)


async def test_a_grader_that_timed_out_is_recorded_and_replays_unscored_as_it_was(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    recorded, recorded_audit, audit_dir = await recorded_on_the_fake(
        time_skipping_env, tmp_path, GRADER_TIMES_OUT, grading=timedelta(minutes=15)
    )
    assert recorded["final"].metadata["episode_end"] == {"reason": "score_failed", "reward": None}

    store = ReplayStore(tmp_path / "store")
    report = build_store(audit_dir, tmp_path / "tasks", store)
    # The grader that timed out is recorded too (it was skipped, and its replay then missed).
    assert (report.recorded, report.skipped, report.not_recorded) == (3, {}, [])

    inner = FakeBackend(tmp_path / "inner")
    replay = ReplayBackend(tmp_path / "replay", store, inner, time_scale=0.5)
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep = await h.episode()
        replayed = await play(ep, grading=timedelta(minutes=15))
        replayed_audit = audit_of(h, ep.episode_id)
    assert inner.requests() == []  # every job, the grader's included, was replayed
    final = replayed["final"]
    assert final.done and final.reward is None
    assert final.metadata["episode_end"] == {
        "reason": "score_failed",
        "reward": None,
        "replayed": True,
    }
    assert replayed["dev"]["score"] == recorded["dev"]["score"] == 0.375
    assert (
        final.metadata["service_spend"]["settled"]
        == (recorded["final"].metadata["service_spend"]["settled"])
    )
    grader = next(j for j in replayed_audit["jobs"] if j["role"] == "grader")
    assert grader["final_state"] == "timed_out" and grader["replayed"] is True
    assert replayed_audit["final_spend_micro_usd"] == recorded_audit["final_spend_micro_usd"]


async def replay_with_a_drifted_evaluator(
    env: WorkflowEnvironment, tmp_path: Path
) -> tuple[ReplayStore, ReplayBackend]:
    """A store recorded from one whole episode, then the task's evaluator changed: every
    evaluation's key differs from the recorded ones."""
    _, _, audit_dir = await recorded_on_the_fake(env, tmp_path)
    store = ReplayStore(tmp_path / "store")
    assert build_store(audit_dir, tmp_path / "tasks", store).recorded == 3
    (tmp_path / "tasks" / "t_test" / "evaluator.py").write_text("print('a newer evaluator')\n")
    return store, ReplayBackend(tmp_path / "replay", store, FakeBackend(tmp_path / "inner"))


async def a_replayed_job(h: Harness) -> tuple[Episode, str]:
    """A new episode whose recorded job has been replayed to its end."""
    ep = await h.episode()
    job_id = await ep.submit_job(script=SCRIPT, timeout_minutes=10)
    await ep.wait_job(job_id, step=timedelta(seconds=31))
    return ep, job_id


def assert_missed(end: dict[str, Any], tool: str, store: ReplayStore) -> None:
    assert end["reason"] == "replay_miss" and end["reward"] is None
    miss = end["replay_miss"]
    assert miss["tool"] == tool and miss["key"] not in store.keys()
    assert len(miss["key"]) == 64
    # The nearest recorded evaluation of the same role differs in its evaluator script only.
    assert miss["nearest"][0]["differs"] == ["script_sha256"]
    assert miss["nearest"][0]["key"] in store.keys()
    assert end["replay_misses"] == 1


async def test_a_replayed_submit_whose_grading_was_not_recorded_ends_replay_miss_not_score_failed(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    store, replay = await replay_with_a_drifted_evaluator(time_skipping_env, tmp_path)
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep, job_id = await a_replayed_job(h)
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        await ep.handle.result()
        audit = audit_of(h, ep.episode_id)
    assert final.done and final.reward is None and final.data["score"] is None
    end = final.metadata["episode_end"]
    assert_missed(end, "submit", store)
    assert end["replayed"] is True  # the agent's job was replayed
    assert audit["end"]["reason"] == "replay_miss"
    assert audit["end"]["replay_miss"]["key"] == end["replay_miss"]["key"]


async def test_a_replayed_dev_evaluation_that_was_not_recorded_ends_the_episode_replay_miss(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    store, replay = await replay_with_a_drifted_evaluator(time_skipping_env, tmp_path)
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep, job_id = await a_replayed_job(h)
        dev = await ep.call("dev_evaluate", job_id=job_id)
        await ep.handle.result()
        after = await ep.call("jobs_status", job_id=job_id)
    assert dev.data["error"]["type"] == "not_recorded"
    assert dev.done and dev.reward is None
    assert_missed(dev.metadata["episode_end"], "dev_evaluate", store)
    # Nothing more is played against a stand-in that could not stand in.
    assert after.data["error"]["type"] == "episode_over"


async def child_starts(ep: Episode) -> int:
    """How many job workflows the episode's history started."""
    events = [e async for e in ep.handle.fetch_history_events()]
    return sum(
        e.HasField("start_child_workflow_execution_initiated_event_attributes") for e in events
    )


async def test_replayed_jobs_have_no_workflow_and_a_cancel_cuts_the_known_run(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A replayed job's whole run is known at its start: the episode keeps it in its table with
    no job workflow and no watcher (issue 43: a third of the server's work per rollout), and
    follows it on time by itself: queued, running, then as recorded; a cancel cuts it there,
    charged for the share it ran, as the backend's own view of a cancelled replay is."""
    recorded, _audit, audit_dir = await recorded_on_the_fake(time_skipping_env, tmp_path)
    store = ReplayStore(tmp_path / "store")
    build_store(audit_dir, tmp_path / "tasks", store)
    inner = FakeBackend(tmp_path / "inner")
    replay = ReplayBackend(tmp_path / "replay", store, inner)  # recorded times: 5 s queued
    async with worker_on(time_skipping_env, tmp_path, "replayed", replay) as h:
        ep = await h.episode()
        replayed = await play(ep)
        assert replayed["final"].reward == recorded["final"].reward == 0.625
        assert replayed["dev"]["score"] == 0.375
        assert await child_starts(ep) == 0  # the job, its dev evaluation, its grader: none

        cut = await h.episode()
        # A script that does not parse: refused before any job exists, by the start itself (no
        # check activity of its own: pt-known-runs-2), as jobs_submit's check refuses it.
        broken = await cut.call(
            "jobs_submit", script="def broken(:\n", flavor="cpu-basic", timeout_minutes=10
        )
        assert broken.data["error"]["type"] == "invalid_script", broken.data
        assert (await cut.call("jobs_status")).data["jobs"] == []
        assert (await cut.status()).service_spend.reserved.usd == 0
        job_id = await cut.submit_job(script=SCRIPT, timeout_minutes=10)
        assert (await cut.call("jobs_status", job_id=job_id)).data["state"] == "queued"
        running = await cut.call_over(timedelta(seconds=30), "jobs_wait", job_id=job_id)
        assert running.data["state"] == "running" and running.data["changed"] is True
        await cut.skip(timedelta(seconds=60))
        cancelled = await cut.call("jobs_cancel", job_id=job_id)
        assert cancelled.data["state"] == "cancelled"  # at once: nothing to wait for
        # Charged for what it ran until the cancel (a minute and more of its 125 s), not all.
        assert 60 <= cancelled.data["running_s"] < 120
        assert await child_starts(cut) == 0
    assert inner.requests() == []
