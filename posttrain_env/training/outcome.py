"""What a trainer keeps of one finished rollout.

The reward is the episode's (`episode_end.reward`): a score in [0, 1], 0 for a limit (steps,
time, an episode abandoned), `None` when the episode ended unscored (`score_failed`: the grader
failed, not the agent; or `cancelled`/`reset`) or ended `replay_miss`: the replay backend had no
recording of the evaluation the agent asked for, so the rollout is **not a measurement** at all
(`not_a_measurement`); it is logged as a warning when its outcome is read, and the bridges count
it apart (`SamplerBridge.totals.replay_misses`, TRL's `rollouts/replay_misses`).

The spend is the last `service_spend` the service reported for it; `final` is false while a
job may still bill (an unconfirmed cancellation) or when the rollout lost its episode before it
saw the end: an orphan, whose spend is a lower bound and must be kept, never dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain_env.models import EndReason, EpisodeEnd, ServiceSpend

log = logging.getLogger(__name__)


class OutcomeError(ValueError):
    """An answer of the service that no outcome can be read from (no spend, a malformed end)."""


class RolloutOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    episode_id: str | None = None
    reward: float | None
    # How the episode ended; None: the rollout never saw its end (it is then an orphan).
    end: EpisodeEnd | None = None
    spend: ServiceSpend = Field(default_factory=lambda: ServiceSpend(final=False))
    # True when a stand-in service answered instead of measuring (its reward and spend are
    # replayed, never measured ones): read from the end, which the service flags.
    replayed: bool = False
    # Wall time from the reset to the end, seconds (0 when not measured).
    latency_s: float = 0.0
    # Of that, the time spent waiting on the service (its answers), without the trainer's own
    # work between calls (generation, other rollouts' calls): what the rollout would take alone.
    service_s: float = 0.0

    @property
    def scored(self) -> bool:
        return self.reward is not None

    @property
    def orphan(self) -> bool:
        """The spend may still grow: a job may still bill, or the end was never seen."""
        return not self.spend.final or self.end is None

    @property
    def not_a_measurement(self) -> bool:
        """The replay backend missed an evaluation (`replay_miss`): no reward, and not because
        of the agent or the grader; a stand-in service that could not stand in."""
        return self.end is not None and self.end.reason is EndReason.replay_miss

    @property
    def replay_misses(self) -> int:
        """The episode's calls the replay backend answered `not_recorded`."""
        return (self.end.replay_misses or 0) if self.end is not None else 0

    @property
    def unscored_reason(self) -> EndReason | None:
        """Why there is no reward (None when there is one, or when the end was never seen)."""
        if self.reward is not None or self.end is None:
            return None
        return self.end.reason

    @classmethod
    def from_answer(
        cls,
        task_id: str,
        answer: dict[str, Any],
        *,
        episode_id: str | None = None,
        latency_s: float = 0.0,
        service_s: float = 0.0,
    ) -> RolloutOutcome:
        """From the metadata of an episode's last step, or from `GET`/`DELETE /episodes/<id>`:
        both carry `service_spend` and, once the episode is over, `episode_end`.

        Raises OutcomeError when `service_spend` is missing or malformed."""
        if "service_spend" not in answer:
            raise OutcomeError("the answer carries no service_spend (was it a step's answer?)")
        try:
            spend = ServiceSpend.model_validate(answer["service_spend"])
            raw_end = answer.get("episode_end")
            end = EpisodeEnd.model_validate(raw_end) if raw_end is not None else None
        except ValidationError as exc:
            raise OutcomeError(f"the answer's spend or end is malformed: {exc}") from None
        outcome = cls(
            task_id=task_id,
            episode_id=answer.get("episode_id") or episode_id,
            reward=end.reward if end is not None else None,
            end=end,
            spend=spend,
            # The replay backend flags both: `service_spend.replayed` (what of the spend was
            # replayed) and `episode_end.replayed` (the reward was not measured).
            replayed=spend.replayed is not None or bool(end is not None and end.replayed),
            latency_s=latency_s,
            service_s=service_s,
        )
        if outcome.not_a_measurement and end is not None and end.replay_miss is not None:
            miss = end.replay_miss
            log.warning(
                "rollout %s of task %s is not a measurement: the replay backend has no "
                "recording of the evaluation its %s asked for (key %s; nearest: %s); reward None",
                outcome.episode_id,
                task_id,
                miss.tool,
                miss.key,
                ", ".join(f"{n.key[:12]} (differs in {', '.join(n.differs)})" for n in miss.nearest)
                or "none",
            )
        elif outcome.not_a_measurement:
            log.warning(
                "rollout %s of task %s is not a measurement (replay_miss); reward None",
                outcome.episode_id,
                task_id,
            )
        return outcome
