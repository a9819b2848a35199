"""The report's plots, with matplotlib's Agg backend (no display, safe in a worker or CI).

Each `*_figure` builds a figure from a `Report` and returns it, so a test can look at what was
drawn (labels, series, limits) before `write_plots` saves it as PNG and closes it.

Drawn to be read (issue 45): a reward axis always shows the whole of [0, 1] (every reward equal
drew it from -0.04 to 0.04); the spend axis starts at 0 with a few round ticks, in µUSD when
every rollout cost less than a cent (USD ticks ran into each other: "0.0001600 0.0001625 …");
each agent has its own hollow marker shape, so two agents at one point both show; and the
rollouts the contamination check flagged, or that were rewarded unchecked, are marked over
their points.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display anywhere the report is written

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from posttrain_server.campaigns.report import (
    AttemptRow,
    Report,
    averaged_rows,
    pareto_front,
    rewards_by_task,
    spend_and_reward,
)

SPEND_LABEL = "spend per rollout (USD, environment + LLM)"
SPEND_LABEL_MICRO = "spend per rollout (µUSD, environment + LLM)"
REWARD_LABEL = "reward"
REWARD_VS_USD = "reward_vs_usd.png"
PARETO = "pareto.png"
DISTRIBUTION = "reward_distribution.png"
DPI = 100
# A reward is in [0, 1]: its axis shows all of it, with a margin for the points on its edges.
REWARD_LIMITS = (-0.05, 1.05)
# The spend axis: from 0 to this much past the costliest rollout, at most this many ticks.
SPEND_HEADROOM = 1.1
SPEND_TICKS = 5
MICRO_USD_BELOW = 0.01  # every rollout cheaper than a cent: the axis is in µUSD
# One hollow shape per agent (then again, in the next colour); lines dashed in turn.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINE_STYLES = ("-", "--", ":", "-.")
FLAGGED_LABEL = "flagged by the contamination check"
UNCHECKED_LABEL = "rewarded unchecked"


class SpendAxis:
    """How spend is drawn: the unit (USD or µUSD) and the axis's end."""

    def __init__(self, report: Report) -> None:
        costliest = max((row.total_usd for row in averaged_rows(report)), default=0.0)
        self.micro = costliest < MICRO_USD_BELOW
        self.scale = 1e6 if self.micro else 1.0
        self.label = SPEND_LABEL_MICRO if self.micro else SPEND_LABEL
        # An axis of nothing but free rollouts still spans a unit.
        self.end = costliest * self.scale * SPEND_HEADROOM or 1.0

    def of(self, usd: float) -> float:
        return usd * self.scale


def reward_vs_usd_figure(report: Report) -> Figure:
    """One scatter series per agent: each rollout the mean is over, at its spend; flagged and
    unchecked rollouts marked over their points."""
    spend = SpendAxis(report)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (agent, points) in enumerate(spend_and_reward(report).items()):
        ax.scatter(
            [spend.of(p[0]) for p in points],
            [p[1] for p in points],
            label=agent,
            marker=MARKERS[n % len(MARKERS)],
            facecolors="none",
            edgecolors=f"C{n % 10}",
            s=64,
            linewidths=1.4,
        )
    rows = averaged_rows(report)
    _mark(ax, spend, [r for r in rows if r.contamination_flagged], "x", "red", FLAGGED_LABEL)
    _mark(ax, spend, [r for r in rows if r.contamination_unchecked], "+", "black", UNCHECKED_LABEL)
    _finish(fig, ax, spend, f"{report.campaign_id}: reward vs dollars per rollout")
    return fig


def pareto_figure(report: Report) -> Figure:
    """One step line per agent: the best reward it reached at or below each spend."""
    spend = SpendAxis(report)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (agent, points) in enumerate(spend_and_reward(report).items()):
        front = pareto_front(points)
        # Carried flat to the agent's costliest rollout: spending more bought nothing better.
        most = max(p[0] for p in points)
        if most > front[-1][0]:
            front.append((most, front[-1][1]))
        ax.step(
            [spend.of(p[0]) for p in front],
            [p[1] for p in front],
            where="post",
            marker=MARKERS[n % len(MARKERS)],
            markerfacecolor="none",
            linestyle=LINE_STYLES[n % len(LINE_STYLES)],
            label=agent,
        )
    _finish(fig, ax, spend, f"{report.campaign_id}: each agent's Pareto front")
    return fig


def distribution_figure(report: Report) -> Figure:
    """One box per task: the rewards of its scored and limit rollouts, every agent."""
    rewards = rewards_by_task(report)
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(rewards) + 2), 4.5))
    if rewards:
        ax.boxplot(list(rewards.values()), tick_labels=list(rewards))
    ax.set_ylim(*REWARD_LIMITS)
    ax.set_xlabel("task")
    ax.set_ylabel(REWARD_LABEL)
    ax.set_title(f"{report.campaign_id}: reward distribution per task")
    fig.tight_layout()
    return fig


def write_plots(report: Report, folder: Path) -> list[Path]:
    """Save the three plots as PNG in `folder`; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in (
        (REWARD_VS_USD, reward_vs_usd_figure),
        (PARETO, pareto_figure),
        (DISTRIBUTION, distribution_figure),
    ):
        fig = build(report)
        path = folder / name
        fig.savefig(path, dpi=DPI)
        plt.close(fig)  # pyplot keeps every open figure otherwise
        written.append(path)
    return written


def _mark(
    ax: Axes, spend: SpendAxis, rows: list[AttemptRow], marker: str, color: str, label: str
) -> None:
    if rows:
        ax.scatter(
            [spend.of(r.total_usd) for r in rows],
            [r.reward or 0.0 for r in rows],
            marker=marker,
            color=color,
            s=90,
            linewidths=1.6,
            zorder=3,
            label=label,
        )


def _finish(fig: Figure, ax: Axes, spend: SpendAxis, title: str) -> None:
    ax.set_xlim(0, spend.end)
    ax.set_ylim(*REWARD_LIMITS)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=SPEND_TICKS, steps=[1, 2, 2.5, 5, 10]))
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_xlabel(spend.label)
    ax.set_ylabel(REWARD_LABEL)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")  # the agents, then the marks
    fig.tight_layout()
