"""The replay backend over Hugging Face (`POSTTRAIN_REPLAY_INNER=hf`, docs/backends.md): a script
it has no recording of falls through to a Hugging Face job (here the HTTP-level fake Hub), billed
as any job, recorded when it ends, and replayed the next time without a Hub job; the watcher's
looks every second reach the Hub at most once per job per 30 s; the deployment declares that it
spends money (API keys even on loopback) and reaps the orphans of what fell through.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.backends.hf.attempt_clock import AttemptClock
from activities.backends.interface import TransientBackendError
from activities.backends.registry import backend_info
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.store import ReplayStore
from posttrain_common.contracts.jobs import BackendJob
from posttrain_env.models import JobState
from tests.backends.harnesses import SIMULATED_RUN_S, HfHarness, hf_harness

HUB_LOOK_S = 30.0  # what the hf backend allows (its watch interval)
# The Hub routes that report a job's state.
STATUS_ROUTES = ("list_jobs", "inspect_job")


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HfHarness]:
    harness = hf_harness(tmp_path, monkeypatch)
    yield harness
    harness.close()


def replay_over(hub: HfHarness, tmp_path: Path) -> ReplayBackend:
    return ReplayBackend(
        tmp_path / "replay",
        ReplayStore(tmp_path / "store"),
        hub.hf,
        fall_through=True,
        inner_look_s=HUB_LOOK_S,
    )


def status_calls(hub: HfHarness) -> int:
    return sum(len(hub.http.requests_to(route)) for route in STATUS_ROUTES)


async def look_every_second_until_ended(
    hub: HfHarness, backend: ReplayBackend, ref: str
) -> tuple[BackendJob, int]:
    """Look as the replay's watcher does (every second of workflow time) until the job ended;
    the view it ended with and how many looks that took."""
    for looks in range(1, 4000):
        hub.hub.advance(1.0)
        view = (await backend.observe([ref], hub.now())).get(ref)
        if view is not None and view.state.terminal:
            return view, looks
    raise AssertionError(f"job {ref} never ended")


async def look_every_second_until_running(hub: HfHarness, backend: ReplayBackend, ref: str) -> None:
    for _ in range(120):
        hub.hub.advance(1.0)
        view = (await backend.observe([ref], hub.now())).get(ref)
        if view is not None and view.state is JobState.running:
            return
    raise AssertionError(f"job {ref} never ran")


def test_over_hf_the_replay_backend_spends_money_reaps_orphans_and_has_hfs_interceptors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", "hf")
    over_hf = backend_info("replay")
    assert over_hf.capabilities.spends_money and over_hf.capabilities.reaps_orphans
    assert over_hf.capabilities.watch_interval_s == 1.0  # replayed jobs are still files
    assert any(isinstance(interceptor, AttemptClock) for interceptor in over_hf.interceptors())
    for inner in ("fake", "local"):
        monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", inner)
        info = backend_info("replay")
        assert not info.capabilities.spends_money and not info.capabilities.reaps_orphans
        assert list(info.interceptors()) == []
    monkeypatch.setenv("POSTTRAIN_REPLAY_INNER", "docker")
    with pytest.raises(SystemExit, match="POSTTRAIN_REPLAY_"):
        backend_info("replay")


async def test_an_unseen_script_runs_on_hf_billed_and_recorded_then_replays_without_a_hub_job(
    hub: HfHarness, tmp_path: Path
) -> None:
    replay = replay_over(hub, tmp_path)
    first = await replay.submit(hub.request("succeeds"))
    assert len(hub.hub.jobs) == 1  # it fell through: a Hugging Face job
    calls_before = status_calls(hub)
    ran, looks = await look_every_second_until_ended(hub, replay, first.ref)
    assert ran.state is JobState.succeeded and ran.replayed is False
    assert ran.running_s == pytest.approx(SIMULATED_RUN_S, abs=1.0)  # billed as it ran
    # Looked at every second, the Hub was asked at most once per 30 s (a listing at 1, 31, 61
    # and 91 s), and once more for the ended job's details. Without the pace: 91 listings.
    hub_calls = status_calls(hub) - calls_before
    assert looks > 60 and hub_calls <= math.ceil(looks / HUB_LOOK_S) + 1, (looks, hub_calls)
    (key,) = replay.store.keys()
    recording = replay.store.get(key)
    assert recording is not None
    assert recording.source == "fall-through:hf" and recording.state == "succeeded"
    assert recording.running_s == pytest.approx(ran.running_s)

    again = await replay.submit(hub.request("succeeds"))  # the same script, another job
    assert len(hub.hub.jobs) == 1  # replayed: nothing started on the Hub
    replayed, _ = await look_every_second_until_ended(hub, replay, again.ref)
    assert replayed.replayed is True and replayed.state is JobState.succeeded
    assert replayed.running_s == recording.running_s  # charged what the recorded run cost


async def test_the_orphan_reaper_sees_and_cancels_what_fell_through_by_the_hubs_refs(
    hub: HfHarness, tmp_path: Path
) -> None:
    replay = replay_over(hub, tmp_path)
    job = await replay.submit(hub.request("runs_long"))
    await look_every_second_until_running(hub, replay, job.ref)
    (live,) = await replay.live_jobs()
    assert live.episode_id == "ep-conformance" and live.ref != job.ref  # the Hub's ref
    for _ in range(10):  # hf confirms a cancellation over a few looks
        try:
            answered = await replay.cancel(live.ref, hub.now())
        except TransientBackendError:
            hub.hub.advance(1.0)
            continue
        if answered.state.terminal:
            break
        hub.hub.advance(1.0)
    assert answered.state is JobState.cancelled, answered
    assert await replay.live_jobs() == []
    # The replay's own view of its job follows (looked at again after a cancellation).
    hub.hub.advance(HUB_LOOK_S)
    assert (await replay.observe([job.ref], hub.now()))[job.ref].state is JobState.cancelled
