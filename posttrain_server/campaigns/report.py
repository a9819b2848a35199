"""A campaign's numbers, from its records only (pure: no Temporal, no files but what is passed).

Each rollout counts once, by its deciding attempt (the highest attempt number, as the engine
decides); every attempt's money counts. Per task x agent cell:

- the mean reward is over `scored` and `limit` rollouts (limit rewards are 0); `unscored`,
  `error` and `replay_miss` rollouts are counted and shown as rates, never averaged in as 0
  (a replay miss is no measurement at all: the replay backend had no recording of an
  evaluation the agent asked for);
- its 95% interval is a percentile bootstrap of that mean: `resamples` resamples of the cell's
  rewards (in rollout-id order), drawn by `numpy.random.default_rng([seed, crc32(cell)])`, so
  the report is reproducible and one cell's draws do not depend on which other cells exist;
- rates (unscored, error, limit, replay miss) are of the cell's rollouts that were not cancelled;
- reward per dollar is the mean reward divided by the mean spend per rollout (environment + LLM,
  every attempt, divided by the cell's rollouts).

`compare` calls a cell "moved" when the two 95% intervals do not overlap, a deliberately
conservative rule (two intervals that overlap slightly can still differ at the 5% level).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from pydantic import BaseModel, Field

from posttrain_common.campaigns.records import AVERAGED, Outcome, RolloutRecord, latest_attempts

DEFAULT_SEED = 0
DEFAULT_RESAMPLES = 10_000
CONFIDENCE = 0.95


class Interval(BaseModel):
    low: float
    high: float

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


class Cell(BaseModel):
    """One task x agent cell of the report."""

    task_id: str
    agent: str
    rollouts: int  # each once, by its deciding attempt (cancelled ones included)
    attempts: int
    averaged: int  # scored + limit: what the mean is over
    counts: dict[Outcome, int]
    mean_reward: float | None
    interval: Interval | None  # the 95% bootstrap interval of the mean
    unscored_rate: float | None  # of the rollouts not cancelled
    error_rate: float | None
    limit_rate: float | None
    env_usd: float  # every attempt
    llm_usd: float
    usd_per_rollout: float  # (env + LLM) / rollouts
    reward_per_usd: float | None  # mean reward / usd_per_rollout
    # Rollouts (deciding attempts) the contamination check flagged; their rewards count as
    # the task's policy made them (`report`: as scored; `zero_reward`: 0).
    contamination_flagged: int = 0
    # Rollouts (deciding attempts) rewarded without a contamination check: the task's test
    # items were missing and the operator accepted unchecked rewards.
    contamination_unchecked: int = 0
    # Rollouts (deciding attempts) whose episode had jobs replayed from recordings (the replay
    # backend): their rewards were not measured.
    replayed: int = 0
    # Of the rollouts not cancelled, those that ended `replay_miss` (counted apart: no reward).
    replay_miss_rate: float | None = None
    # What every attempt's artifacts keep (apparent bytes) and what that storage cost (a part
    # of env_usd): service_spend's storage block, summed.
    stored_bytes: int = 0
    storage_usd: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.task_id, self.agent)

    @property
    def total_usd(self) -> float:
        return round(self.env_usd + self.llm_usd, 6)


class AttemptRow(BaseModel):
    """One attempt, as the report's rollout table shows it (every attempt visible)."""

    rollout_id: str
    attempt: int
    deciding: bool  # the rollout's highest attempt: its outcome is the rollout's
    task_id: str
    agent: str
    epoch: int
    outcome: Outcome
    end_reason: str | None
    reward: float | None
    env_usd: float
    llm_usd: float
    total_usd: float
    wall_time_s: float
    contamination_flagged: bool | None = None  # None: the attempt's episode was not checked
    contamination_unchecked: bool = False  # rewarded unchecked (its task's items missing)
    replayed: bool = False  # some job of the attempt's episode was replayed, not run
    stored_bytes: int = 0  # what the attempt's artifacts keep (service_spend.storage.bytes)
    storage_usd: float = 0.0  # their storage's cost, a part of env_usd


class Report(BaseModel):
    campaign_id: str
    seed: int
    resamples: int
    confidence: float = CONFIDENCE
    rollouts: int  # each once
    attempts: int
    cells: list[Cell]
    attempt_rows: list[AttemptRow] = Field(default_factory=list)

    @property
    def contamination_flagged(self) -> int:
        """Rollouts (each once, by its deciding attempt) the contamination check flagged."""
        return sum(cell.contamination_flagged for cell in self.cells)

    @property
    def contamination_unchecked(self) -> int:
        """Rollouts (each once, by its deciding attempt) rewarded unchecked."""
        return sum(cell.contamination_unchecked for cell in self.cells)

    @property
    def replayed(self) -> int:
        """Rollouts (each once, by its deciding attempt) whose rewards were replayed."""
        return sum(cell.replayed for cell in self.cells)

    @property
    def replay_misses(self) -> int:
        """Rollouts (each once, by its deciding attempt) that ended `replay_miss`."""
        return sum(cell.counts[Outcome.replay_miss] for cell in self.cells)

    def cell(self, task_id: str, agent: str) -> Cell | None:
        return next((c for c in self.cells if c.key == (task_id, agent)), None)


def cell_seed(seed: int, task_id: str, agent: str) -> list[int]:
    """The generator's seed for one cell (`numpy.random.default_rng(cell_seed(...))`)."""
    return [seed, zlib.crc32(f"{task_id}/{agent}".encode())]


def bootstrap_interval(
    rewards: list[float], rng_seed: list[int], resamples: int = DEFAULT_RESAMPLES
) -> Interval | None:
    """The percentile bootstrap interval (95%) of the mean of `rewards`; None when empty."""
    if not rewards:
        return None
    values = np.asarray(rewards, dtype=float)
    rng = np.random.default_rng(rng_seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    means = values[picks].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(low=float(low), high=float(high))


def build_report(
    campaign_id: str,
    records: Iterable[RolloutRecord],
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
) -> Report:
    records = list(records)
    latest = latest_attempts(records)
    by_cell: dict[tuple[str, str], list[RolloutRecord]] = defaultdict(list)
    for record in records:
        by_cell[(record.task_id, record.agent.name)].append(record)
    cells = [
        _cell(task_id, agent, attempts, latest, seed, resamples)
        for (task_id, agent), attempts in sorted(by_cell.items())
    ]
    rows = [
        AttemptRow(
            rollout_id=r.rollout_id,
            attempt=r.attempt,
            deciding=latest[r.rollout_id] is r,
            task_id=r.task_id,
            agent=r.agent.name,
            epoch=r.epoch,
            outcome=r.outcome,
            end_reason=r.end_reason,
            reward=r.reward,
            env_usd=r.service_spend.settled.usd,
            llm_usd=r.llm.usd,
            total_usd=round(r.service_spend.settled.usd + r.llm.usd, 6),
            wall_time_s=r.wall_time_s,
            contamination_flagged=r.contamination.flagged if r.contamination else None,
            contamination_unchecked=r.contamination_unchecked,
            replayed=bool(r.replayed),
            stored_bytes=r.service_spend.storage.bytes,
            storage_usd=r.service_spend.storage.usd,
        )
        for r in sorted(records, key=lambda r: r.key)
    ]
    return Report(
        campaign_id=campaign_id,
        seed=seed,
        resamples=resamples,
        rollouts=len(latest),
        attempts=len(records),
        cells=cells,
        attempt_rows=rows,
    )


def _cell(
    task_id: str,
    agent: str,
    attempts: list[RolloutRecord],
    latest: dict[str, RolloutRecord],
    seed: int,
    resamples: int,
) -> Cell:
    deciding = sorted(
        (latest[rid] for rid in {r.rollout_id for r in attempts}), key=lambda r: r.rollout_id
    )
    counts = {o: 0 for o in Outcome}
    for record in deciding:
        counts[record.outcome] += 1
    rewards = [r.reward or 0.0 for r in deciding if r.outcome in AVERAGED]
    mean = sum(rewards) / len(rewards) if rewards else None
    counted = len(deciding) - counts[Outcome.cancelled]
    env = round(sum(r.service_spend.settled.usd for r in attempts), 6)
    llm = round(sum(r.llm.usd for r in attempts), 6)
    per_rollout = (env + llm) / len(deciding)
    return Cell(
        task_id=task_id,
        agent=agent,
        rollouts=len(deciding),
        attempts=len(attempts),
        averaged=len(rewards),
        counts=counts,
        mean_reward=mean,
        interval=bootstrap_interval(rewards, cell_seed(seed, task_id, agent), resamples),
        unscored_rate=counts[Outcome.unscored] / counted if counted else None,
        error_rate=counts[Outcome.error] / counted if counted else None,
        limit_rate=counts[Outcome.limit] / counted if counted else None,
        replay_miss_rate=counts[Outcome.replay_miss] / counted if counted else None,
        env_usd=env,
        llm_usd=llm,
        usd_per_rollout=per_rollout,
        reward_per_usd=mean / per_rollout if mean is not None and per_rollout > 0 else None,
        contamination_flagged=sum(1 for r in deciding if r.contamination_flagged),
        contamination_unchecked=sum(1 for r in deciding if r.contamination_unchecked),
        replayed=sum(1 for r in deciding if r.replayed),
        stored_bytes=sum(r.service_spend.storage.bytes for r in attempts),
        storage_usd=round(sum(r.service_spend.storage.usd for r in attempts), 6),
    )


# -- comparison ------------------------------------------------------------------------------


class CellChange(BaseModel):
    task_id: str
    agent: str
    before: Cell
    after: Cell
    moved: bool  # the two intervals do not overlap
    delta: float | None  # after - before, of the means


class Comparison(BaseModel):
    """`after` (this campaign) against `before` (the other one), cell by cell."""

    before_id: str
    after_id: str
    rule: str = "a cell moved when the two 95% bootstrap intervals of its mean do not overlap"
    changes: list[CellChange]  # cells in both campaigns
    only_before: list[tuple[str, str]] = Field(default_factory=list)
    only_after: list[tuple[str, str]] = Field(default_factory=list)

    @property
    def moved(self) -> list[CellChange]:
        return [c for c in self.changes if c.moved]

    @property
    def unmoved(self) -> list[CellChange]:
        return [c for c in self.changes if not c.moved]


def compare(after: Report, before: Report) -> Comparison:
    mine = {c.key: c for c in after.cells}
    theirs = {c.key: c for c in before.cells}
    changes = []
    for key in sorted(mine.keys() & theirs.keys()):
        a, b = mine[key], theirs[key]
        moved = (
            a.interval is not None
            and b.interval is not None
            and not a.interval.overlaps(b.interval)
        )
        delta = (
            a.mean_reward - b.mean_reward
            if a.mean_reward is not None and b.mean_reward is not None
            else None
        )
        changes.append(
            CellChange(task_id=key[0], agent=key[1], before=b, after=a, moved=moved, delta=delta)
        )
    return Comparison(
        before_id=before.campaign_id,
        after_id=after.campaign_id,
        changes=changes,
        only_before=sorted(theirs.keys() - mine.keys()),
        only_after=sorted(mine.keys() - theirs.keys()),
    )


# -- spend against reward --------------------------------------------------------------------


def pareto_front(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (spend, reward) points no other point beats (as cheap or cheaper and at least as
    good, one of them strictly), by spend: for each spend, the best reward reached at or below
    it is the front's last point up to there."""
    front: list[tuple[float, float]] = []
    for spend, reward in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or reward > front[-1][1]:
            front.append((spend, reward))
    return front


def averaged_rows(report: Report) -> list[AttemptRow]:
    """The deciding attempts of the rollouts the means are over (`scored` and `limit`)."""
    return [row for row in report.attempt_rows if row.deciding and row.outcome in AVERAGED]


def spend_and_reward(report: Report) -> dict[str, list[tuple[float, float]]]:
    """Per agent, (total spend, reward) of each rollout the mean is over (deciding attempts;
    the spend is that attempt's)."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in averaged_rows(report):
        points[row.agent].append((row.total_usd, row.reward or 0.0))
    return dict(sorted(points.items()))


def rewards_by_task(report: Report) -> dict[str, list[float]]:
    rewards: dict[str, list[float]] = defaultdict(list)
    for row in averaged_rows(report):
        rewards[row.task_id].append(row.reward or 0.0)
    return dict(sorted(rewards.items()))
