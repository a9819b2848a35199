"""The live progress of `campaign run` and `campaign status --follow`, drawn from the campaign's
`status` query only: closing the terminal loses nothing, and `--follow` from any other picks it
up where it stands.

On a terminal it is a rich live panel (a bar and the figures); otherwise (a pipe, a log, a test)
one plain line each time the figures change. Two figures are projections, defined so:

- projected spend = spent so far / attempts finished x (attempts finished + in flight + queued):
  the average attempt so far, for every attempt that will have run; and its ceiling, spent +
  reserved for the attempts in flight + queued x the costliest rollout's worst case, never more
  than the budget (admission never lets it past);
- ETA = (in flight + queued) / (rollouts finished / time since the campaign started).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TextIO

from posttrain_common.campaigns.records import Outcome

if TYPE_CHECKING:
    from rich.console import RenderableType

    from workflows.campaign.contract import CampaignStatus


@dataclass(frozen=True)
class Outlook:
    projected_usd: float | None  # None until an attempt has finished
    ceiling_usd: float
    eta_s: float | None  # None until a rollout has finished, or when none is left


def outlook(s: CampaignStatus, now: datetime) -> Outlook:
    done_attempts = s.attempts - s.in_flight
    to_run = done_attempts + s.in_flight + s.queued
    projected = s.spent_usd / done_attempts * to_run if done_attempts > 0 else None
    ceiling = min(s.spent_usd + s.reserved_usd + s.queued * s.worst_case_usd, s.budget_usd)
    elapsed = (now - s.created_at).total_seconds()
    left = s.in_flight + s.queued
    eta = None
    if s.finished > 0 and elapsed > 0 and left > 0:
        eta = left / (s.finished / elapsed)
    return Outlook(projected_usd=projected, ceiling_usd=max(ceiling, s.spent_usd), eta_s=eta)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _misses(s: CampaignStatus) -> str:
    """The rollouts that ended `replay_miss` (no measurement), when there are any."""
    misses = s.counts.get(Outcome.replay_miss, 0)
    return f", replay miss {misses}" if misses else ""


def figures(s: CampaignStatus, o: Outlook) -> str:
    """The figures of one moment, as one line (no clock: it changes only when they do)."""
    mean = "-" if s.mean_reward is None else f"{s.mean_reward:.3f}"
    return (
        f"{s.phase.value}: {s.finished}/{s.rollouts} done, {s.in_flight} in flight, "
        f"{s.queued} queued; mean reward {mean} (n={s.averaged}); "
        f"unscored {s.counts[Outcome.unscored]}, error {s.counts[Outcome.error]}, "
        f"limit {s.counts[Outcome.limit]}{_misses(s)}; "
        f"${s.spent_usd:.6f} spent of ${s.budget_usd}, projected "
        f"{_usd(o.projected_usd)} (at most {_usd(o.ceiling_usd)}); ETA {_eta(o.eta_s)}"
    )


def panel(s: CampaignStatus, o: Outlook) -> RenderableType:
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    mean = "-" if s.mean_reward is None else f"{s.mean_reward:.3f} over {s.averaged}"
    grid.add_row("campaign", f"{s.campaign_id} ({s.name}): {s.phase.value}")
    grid.add_row(
        "rollouts",
        f"{s.finished}/{s.rollouts} done, {s.in_flight} in flight, {s.queued} queued",
    )
    grid.add_row("mean reward", mean)
    grid.add_row(
        "not averaged",
        f"unscored {s.counts[Outcome.unscored]}, error {s.counts[Outcome.error]}{_misses(s)} "
        f"(limit {s.counts[Outcome.limit]}, reward 0, is averaged)",
    )
    grid.add_row(
        "spend",
        f"${s.spent_usd:.4f} of ${s.budget_usd}; projected {_usd(o.projected_usd)}, "
        f"at most {_usd(o.ceiling_usd)}",
    )
    grid.add_row("ETA", _eta(o.eta_s))
    grid.add_row("", ProgressBar(total=max(s.rollouts, 1), completed=s.finished, width=50))
    return grid


class Display(Protocol):
    def show(self, status: CampaignStatus) -> None: ...

    def close(self) -> None: ...


class PlainDisplay:
    """A line each time the figures change (not a TTY: a pipe, a log file, a test)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._shown = ""

    def show(self, status: CampaignStatus) -> None:
        line = figures(status, outlook(status, _now()))
        # Compared without the ETA, which moves with the clock alone.
        key = line.rsplit("; ETA", 1)[0]
        if key != self._shown:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=self._out, flush=True)
            self._shown = key

    def close(self) -> None:
        pass


class LiveDisplay:
    """A rich live panel, redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(console=Console(file=out), refresh_per_second=2, transient=False)
        self._live.start()

    def show(self, status: CampaignStatus) -> None:
        self._live.update(panel(status, outlook(status, _now())), refresh=True)

    def close(self) -> None:
        self._live.stop()


def display_for(out: TextIO) -> Display:
    isatty = getattr(out, "isatty", None)
    return LiveDisplay(out) if isatty is not None and isatty() else PlainDisplay(out)


def _now() -> datetime:
    from datetime import UTC

    return datetime.now(UTC)
