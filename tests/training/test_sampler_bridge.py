"""The sampler bridge: RFC 013-shaped updates from finished rollouts, None kept, one cost per
rollout in the trainer's unit, orphans and replays flagged, spend never lost."""

from __future__ import annotations

from typing import Any

import pytest

from posttrain_env.models import EndReason, EpisodeEnd, ServiceSpend, SettledSpend
from posttrain_env.training.outcome import OutcomeError, RolloutOutcome
from posttrain_env.training.sampler import BridgeConfigError, SamplerBridge, cost_of
from posttrain_env.training.staleness import fits_staleness, staleness_steps


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, list[float | None], list[float] | None]] = []

    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        self.calls.append((task, list(rewards), None if costs is None else list(costs)))


def outcome(
    task: str,
    reward: float | None,
    *,
    usd: float = 0.5,
    reason: EndReason | None = None,
    final: bool = True,
    gpu_s: float = 0.0,
    replayed: bool = False,
) -> RolloutOutcome:
    if reason is None:
        reason = EndReason.submitted if reward is not None else EndReason.score_failed
    return RolloutOutcome(
        task_id=task,
        reward=reward,
        end=EpisodeEnd(reason=reason, reward=reward),
        spend=ServiceSpend(
            settled=SettledSpend(usd=usd, gpu_s=gpu_s, jobs=2, calls=1), final=final
        ),
        replayed=replayed,
    )


def test_an_unscored_rollout_reaches_the_sampler_as_none_with_its_cost() -> None:
    sampler = Recorder()
    bridge = SamplerBridge(sampler)
    bridge.update([outcome("a", 0.75, usd=0.1), outcome("a", None, usd=0.2), outcome("a", 0.25)])
    assert sampler.calls == [("a", [0.75, None, 0.25], [0.1, 0.2, 0.5])]
    assert bridge.totals.unscored == 1 and bridge.totals.scored == 2
    assert bridge.totals.usd == pytest.approx(0.8)


def test_rollouts_are_grouped_by_task_in_first_seen_order() -> None:
    sampler = Recorder()
    SamplerBridge(sampler).update([outcome("b", 1.0), outcome("a", 0.0), outcome("b", None)])
    assert [(task, rewards) for task, rewards, _ in sampler.calls] == [
        ("b", [1.0, None]),
        ("a", [0.0]),
    ]


def test_omit_leaves_the_unscored_rollout_out_of_the_lists_but_keeps_its_spend() -> None:
    sampler = Recorder()
    bridge = SamplerBridge(sampler, unscored="omit")
    lost = outcome("a", None, usd=0.3)
    (update,) = bridge.update([outcome("a", 0.5, usd=0.1), lost])
    assert sampler.calls == [("a", [0.5], [0.1])]
    assert update.omitted == [lost] and update.unscored == 1
    assert bridge.totals.cost == pytest.approx(0.4) and bridge.totals.unscored == 1


def test_a_task_whose_every_rollout_was_omitted_makes_no_sampler_call() -> None:
    sampler = Recorder()
    (update,) = SamplerBridge(sampler, unscored="omit").update([outcome("a", None)])
    assert sampler.calls == [] and update.unscored == 1 and update.rewards == []


def test_an_orphan_reports_its_spend_so_far_flagged_not_final() -> None:
    sampler = Recorder()
    bridge = SamplerBridge(sampler)
    orphan = outcome("a", 0.0, usd=0.05, reason=EndReason.max_steps, final=False)
    never_seen = RolloutOutcome(task_id="a", reward=None)  # the end never reached the client
    (update,) = bridge.update([outcome("a", 1.0), orphan, never_seen])
    assert update.final == [True, False, False] and update.orphans == 2
    assert sampler.calls == [("a", [1.0, 0.0, None], [0.5, 0.05, 0.0])]
    assert never_seen.orphan and not never_seen.spend.final


def test_a_budget_exhausted_rollout_is_scored_0_with_its_whole_cost() -> None:
    sampler = Recorder()
    spent = outcome("a", 0.0, usd=1.0, reason=EndReason.abandoned)
    SamplerBridge(sampler).update([spent])
    assert sampler.calls == [("a", [0.0], [1.0])]


@pytest.mark.parametrize(
    ("unit", "expected"),
    [("usd", 0.5), ("gpu_s", 12.0), ("jobs", 2.0), ("calls", 1.0), ("episodes", 1.0)],
)
def test_every_cost_unit_reads_its_own_figure(unit: Any, expected: float) -> None:
    assert cost_of(outcome("a", 1.0, gpu_s=12.0), unit) == expected


def test_a_cost_function_is_the_trainers_own_unit() -> None:
    sampler = Recorder()
    SamplerBridge(sampler, cost_unit=lambda o: o.spend.settled.usd * 1000).update(
        [outcome("a", 1.0, usd=0.002)]
    )
    assert sampler.calls == [("a", [1.0], [2.0])]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "1", True])
def test_a_cost_function_answering_no_finite_non_negative_number_is_refused(bad: Any) -> None:
    bridge = SamplerBridge(Recorder(), cost_unit=lambda o: bad)
    with pytest.raises(BridgeConfigError):
        bridge.update([outcome("a", 1.0)])


def test_an_unknown_cost_unit_or_unscored_policy_is_refused_by_name() -> None:
    with pytest.raises(BridgeConfigError, match="unknown cost unit 'tokens'"):
        SamplerBridge(cost_unit="tokens")  # type: ignore[arg-type]
    with pytest.raises(BridgeConfigError, match="never scored 0"):
        SamplerBridge(unscored="zero")  # type: ignore[arg-type]


def test_replayed_rollouts_are_flagged_in_the_update_and_counted() -> None:
    bridge = SamplerBridge(Recorder())
    (update,) = bridge.update([outcome("a", 0.5, replayed=True), outcome("a", 0.5)])
    assert update.replayed == [True, False] and bridge.totals.replayed == 1


def test_an_outcome_reads_a_steps_metadata_and_an_episodes_answer() -> None:
    answer = {
        "episode_id": "ep-0123456789abcdef",
        "service_spend": {"version": 1, "settled": {"usd": 0.25}, "final": False},
        "episode_end": {"reason": "score_failed", "reward": None},
    }
    read = RolloutOutcome.from_answer("t", answer)
    assert read.reward is None and read.unscored_reason is EndReason.score_failed
    assert read.orphan and read.episode_id == "ep-0123456789abcdef"
    live = RolloutOutcome.from_answer("t", {"service_spend": {"version": 1}})
    assert live.end is None and live.orphan
    flagged = {**answer, "episode_end": {"reason": "submitted", "reward": 1, "replayed": True}}
    assert RolloutOutcome.from_answer("t", flagged).replayed
    spent = {"service_spend": {"version": 1, "replayed": {"usd": 0.1, "jobs": 1}}}
    assert RolloutOutcome.from_answer("t", spent).replayed
    assert not read.replayed


@pytest.mark.parametrize(
    "answer",
    [{}, {"service_spend": {"version": 3}}, {"service_spend": {}, "episode_end": {"reason": "?"}}],
)
def test_an_answer_without_a_readable_spend_or_end_is_refused(answer: dict[str, Any]) -> None:
    with pytest.raises(OutcomeError):
        RolloutOutcome.from_answer("t", answer)


def test_staleness_counts_the_steps_a_rollout_spans() -> None:
    assert staleness_steps(0.5, 2.0) == 1
    assert staleness_steps(8.0, 2.0) == 4 and fits_staleness(8.0, 2.0, 4)
    assert not fits_staleness(8.1, 2.0, 4)
    with pytest.raises(ValueError):
        staleness_steps(1.0, 0.0)
    with pytest.raises(ValueError):
        fits_staleness(1.0, 1.0, 0)


def missed_answer(episode_id: str = "ep-1") -> dict[str, Any]:
    """The last answer of an episode whose replayed `submit` found no recording."""
    return {
        "service_spend": {"settled": {"usd": 0.25, "gpu_s": 0, "jobs": 1, "calls": 0}},
        "episode_end": {
            "reason": "replay_miss",
            "reward": None,
            "replayed": True,
            "replay_miss": {
                "tool": "submit",
                "job_id": "job-1",
                "key": "a" * 64,
                "nearest": [{"key": "b" * 64, "similarity": 0.0, "differs": ["script_sha256"]}],
                "message": "no recorded outcome for this evaluation",
            },
            "replay_misses": 1,
        },
        "episode_id": episode_id,
    }


def test_a_replay_miss_is_no_measurement_warned_and_counted_apart_from_unscored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="posttrain_env.training.outcome"):
        missed = RolloutOutcome.from_answer("a", missed_answer())
    assert missed.not_a_measurement and missed.reward is None and missed.replay_misses == 1
    (warning,) = caplog.records
    message = warning.getMessage()
    assert "ep-1" in message and "not a measurement" in message and "a" * 64 in message
    assert "bbbbbbbbbbbb (differs in script_sha256)" in message

    sampler = Recorder()
    bridge = SamplerBridge(sampler)
    (update,) = bridge.update([outcome("a", 0.5), outcome("a", None), missed])
    # None like an unscored rollout's (a sampler skips it), with its cost, flagged apart.
    assert sampler.calls == [("a", [0.5, None, None], [0.5, 0.5, 0.25])]
    assert update.not_measured == [False, False, True]
    assert (update.unscored, update.replay_misses) == (1, 1)
    assert (bridge.totals.unscored, bridge.totals.replay_misses) == (1, 1)
    assert bridge.totals.scored == 1 and bridge.totals.rollouts == 3

    omitting = SamplerBridge(Recorder(), unscored="omit")
    (update,) = omitting.update([missed])
    assert update.omitted == [missed] and (update.unscored, update.replay_misses) == (0, 1)
    assert omitting.totals.replay_misses == 1 and omitting.totals.usd == 0.25


def test_a_measured_rollout_is_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    answer = missed_answer()
    answer["episode_end"] = {"reason": "score_failed", "reward": None}
    with caplog.at_level("WARNING", logger="posttrain_env.training.outcome"):
        unscored = RolloutOutcome.from_answer("a", answer)
    assert not unscored.not_a_measurement and caplog.records == []
