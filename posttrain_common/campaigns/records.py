"""What a campaign leaves in its folder: everything needed to report on it, and nothing secret.

    <campaigns dir>/<campaign id>/
        campaign.json      CampaignMeta: the spec (no key in it), the pinned base models, the
                           worst case of each rollout, the project version
        records.jsonl      one RolloutRecord per finished attempt, appended once each
        conversations/     each attempt's conversation, stored by content hash (RolloutRecord
                           .conversation names its head)

`records.jsonl` is the campaign's result. Each line is a JSON object with `schema_version`
(today 1: fields are only ever added, with defaults). A rollout may have several attempts (an
`error` attempt is retried as a new one); the attempt with the highest number decides the
rollout's outcome (`latest_attempts`). A line that is not valid JSON (a write cut short by a
crash) is skipped by `read_records`; the attempt is then written again whole.

Outcome classes, never merged (`Outcome`): `scored` (a reward from submit, including a valid 0),
`unscored` (the grader failed: reward null, never coerced to 0), `error` (an infrastructure
failure), `limit` (max_steps, time_limit or abandoned: reward 0), `replay_miss` (the replay
backend had no recording of an evaluation the agent asked for: no measurement, reward null),
`cancelled` (the campaign was cancelled; excluded from everything). The mean reward is over
`scored` and `limit` rollouts; `unscored`, `error` and `replay_miss` are rates (`summarize`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from posttrain_env.limits import MAX_ERROR_DETAIL_CHARS, cut_text
from posttrain_env.models import BoundedText, ContaminationSummary, EndReason, ServiceSpend

SCHEMA_VERSION = 1
RECORDS_FILE = "records.jsonl"
META_FILE = "campaign.json"


class Outcome(enum.StrEnum):
    scored = "scored"
    unscored = "unscored"
    error = "error"
    limit = "limit"
    cancelled = "cancelled"
    # The replay backend missed an evaluation (`EndReason.replay_miss`): not a measurement.
    replay_miss = "replay_miss"


def every_outcome(counts: dict[Outcome, int]) -> dict[Outcome, int]:
    """`counts` with every outcome (0 where absent: counts kept before an outcome existed)."""
    return {o: counts.get(o, 0) for o in Outcome}


# Counts by outcome; one decoded from before an outcome existed gets it at 0.
OutcomeCounts = Annotated[dict[Outcome, int], AfterValidator(every_outcome)]


LIMIT_REASONS = frozenset({EndReason.max_steps, EndReason.time_limit, EndReason.abandoned})
# Outcomes whose rewards the mean is taken over.
AVERAGED = frozenset({Outcome.scored, Outcome.limit})


def outcome_of(reason: EndReason | None, *, failed: bool) -> Outcome:
    """The class of an attempt that ended its episode with `reason` (None: it never had one);
    `failed`: the attempt ended on an infrastructure error."""
    if failed:
        return Outcome.error
    if reason is EndReason.submitted:
        return Outcome.scored
    if reason is EndReason.score_failed:
        return Outcome.unscored
    if reason is EndReason.replay_miss:
        return Outcome.replay_miss
    if reason in LIMIT_REASONS:
        return Outcome.limit
    return Outcome.cancelled  # cancelled or reset: the campaign was cancelled


class RepoRevision(BaseModel):
    repo_id: str
    revision: str


class AgentView(BaseModel):
    name: str
    agent: str  # the built-in name or `module:attr`
    args: dict[str, Any] = Field(default_factory=dict)


class LlmSpend(BaseModel):
    """The agent's own LLM spend in the attempt (tokens x the agent's price table)."""

    usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


class RecordError(BaseModel):
    # Cut where they enter (an activity's failure can say anything): a rollout carries its
    # error through continue-as-new and reports it to its campaign.
    type: Annotated[str, AfterValidator(lambda text: cut_text(text, MAX_ERROR_DETAIL_CHARS))]
    message: BoundedText


class RolloutRecord(BaseModel):
    """One finished attempt of one rollout (a line of `records.jsonl`)."""

    schema_version: int = SCHEMA_VERSION
    campaign_id: str
    rollout_id: str  # `<campaign>/<task>/<agent>/<epoch>`
    attempt: int  # 1, 2, ...: the highest decides the rollout's outcome
    task_id: str
    epoch: int
    agent: AgentView
    base_model: RepoRevision | None = None  # the commit the campaign pinned
    outcome: Outcome
    end_reason: str | None = None  # the episode's EndReason, if it had one
    reward: float | None = None  # null for unscored, error and cancelled attempts
    service_spend: ServiceSpend = Field(default_factory=ServiceSpend)  # the environment's
    llm: LlmSpend = Field(default_factory=LlmSpend)
    total_usd: float = 0.0  # service_spend.settled.usd + llm.usd
    reserved_usd: float = 0.0  # the worst case admission reserved for it
    steps_used: int = 0
    turns: int = 0
    wall_time_s: float = 0.0
    started_at: str | None = None  # ISO-8601 UTC
    ended_at: str | None = None
    episode_id: str | None = None
    job_ids: list[str] = Field(default_factory=list)  # agent jobs and evaluations
    error: RecordError | None = None
    conversation: str | None = None  # head of the stored conversation (conversations/)
    project_version: str = ""
    # The contamination check's counts, as the episode's end carried them (the evidence stays
    # in the episode's audit record); None: not checked, or a record from before they were kept.
    contamination: ContaminationSummary | None = None
    # True when the episode's end said some job was replayed from a recording (the replay
    # backend): its reward was not measured. None: measured, or a record from before.
    replayed: bool | None = None

    @property
    def contamination_flagged(self) -> bool:
        return self.contamination is not None and self.contamination.flagged

    @property
    def contamination_unchecked(self) -> bool:
        """The task's test items were missing and the operator accepted unchecked rewards."""
        return self.contamination is not None and self.contamination.skipped == "unchecked"

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt)


class CampaignMeta(BaseModel):
    """`campaign.json`: what the campaign is, written once when it is planned."""

    schema_version: int = SCHEMA_VERSION
    campaign_id: str
    spec: dict[str, Any]
    created_at: str
    project_version: str = ""
    base_models: dict[str, RepoRevision] = Field(default_factory=dict)  # task id -> pinned
    # Worst case of one rollout (task budget + the agent's llm_cap_usd), by "<task>/<agent>".
    worst_case_usd: dict[str, float] = Field(default_factory=dict)
    rollouts: int = 0


def read_records(folder: Path) -> list[RolloutRecord]:
    """Every record of the campaign in `folder`, in the order written (torn lines skipped)."""
    path = folder / RECORDS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(RolloutRecord.model_validate_json(line))
        except ValidationError:
            continue
    return records


def latest_attempts(records: Iterable[RolloutRecord]) -> dict[str, RolloutRecord]:
    """Each rollout's deciding attempt (the highest attempt number), by rollout id."""
    latest: dict[str, RolloutRecord] = {}
    for record in records:
        kept = latest.get(record.rollout_id)
        if kept is None or record.attempt > kept.attempt:
            latest[record.rollout_id] = record
    return latest


class Summary(BaseModel):
    """Counts by outcome (each rollout once, by its deciding attempt), the mean reward over
    scored and limit rollouts, and the money of every attempt."""

    rollouts: int = 0
    attempts: int = 0
    counts: OutcomeCounts = Field(default_factory=lambda: every_outcome({}))
    mean_reward: float | None = None
    unscored_rate: float | None = None  # of rollouts not cancelled
    error_rate: float | None = None
    replay_miss_rate: float | None = None
    env_usd: float = 0.0
    llm_usd: float = 0.0
    # Rollouts whose deciding attempt had jobs replayed from recordings (not measured rewards).
    replayed: int = 0


def summarize(records: Iterable[RolloutRecord]) -> Summary:
    records = list(records)
    latest = latest_attempts(records).values()
    summary = Summary(rollouts=len(latest), attempts=len(records))
    for record in latest:
        summary.counts[record.outcome] += 1
        summary.replayed += bool(record.replayed)
    rewards = [r.reward or 0.0 for r in latest if r.outcome in AVERAGED]
    if rewards:
        summary.mean_reward = sum(rewards) / len(rewards)
    counted = len(latest) - summary.counts[Outcome.cancelled]
    if counted:
        summary.unscored_rate = summary.counts[Outcome.unscored] / counted
        summary.error_rate = summary.counts[Outcome.error] / counted
        summary.replay_miss_rate = summary.counts[Outcome.replay_miss] / counted
    summary.env_usd = round(sum(r.service_spend.settled.usd for r in records), 6)
    summary.llm_usd = round(sum(r.llm.usd for r in records), 6)
    return summary


def record_line(record: RolloutRecord) -> str:
    return json.dumps(record.model_dump(mode="json"), sort_keys=True)
