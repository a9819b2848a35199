"""The replay backend without Temporal: its key, `not_recorded` with the nearest keys, the
fall-through that records and the replay of what it recorded, the time scale, timeouts, and the
bounds of a recording (activities/backends/replay/)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from activities.backends.interface import JobRequest
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.recording import (
    MAX_RECORDED_LINE_BYTES,
    MAX_RECORDED_LINES,
    MAX_RECORDING_BYTES,
    JobInputs,
    Recording,
    RecordingTooLarge,
    bounded_log,
    fit,
    sha256_text,
)
from activities.backends.replay.store import ReplayStore
from job_launcher.trusted_lines import NONCE_ENV, read_score
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import JobState

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
MODEL = RepoRef(repo_id="org/base", revision="a" * 40)
TRAIN = "print('training')\nfor step in range(3):\n    print('step', step)\n"


def request(role: JobRole = JobRole.agent, now: datetime = T0, **fields: Any) -> JobRequest:
    values: dict[str, Any] = {
        "role": role,
        "episode_id": "ep-" + secrets.token_hex(4),
        "task_id": "t_test",
        "job_id": "job-" + secrets.token_hex(4),
        "flavor": "cpu-basic",
        "timeout_s": 3600,
        "script": TRAIN if role is JobRole.agent else "print('the evaluator')\n",
        "base_model": MODEL,
        "key": "episode-x/job/" + secrets.token_hex(6),
        "env": {NONCE_ENV: secrets.token_hex(16)},
        "now": now,
    }
    values.update(fields)
    return JobRequest(**values)


def inputs(**fields: Any) -> JobInputs:
    values: dict[str, Any] = {
        "role": JobRole.agent,
        "task_id": "t_test",
        "script_sha256": sha256_text(TRAIN),
        "flavor": "cpu-basic",
        "base_model": MODEL,
    }
    values.update(fields)
    return JobInputs(**values)


def recording(job: JobInputs, script: str = TRAIN, **fields: Any) -> Recording:
    values: dict[str, Any] = {
        "key": job.key(),
        "inputs": job,
        "script": script,
        "state": "succeeded",
        "queue_s": 4,
        "running_s": 600,
        "timeout_s": 3600,
        "lines": ["recorded line"],
        "source": "test",
        "recorded_at": T0,
    }
    values.update(fields)
    return Recording(**values)


async def until_end(backend: ReplayBackend, ref: str, start: datetime) -> BackendJob:
    now = start
    for _ in range(2000):
        job = (await backend.observe([ref], now))[ref]
        if job.state.terminal:
            return job
        now += timedelta(seconds=5)
    raise AssertionError(f"{ref} did not end")


# -- the key -----------------------------------------------------------------------------------


def test_the_key_is_a_hash_of_what_decides_the_outcome_and_nothing_else() -> None:
    base = inputs(
        dependencies=["numpy>=2", "torch"], datasets=[RepoRef(repo_id="d/x", revision="1")]
    )
    same = inputs(
        dependencies=["torch", "numpy>=2"], datasets=[RepoRef(repo_id="d/x", revision="1")]
    )
    assert base.key() == same.key() and len(base.key()) == 64
    changed = [
        {"script_sha256": sha256_text(TRAIN + "\n")},
        {"dependencies": ["numpy>=2"]},
        {"flavor": "t4-small"},
        {"datasets": [RepoRef(repo_id="d/x", revision="2")]},
        {"base_model": RepoRef(repo_id="org/base", revision="b" * 40)},
        {"task_id": "t_other"},
        {"role": JobRole.dev},
        {"evaluated": "e" * 64},
        {"task_params": '{"n": 1}'},
    ]
    keys = {base.key()}
    for change in changed:
        update = {"dependencies": ["numpy>=2", "torch"], "datasets": base.datasets, **change}
        keys.add(inputs(**update).key())
    assert len(keys) == len(changed) + 1  # each input changes the key


# -- not recorded --------------------------------------------------------------------------------


async def test_an_unseen_script_is_refused_as_not_recorded_naming_the_nearest_keys(
    tmp_path: Path,
) -> None:
    store = ReplayStore(tmp_path / "store")
    close = TRAIN.replace("range(3)", "range(4)")
    far = "import os\nprint(os.listdir('/'))\n"
    for script in (close, far):
        store.put(recording(inputs(script_sha256=sha256_text(script)), script=script))
    on_t4 = inputs(flavor="t4-small")
    store.put(recording(on_t4))
    inner = FakeBackend(tmp_path / "fake")
    backend = ReplayBackend(tmp_path / "replay", store, inner)

    asked = request()
    with pytest.raises(ToolError) as refused:
        await backend.submit(asked)
    err = refused.value
    assert err.type is ErrorType.not_recorded
    assert err.details["key"] == inputs().key()
    nearest = err.details["nearest"]
    # The same script on another flavor first, then the script one line away, then the other.
    assert [n["key"] for n in nearest] == [
        on_t4.key(),
        inputs(script_sha256=sha256_text(close)).key(),
        inputs(script_sha256=sha256_text(far)).key(),
    ]
    assert nearest[0] == {"key": on_t4.key(), "similarity": 1.0, "differs": ["flavor"]}
    assert nearest[1]["differs"] == ["script_sha256"] and 0.5 < nearest[1]["similarity"] < 1
    assert nearest[2]["similarity"] < nearest[1]["similarity"]
    assert "differs in flavor" in err.message
    # Nothing started: not here, not on the underlying backend.
    assert await backend.find_by_key(asked.key, T0) is None
    assert inner.requests() == []


async def test_an_empty_store_refuses_with_no_nearest_key(tmp_path: Path) -> None:
    backend = ReplayBackend(
        tmp_path / "replay", ReplayStore(tmp_path / "store"), FakeBackend(tmp_path / "fake")
    )
    with pytest.raises(ToolError) as refused:
        await backend.submit(request())
    assert refused.value.type is ErrorType.not_recorded
    assert refused.value.details["nearest"] == []


# -- fall-through: record, then replay ------------------------------------------------------------


SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=3, run_s=61, logs=["epoch 1", "epoch 2"]),
        FakeJobScript(role=JobRole.dev, queue_s=2, run_s=20, score=0.4),
        FakeJobScript(role=JobRole.grader, queue_s=2, run_s=30, score=0.8),
    ]
)


async def test_fall_through_runs_unseen_jobs_records_them_and_then_replays_them(
    tmp_path: Path,
) -> None:
    store = ReplayStore(tmp_path / "store")
    inner = FakeBackend(tmp_path / "fake", SCENARIO)
    recorder = ReplayBackend(tmp_path / "rec", store, inner, fall_through=True)

    agent = await recorder.submit(request())
    assert not agent.replayed and len(inner.requests()) == 1
    ran = await until_end(recorder, agent.ref, T0)
    assert ran.state is JobState.succeeded and ran.running_s == 61 and not ran.replayed
    scores: dict[JobRole, float] = {}
    for role in (JobRole.dev, JobRole.grader):
        asked = request(role, artifact_ref=agent.ref)
        evaluation = await recorder.submit(asked)
        await until_end(recorder, evaluation.ref, T0)
        lines = await recorder.logs(evaluation.ref, 10_000, T0 + timedelta(hours=1))
        scores[role] = read_score(lines, asked.env[NONCE_ENV]).score
    assert scores == {JobRole.dev: 0.4, JobRole.grader: 0.8}
    assert len(store.keys()) == 3  # the agent job and both evaluations

    # A replay over the same store, whose underlying backend would answer differently (the
    # fake's defaults: score 0.5, 60 s), and is never asked.
    other = FakeBackend(tmp_path / "fake2")
    replay = ReplayBackend(tmp_path / "replay", store, other)
    later = T0 + timedelta(days=1)
    again = await replay.submit(request(now=later))
    assert again.replayed and again.state is JobState.queued
    replayed = await until_end(replay, again.ref, later)
    assert replayed.replayed and replayed.state is JobState.succeeded
    assert replayed.running_s == 61  # charged as the recorded run was
    assert (replayed.started_at - replayed.created_at).total_seconds() == 3  # type: ignore[operator]
    assert "epoch 2" in await replay.logs(again.ref, 100, later + timedelta(hours=1))
    for role, score in scores.items():
        asked = request(role, now=later, artifact_ref=again.ref)
        evaluation = await replay.submit(asked)
        assert evaluation.replayed
        await until_end(replay, evaluation.ref, later)
        lines = await replay.logs(evaluation.ref, 10_000, later + timedelta(hours=1))
        # The recorded score line, trusted under this job's own nonce (and no other).
        assert read_score(lines, asked.env[NONCE_ENV]).score == score
        assert not read_score(lines, "another-nonce").valid
    assert other.requests() == []


async def test_an_unrecorded_evaluation_of_a_replayed_job_cannot_fall_through(
    tmp_path: Path,
) -> None:
    store = ReplayStore(tmp_path / "store")
    store.put(recording(inputs()))
    backend = ReplayBackend(tmp_path / "r", store, FakeBackend(tmp_path / "f"), fall_through=True)
    agent = await backend.submit(request())
    assert agent.replayed
    with pytest.raises(ToolError) as refused:
        await backend.submit(request(JobRole.dev, artifact_ref=agent.ref))
    assert refused.value.type is ErrorType.not_recorded
    assert "never ran" in refused.value.message


async def test_a_cancelled_fall_through_job_is_not_recorded(tmp_path: Path) -> None:
    store = ReplayStore(tmp_path / "store")
    inner = FakeBackend(tmp_path / "fake", SCENARIO)
    backend = ReplayBackend(tmp_path / "r", store, inner, fall_through=True)
    job = await backend.submit(request())
    cancelled = await backend.cancel(job.ref, T0 + timedelta(seconds=10))
    assert cancelled.state is JobState.cancelled
    assert store.keys() == []  # a cancelled run says nothing of what the script does


# -- time ----------------------------------------------------------------------------------------


async def test_the_time_scale_shortens_the_wait_but_not_the_charge(tmp_path: Path) -> None:
    store = ReplayStore(tmp_path / "store")
    store.put(recording(inputs(), queue_s=10, running_s=600))
    backend = ReplayBackend(tmp_path / "r", store, FakeBackend(tmp_path / "f"), time_scale=0.01)
    job = await backend.submit(request())
    assert (await backend.observe([job.ref], T0 + timedelta(seconds=0.05)))[job.ref].state is (
        JobState.queued
    )
    running = (await backend.observe([job.ref], T0 + timedelta(seconds=3.1)))[job.ref]
    assert running.state is JobState.running and running.running_s == pytest.approx(300)
    ended = (await backend.observe([job.ref], T0 + timedelta(seconds=6.1)))[job.ref]
    assert ended.state is JobState.succeeded and ended.running_s == 600
    assert ended.finished_at == T0 + timedelta(seconds=6.1)


async def test_a_shorter_timeout_times_the_replayed_run_out_and_a_longer_one_is_unknown(
    tmp_path: Path,
) -> None:
    store = ReplayStore(tmp_path / "store")
    store.put(recording(inputs(), running_s=600, timeout_s=3600))
    timed_out = inputs(script_sha256=sha256_text("while True: pass\n"))
    store.put(recording(timed_out, script="while True: pass\n", state="timed_out",
                        running_s=300, timeout_s=300))  # fmt: skip
    backend = ReplayBackend(tmp_path / "r", store, FakeBackend(tmp_path / "f"))
    short = await backend.submit(request(timeout_s=120))
    ended = await until_end(backend, short.ref, T0)
    assert ended.state is JobState.timed_out and ended.running_s == 120
    same = await backend.submit(request(script="while True: pass\n", timeout_s=300))
    assert (await until_end(backend, same.ref, T0)).state is JobState.timed_out
    with pytest.raises(ToolError) as refused:
        await backend.submit(request(script="while True: pass\n", timeout_s=900))
    assert refused.value.type is ErrorType.not_recorded
    assert "timed out" in refused.value.message


# -- the recording's format and bounds ---------------------------------------------------------


def test_a_recorded_log_keeps_its_end_cut_lines_and_no_nonce() -> None:
    nonce = "n" * 32
    lines = [f"line {i}" for i in range(MAX_RECORDED_LINES + 10)]
    lines += ["x" * (MAX_RECORDED_LINE_BYTES + 100), f"POSTTRAIN_SCORE {nonce} " + '{"score":1}']
    kept, trusted = bounded_log(lines, nonce)
    assert len(kept) == MAX_RECORDED_LINES and kept[0] == "line 12"
    assert len(kept[-2].encode()) == MAX_RECORDED_LINE_BYTES
    assert trusted == [MAX_RECORDED_LINES - 1] and nonce not in "".join(kept)


def test_a_recording_over_the_size_limit_drops_old_lines_and_a_huge_one_is_refused(
    tmp_path: Path,
) -> None:
    lines = ["y" * 4000] * 400  # 1.6 MB of log
    big = recording(inputs(), lines=lines, trusted=[399])
    data = fit(big)
    assert len(data) <= MAX_RECORDING_BYTES
    kept = Recording.model_validate_json(data)
    assert kept.lines == lines[-len(kept.lines) :] and kept.trusted == [len(kept.lines) - 1]
    huge = "#" * (MAX_RECORDING_BYTES + 1)
    with pytest.raises(RecordingTooLarge):
        fit(recording(inputs(script_sha256=sha256_text(huge)), script=huge))
    # A file over the limit in the store is skipped as if it were not there.
    store = ReplayStore(tmp_path / "store")
    key = inputs().key()
    store.path(key).write_text(json.dumps({"pad": "z" * MAX_RECORDING_BYTES}))
    assert store.get(key) is None


def test_the_store_skips_other_formats_and_recordings_whose_key_is_not_their_inputs(
    tmp_path: Path,
) -> None:
    store = ReplayStore(tmp_path / "store")
    good = recording(inputs())
    assert store.put(good) and not store.put(good)  # the first one stays
    assert store.get(good.key) == good
    other = inputs(flavor="t4-small")
    lying = recording(other).model_copy(update={"inputs": inputs(flavor="l4x1")})
    store.path(other.key()).write_bytes(lying.model_dump_json().encode())
    assert ReplayStore(tmp_path / "store").get(other.key()) is None
    future = json.loads(good.model_dump_json()) | {"format": 2}
    key = inputs(flavor="a10g-small").key()
    store.path(key).write_text(json.dumps(future | {"key": key}))
    assert ReplayStore(tmp_path / "store").get(key) is None
    with pytest.raises(ValueError):
        store.path("../../etc/passwd")
    assert hashlib.sha256(b"").hexdigest() not in store.keys()


def test_the_nearest_keys_are_looked_for_among_the_newest_recordings_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.backends.replay.store.MAX_SCANNED", 2)
    store = ReplayStore(tmp_path / "store")
    flavors = ["t4-small", "l4x1", "a10g-small"]  # the oldest is the same script on t4-small
    for age, flavor in zip((300, 200, 100), flavors, strict=True):
        job = inputs(flavor=flavor)
        store.put(recording(job))
        stamp = T0.timestamp() - age
        os.utime(store.path(job.key()), (stamp, stamp))
    near = store.nearest(inputs(), TRAIN, 3)
    assert [n.key for n in near] == sorted(inputs(flavor=f).key() for f in flavors[1:])
