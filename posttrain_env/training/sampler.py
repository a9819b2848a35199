"""Finished rollouts as RFC 013-shaped sampler updates.

OpenEnv's RFC 013 (task sampling and in-training evaluation, "In Review" when this was written)
proposes a trainer-side protocol:

    class TaskSampler(Protocol):
        def update(self, task, rewards: Sequence[float], costs: Sequence[float] | None = None): ...

called once per task (one GRPO group) with the rewards of its rollouts and, optionally, one cost
per rollout in the trainer's cost unit. The RFC says nothing of rollouts without a reward. Here,
as the environment's specification asks: an unscored rollout (reward None: the grader failed)
reaches the sampler **with its None kept** and **its cost**, and is never turned into 0. What we
settled where the RFC is silent:

- `unscored="keep"` (the default): `rewards` holds `None` at the rollout's place and `costs` its
  cost, so `len(rewards) == len(costs)`; a sampler that counts successes skips the None (it is
  neither a success nor a failure) and still counts the cost. `unscored="omit"`: for a sampler
  that takes only floats, the rollout is left out of both lists, and the update lists it in
  `omitted` so that its spend is still accounted (the bridge's totals include it). There is no
  policy that scores it 0.
- The cost unit is the trainer's (`cost_unit`): settled USD by default
  (`service_spend.settled.usd`), or `gpu_s`, `jobs` (agent jobs), `calls` (dev evaluations),
  `episodes` (1 per rollout, the RFC's default unit), or any function of the outcome.
- An orphan (a rollout whose spend is not final: a cancellation never confirmed, or an end never
  seen) reports the spend known so far and is flagged (`final[i] is False`), never dropped.
- A replayed rollout (a stand-in service answered) is flagged in `replayed`.
- A rollout that is not a measurement (`replay_miss`: the replay backend had no recording of
  an evaluation its agent asked for) has reward None like an unscored one, is flagged in
  `not_measured`, counted apart in `BridgeTotals.replay_misses` (not in `unscored`) and logged
  as a warning (posttrain_env.training.outcome).
- Rollouts are grouped by task id (`task_of`), in the order their tasks first appear.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from posttrain_env.training.outcome import RolloutOutcome

CostUnit = Literal["usd", "gpu_s", "jobs", "calls", "episodes"]
UnscoredPolicy = Literal["keep", "omit"]
COST_UNITS: tuple[str, ...] = get_args(CostUnit)
UNSCORED_POLICIES: tuple[str, ...] = get_args(UnscoredPolicy)


class TaskSampler(Protocol):
    """RFC 013's `TaskSampler.update`, with rewards that may be None (see the module)."""

    def update(
        self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None
    ) -> None: ...


class BridgeConfigError(ValueError):
    """A cost unit or an unscored policy the bridge does not know, or a cost that is no number."""


def cost_of(outcome: RolloutOutcome, unit: CostUnit | Callable[[RolloutOutcome], float]) -> float:
    """One rollout's cost in `unit`. Raises BridgeConfigError for an unknown unit or a cost
    function that answers something other than a finite, non-negative number."""
    if callable(unit):
        cost = unit(outcome)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost):
            raise BridgeConfigError(f"the cost function answered {cost!r}, not a finite number")
        if cost < 0:
            raise BridgeConfigError(f"the cost function answered {cost!r}, a negative cost")
        return float(cost)
    settled = outcome.spend.settled
    match unit:
        case "usd":
            return settled.usd
        case "gpu_s":
            return settled.gpu_s
        case "jobs":
            return float(settled.jobs)
        case "calls":
            return float(settled.calls)
        case "episodes":
            return 1.0
    raise BridgeConfigError(
        f"unknown cost unit {unit!r}: one of {', '.join(COST_UNITS)}, or a function"
    )


@dataclass(frozen=True)
class SamplerUpdate:
    """One `update(task, rewards, costs)` call as it was made, with what the call cannot carry."""

    task: Any
    rewards: list[float | None]
    costs: list[float]
    # Per rollout passed (same order as rewards): is its spend final, was it replayed.
    final: list[bool]
    replayed: list[bool]
    # With unscored="omit": the unscored rollouts left out of rewards and costs.
    omitted: list[RolloutOutcome] = field(default_factory=list)
    # Per rollout passed: it is no measurement (`replay_miss`; its reward is None).
    not_measured: list[bool] = field(default_factory=list)

    @property
    def unscored(self) -> int:
        """Rollouts without a reward that were measured (the grader failed, a reset...)."""
        flags = self._measured_flags()
        kept = sum(r is None and not m for r, m in zip(self.rewards, flags, strict=True))
        return kept + sum(not o.not_a_measurement for o in self.omitted)

    @property
    def replay_misses(self) -> int:
        """Rollouts that are no measurement (`replay_miss`), passed or omitted."""
        return sum(self.not_measured) + sum(o.not_a_measurement for o in self.omitted)

    def _measured_flags(self) -> list[bool]:
        return self.not_measured or [False] * len(self.rewards)

    @property
    def orphans(self) -> int:
        return self.final.count(False) + sum(o.orphan for o in self.omitted)


@dataclass
class BridgeTotals:
    """Every rollout the bridge passed on, whatever the policy: spend is never lost."""

    rollouts: int = 0
    scored: int = 0
    unscored: int = 0  # no reward, measured so (the grader failed; a reset, a cancel)
    # No reward and no measurement: the replay backend missed an evaluation (`replay_miss`).
    replay_misses: int = 0
    orphans: int = 0
    replayed: int = 0
    cost: float = 0.0  # in the bridge's unit
    usd: float = 0.0  # settled USD, whatever the unit


class SamplerBridge:
    """Turns finished rollouts into `sampler.update(task, rewards, costs)` calls.

    `sampler`: any object with RFC 013's `update` (None: only the updates are built and kept, as
    for logging). `cost_unit`: see `cost_of`. `unscored`: "keep" (None passed on) or "omit" (see
    the module). Raises BridgeConfigError for an unknown unit or policy."""

    def __init__(
        self,
        sampler: TaskSampler | None = None,
        *,
        cost_unit: CostUnit | Callable[[RolloutOutcome], float] = "usd",
        unscored: UnscoredPolicy = "keep",
        task_of: Callable[[RolloutOutcome], Any] = lambda outcome: outcome.task_id,
    ) -> None:
        if not callable(cost_unit) and cost_unit not in COST_UNITS:
            raise BridgeConfigError(
                f"unknown cost unit {cost_unit!r}: one of {', '.join(COST_UNITS)}, or a function"
            )
        if unscored not in UNSCORED_POLICIES:
            raise BridgeConfigError(
                f"unknown unscored policy {unscored!r}: one of {', '.join(UNSCORED_POLICIES)} "
                "(an unscored rollout is never scored 0)"
            )
        self.sampler = sampler
        self.cost_unit: CostUnit | Callable[[RolloutOutcome], float] = cost_unit
        self.unscored = unscored
        self.task_of = task_of
        self.totals = BridgeTotals()
        self.updates: list[SamplerUpdate] = []

    def update(self, outcomes: Sequence[RolloutOutcome]) -> list[SamplerUpdate]:
        """Group `outcomes` by task and make one sampler update per task; the updates made."""
        groups: dict[Any, list[RolloutOutcome]] = {}
        for outcome in outcomes:
            groups.setdefault(self.task_of(outcome), []).append(outcome)
        made = [self._update_task(task, group) for task, group in groups.items()]
        self.updates += made
        return made

    def _update_task(self, task: Any, outcomes: list[RolloutOutcome]) -> SamplerUpdate:
        rewards: list[float | None] = []
        costs: list[float] = []
        final: list[bool] = []
        replayed: list[bool] = []
        not_measured: list[bool] = []
        omitted: list[RolloutOutcome] = []
        for outcome in outcomes:
            cost = cost_of(outcome, self.cost_unit)
            self._count(outcome, cost)
            if outcome.reward is None and self.unscored == "omit":
                omitted.append(outcome)
                continue
            rewards.append(outcome.reward)
            costs.append(cost)
            final.append(not outcome.orphan)
            replayed.append(outcome.replayed)
            not_measured.append(outcome.not_a_measurement)
        if self.sampler is not None and rewards:
            self.sampler.update(task, rewards, costs)
        return SamplerUpdate(task, rewards, costs, final, replayed, omitted, not_measured)

    def _count(self, outcome: RolloutOutcome, cost: float) -> None:
        totals = self.totals
        totals.rollouts += 1
        totals.scored += outcome.scored
        totals.unscored += not outcome.scored and not outcome.not_a_measurement
        totals.replay_misses += outcome.not_a_measurement
        totals.orphans += outcome.orphan
        totals.replayed += outcome.replayed
        totals.cost += cost
        totals.usd += outcome.spend.settled.usd
