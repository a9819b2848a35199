"""Whether rollouts fit an asynchronous trainer's staleness window.

An asynchronous GRPO trainer (TRL's `AsyncGRPOTrainer`, `max_staleness` 4 by default; verl's and
prime-rl's off-policy windows) trains on a rollout at most `max_staleness` optimizer steps after
the weights that generated it. A rollout that takes longer than `max_staleness` steps of the
trainer is discarded (or trained on off-policy), so its episode was paid for nothing.
"""

from __future__ import annotations

import math


def staleness_steps(rollout_s: float, step_s: float) -> int:
    """How many optimizer steps pass while one rollout runs (at least 1). Raises ValueError
    for a step time that is not positive or a negative rollout time."""
    if not step_s > 0:
        raise ValueError(f"a trainer step takes a positive time, not {step_s!r} s")
    if rollout_s < 0:
        raise ValueError(f"a rollout takes a non-negative time, not {rollout_s!r} s")
    return max(1, math.ceil(rollout_s / step_s))


def fits_staleness(rollout_s: float, step_s: float, max_staleness: int) -> bool:
    """True when a rollout of `rollout_s` seconds is at most `max_staleness` steps old when the
    trainer, stepping every `step_s` seconds, takes it."""
    if max_staleness < 1:
        raise ValueError(f"max_staleness is at least 1, not {max_staleness!r}")
    return staleness_steps(rollout_s, step_s) <= max_staleness
