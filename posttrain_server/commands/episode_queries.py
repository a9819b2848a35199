"""`posttrain-env episodes list` filters as Temporal visibility queries, and the rows it shows
(pure: no client here, so the queries are unit-tested as strings).

Values go into the query quoted; they must match a plain pattern first, so a filter value can
never change the query's meaning (e.g. `x' OR PtTask != '`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.common import TypedSearchAttributes

from posttrain_env.models import EndReason
from workflows.ids import episode_workflow_id
from workflows.operations import search_attributes as sa

_VALUE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
_DURATION = re.compile(r"(\d{1,6})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
EPISODE_STATES = ("running", "ending", "ended")


class FilterError(ValueError):
    """A filter value that cannot be used (its message says which and why)."""


def parse_duration(text: str) -> timedelta:
    """`90s`, `10m`, `2h`, `2d`. Raises FilterError."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise FilterError(f"{text!r} is not a duration; write e.g. 90s, 10m, 2h or 2d")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _quoted(name: str, value: str) -> str:
    if not _VALUE.fullmatch(value):
        raise FilterError(
            f"--{name} {value!r}: use letters, digits and _ . : / - only (at most 200)"
        )
    return f"'{value}'"


def _instant(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class EpisodeFilter:
    task: str | None = None
    state: str | None = None
    end_reason: str | None = None
    campaign: str | None = None
    since: timedelta | None = None  # started within this long
    stuck: timedelta | None = None  # a cancellation pending for longer than this

    def query(self, now: datetime) -> str:
        """The visibility query for episodes matching every filter. Raises FilterError.

        A run that continued as new is not an episode of its own (its successor is), and with
        `stuck` only open episodes are listed: a closed run keeps the attributes of its last
        upsert, so an episode terminated while cancelling would otherwise stay "stuck"."""
        parts = ["WorkflowType = 'EpisodeWorkflow'", "ExecutionStatus != 'ContinuedAsNew'"]
        if self.task is not None:
            parts.append(f"{sa.TASK.name} = {_quoted('task', self.task)}")
        if self.state is not None:
            if self.state not in EPISODE_STATES:
                raise FilterError(f"--state {self.state!r}: one of {', '.join(EPISODE_STATES)}")
            parts.append(f"{sa.STATE.name} = '{self.state}'")
        if self.end_reason is not None:
            reasons = [r.value for r in EndReason]
            if self.end_reason not in reasons:
                raise FilterError(f"--end-reason {self.end_reason!r}: one of {', '.join(reasons)}")
            parts.append(f"{sa.END_REASON.name} = '{self.end_reason}'")
        if self.campaign is not None:
            parts.append(f"{sa.CAMPAIGN.name} = {_quoted('campaign', self.campaign)}")
        if self.since is not None:
            parts.append(f"StartTime > '{_instant(now - self.since)}'")
        if self.stuck is not None:
            parts.append(stuck_clause(now, self.stuck))
        return " AND ".join(parts)


def stuck_clause(now: datetime, pending_for: timedelta) -> str:
    """Open workflows whose cancellation has been pending longer than `pending_for` (a closed
    one, e.g. terminated from the UI while cancelling, waits on nothing: it is not stuck)."""
    return (
        f"ExecutionStatus = 'Running' AND "
        f"{sa.CANCEL_PENDING_SINCE.name} < '{_instant(now - pending_for)}'"
    )


def stuck_jobs_query(now: datetime, pending_for: timedelta, task: str | None = None) -> str:
    """Job workflows (of `task`'s episodes, when given) whose cancellation has been pending
    longer than `pending_for`. Raises FilterError."""
    of_task = f" AND {sa.TASK.name} = {_quoted('task', task)}" if task is not None else ""
    return f"WorkflowType = 'JobWorkflow'{of_task} AND {stuck_clause(now, pending_for)}"


def list_link_query(filters: EpisodeFilter, now: datetime) -> str:
    """What `list --ui-url` links to: with `stuck` alone (or with `task`, which jobs carry too),
    the stuck job workflows, the rows that show the backend job id; else the episodes the
    filters find (a state, an end reason, a campaign or a start time is an episode's only, so
    with any of them the link lists the episodes with a cancellation stuck). Raises
    FilterError."""
    episode_only = (filters.state, filters.end_reason, filters.campaign, filters.since)
    if filters.stuck is not None and all(f is None for f in episode_only):
        return stuck_jobs_query(now, filters.stuck, filters.task)
    return filters.query(now)


def episode_id_of(workflow_id: str) -> str | None:
    """`episode-<id>` or `episode-<id>/job/<n>` -> `<id>`."""
    prefix = episode_workflow_id("")
    if not workflow_id.startswith(prefix):
        return None
    return workflow_id[len(prefix) :].split("/", 1)[0]


@dataclass
class StuckJob:
    workflow_id: str
    backend_job_id: str | None
    pending_since: str | None
    pending_s: float | None


@dataclass
class EpisodeRow:
    episode_id: str
    status: str  # Temporal's: Running, Completed, ...
    task: str | None
    state: str | None
    end_reason: str | None
    reward: float | None
    spend_usd: float | None
    reserved_usd: float | None  # held for jobs not yet settled (None: not shown by this run)
    steps_used: int | None
    campaign: str | None
    started_at: str | None
    cancel_pending_since: str | None
    stuck_jobs: list[StuckJob] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def row_of(
    workflow_id: str,
    status: str,
    start_time: datetime | None,
    attrs: TypedSearchAttributes,
) -> EpisodeRow:
    spend = attrs.get(sa.SPEND_MICRO_USD)
    reserved = attrs.get(sa.RESERVED_MICRO_USD)
    pending = attrs.get(sa.CANCEL_PENDING_SINCE)
    return EpisodeRow(
        episode_id=episode_id_of(workflow_id) or workflow_id,
        status=status,
        task=attrs.get(sa.TASK),
        state=attrs.get(sa.STATE),
        end_reason=attrs.get(sa.END_REASON),
        reward=attrs.get(sa.REWARD),
        spend_usd=None if spend is None else spend / 1e6,
        reserved_usd=None if reserved is None else reserved / 1e6,
        steps_used=attrs.get(sa.STEPS_USED),
        campaign=attrs.get(sa.CAMPAIGN),
        started_at=_instant(start_time) if start_time else None,
        cancel_pending_since=_instant(pending) if pending else None,
    )


def stuck_job_of(workflow_id: str, attrs: TypedSearchAttributes, now: datetime) -> StuckJob:
    pending = attrs.get(sa.CANCEL_PENDING_SINCE)
    return StuckJob(
        workflow_id=workflow_id,
        backend_job_id=attrs.get(sa.BACKEND_JOB_ID),
        pending_since=_instant(pending) if pending else None,
        pending_s=round((now - pending).total_seconds(), 1) if pending else None,
    )


def table(rows: list[EpisodeRow]) -> str:
    """A plain table, one episode a line (stuck jobs on lines of their own beneath)."""
    header: tuple[str, ...] = ("EPISODE", "TASK", "STATE", "END", "REWARD", "SPEND_USD")
    header += ("RESERVED_USD", "STEPS", "STARTED")
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        lines.append(
            (
                r.episode_id,
                r.task or "-",
                r.state or r.status.lower(),
                r.end_reason or "-",
                "-" if r.reward is None else f"{r.reward:.4f}",
                "-" if r.spend_usd is None else f"{r.spend_usd:.6f}",
                "-" if r.reserved_usd is None else f"{r.reserved_usd:.6f}",
                "-" if r.steps_used is None else str(r.steps_used),
                r.started_at or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def render(line: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()

    out = [render(header)]
    for r, line in zip(rows, lines[1:], strict=True):
        out.append(render(line))
        out += [
            f"  cancel pending {job.pending_s} s: {job.workflow_id} "
            f"(backend job {job.backend_job_id or 'unknown'})"
            for job in r.stuck_jobs
        ]
    return "\n".join(out)
