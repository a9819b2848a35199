"""A report written out: CSV tables, the PNG plots, and a Markdown summary that embeds them,
readable on its own. And a comparison of two reports as text.

    <out>/summary.md              the table, the definitions, the plots
    <out>/cells.csv               one row per task x agent
    <out>/attempts.csv            one row per attempt (each rollout's deciding one marked)
    <out>/reward_vs_usd.png, pareto.png, reward_distribution.png
    <out>/comparison.md           with --compare only
"""

from __future__ import annotations

import csv
from pathlib import Path

from posttrain_common.campaigns.records import Outcome
from posttrain_server.campaigns.plots import DISTRIBUTION, PARETO, REWARD_VS_USD, write_plots
from posttrain_server.campaigns.report import AttemptRow, Cell, Comparison, Report

CELLS_CSV = "cells.csv"
ATTEMPTS_CSV = "attempts.csv"
SUMMARY_MD = "summary.md"
COMPARISON_MD = "comparison.md"
CELL_COLUMNS = [
    "task_id",
    "agent",
    "rollouts",
    "attempts",
    "averaged",
    "mean_reward",
    "ci_low",
    "ci_high",
    "reward_per_usd",
    "unscored_rate",
    "error_rate",
    "limit_rate",
    "replay_miss_rate",
    *(f"n_{o.value}" for o in Outcome),
    "env_usd",
    "llm_usd",
    "total_usd",
    "usd_per_rollout",
    "contamination_flagged",
    "contamination_unchecked",
    "replayed",
    "stored_bytes",
    "storage_usd",
]


def cell_row(cell: Cell) -> dict[str, object]:
    return {
        "task_id": cell.task_id,
        "agent": cell.agent,
        "rollouts": cell.rollouts,
        "attempts": cell.attempts,
        "averaged": cell.averaged,
        "mean_reward": cell.mean_reward,
        "ci_low": cell.interval.low if cell.interval else None,
        "ci_high": cell.interval.high if cell.interval else None,
        "reward_per_usd": cell.reward_per_usd,
        "unscored_rate": cell.unscored_rate,
        "error_rate": cell.error_rate,
        "limit_rate": cell.limit_rate,
        "replay_miss_rate": cell.replay_miss_rate,
        **{f"n_{o.value}": cell.counts[o] for o in Outcome},
        "env_usd": cell.env_usd,
        "llm_usd": cell.llm_usd,
        "total_usd": cell.total_usd,
        "usd_per_rollout": cell.usd_per_rollout,
        "contamination_flagged": cell.contamination_flagged,
        "contamination_unchecked": cell.contamination_unchecked,
        "replayed": cell.replayed,
        "stored_bytes": cell.stored_bytes,
        "storage_usd": cell.storage_usd,
    }


def write_report(report: Report, out: Path) -> list[Path]:
    """Every file of the report in `out` (created); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = [_write_csv(out / CELLS_CSV, CELL_COLUMNS, [cell_row(c) for c in report.cells])]
    columns = list(AttemptRow.model_fields)
    rows = [row.model_dump(mode="json") for row in report.attempt_rows]
    written.append(_write_csv(out / ATTEMPTS_CSV, columns, rows))
    written += write_plots(report, out)
    summary = out / SUMMARY_MD
    summary.write_text(summary_markdown(report), encoding="utf-8")
    written.append(summary)
    return written


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            # An empty cell, not "None", for what does not exist (no mean, no rate).
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _interval(cell: Cell) -> str:
    return "–" if cell.interval is None else f"[{cell.interval.low:.3f}, {cell.interval.high:.3f}]"


def table_markdown(report: Report) -> str:
    head = (
        "| task | agent | rollouts | mean reward | 95% CI | reward/$ | unscored | error | "
        "limit | env $ | LLM $ |"
    )
    lines = [head, "|" + "---|" * 11]
    for c in report.cells:
        lines.append(
            f"| {c.task_id} | {c.agent} | {c.rollouts} ({c.attempts} attempts) | "
            f"{_num(c.mean_reward)} (n={c.averaged}) | {_interval(c)} | "
            f"{_num(c.reward_per_usd, 2)} | {_pct(c.unscored_rate)} | {_pct(c.error_rate)} | "
            f"{_pct(c.limit_rate)} | {c.env_usd:.4f} | {c.llm_usd:.4f} |"
        )
    return "\n".join(lines)


def summary_markdown(report: Report) -> str:
    env = sum(c.env_usd for c in report.cells)
    llm = sum(c.llm_usd for c in report.cells)
    notes = _notes(report)
    return f"""# Campaign {report.campaign_id}

{report.rollouts} rollouts ({report.attempts} attempts), ${env + llm:.4f} spent
(environment ${env:.4f}, LLM ${llm:.4f}).{_storage_line(report)}{notes}

{table_markdown(report)}

How to read it:
- Each rollout counts once, by its latest attempt; every attempt's spend counts. `attempts.csv`
  lists every attempt.
- **mean reward** is over `scored` and `limit` rollouts (a limit's reward is 0); `unscored`
  (the grader failed) and `error` (infrastructure) rollouts are never averaged in: they are the
  rates beside it, of the rollouts not cancelled.
- **95% CI**: percentile bootstrap of the mean, {report.resamples} resamples, seed
  {report.seed} (the same seed gives the same intervals).
- **reward/$**: the mean reward divided by the mean spend per rollout (environment + LLM).

## Reward vs dollars per rollout

![reward vs dollars]({REWARD_VS_USD})

## Each agent's Pareto front

The best reward the agent reached at or below each spend per rollout.

![Pareto fronts]({PARETO})

## Reward distribution per task

![reward distribution]({DISTRIBUTION})
"""


def _notes(report: Report) -> str:
    """The summary's sentences on rollouts that need a word (none: nothing is said)."""
    return (
        _flagged_line(report)
        + _unchecked_line(report)
        + _replayed_line(report)
        + _replay_miss_line(report)
    )


def _storage_line(report: Report) -> str:
    """What the campaign's artifacts keep, and their part of the environment's spend."""
    stored = sum(c.stored_bytes for c in report.cells)
    usd = sum(c.storage_usd for c in report.cells)
    return (
        f" Its artifacts keep {stored:,} bytes ({stored / 2**20:.1f} MiB), whose storage cost"
        f" ${usd:.6f} of the environment's spend."
    )


def _flagged_line(report: Report) -> str:
    """A sentence when the contamination check flagged rollouts (none: nothing is said)."""
    return _rollouts_sentence(
        report.contamination_flagged,
        "flagged by the contamination check**",
        " (the task's test items found in what the agent controlled; their rewards are as the "
        "task's policy made them; `attempts.csv` marks them, each episode's audit record holds "
        "the evidence).",
    )


def _unchecked_line(report: Report) -> str:
    """A sentence when rollouts were rewarded unchecked (none: nothing is said)."""
    return _rollouts_sentence(
        report.contamination_unchecked,
        "rewarded without a contamination check**",
        ": their task's test items were not on the deployment, whose operator accepted "
        "unchecked rewards (POSTTRAIN_ACCEPT_UNCHECKED_REWARDS; `attempts.csv` marks them, "
        "`cells.csv` counts them per cell).",
    )


def _replayed_line(report: Report) -> str:
    """A sentence when rollouts were replayed from recordings (none: nothing is said)."""
    return _rollouts_sentence(
        report.replayed,
        "replayed**",
        ": some of their jobs were answered from recorded outcomes (the replay backend), so "
        "their rewards were not measured (`attempts.csv` marks them; `cells.csv` counts them "
        "per cell).",
    )


def _replay_miss_line(report: Report) -> str:
    """A sentence when rollouts ended `replay_miss` (none: nothing is said)."""
    return _rollouts_sentence(
        report.replay_misses,
        "ended replay_miss**",
        ": the replay backend had no recording of an evaluation their agent asked for (an "
        "evaluator or a tasks folder that drifted from the recording), so they are no "
        "measurement: no reward, never averaged in, counted apart (`n_replay_miss` and "
        "`replay_miss_rate` in `cells.csv`; each episode's audit record names the key missed "
        "and the nearest recorded ones).",
    )


def _rollouts_sentence(count: int, what: str, why: str) -> str:
    """A paragraph of the summary on `count` rollouts, or nothing when there are none."""
    if not count:
        return ""
    return f"\n\n**{count} rollout{'s' if count != 1 else ''} {what}{why}"


def comparison_text(comparison: Comparison) -> str:
    lines = [
        f"{comparison.after_id} against {comparison.before_id}: {comparison.rule}",
    ]
    for title, changes in (("moved", comparison.moved), ("did not move", comparison.unmoved)):
        lines.append(f"{title} ({len(changes)}):")
        for c in changes:
            lines.append(
                f"  {c.task_id} / {c.agent}: {_num(c.before.mean_reward)} {_interval(c.before)}"
                f" -> {_num(c.after.mean_reward)} {_interval(c.after)}"
                f" (delta {_num(c.delta)})"
            )
    for title, keys in (
        (f"only in {comparison.before_id}", comparison.only_before),
        (f"only in {comparison.after_id}", comparison.only_after),
    ):
        if keys:
            lines.append(f"{title}: " + ", ".join(f"{t} / {a}" for t, a in keys))
    return "\n".join(lines)
