"""The report's plots, with matplotlib's Agg backend (no display, safe in a worker or CI).

Each `*_figure` builds a figure from a `Report` and returns it, so a test can look at what was
drawn (labels, series) before `write_plots` saves it as PNG and closes it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display anywhere the report is written

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from posttrain_server.campaigns.report import (
    Report,
    pareto_front,
    rewards_by_task,
    spend_and_reward,
)

SPEND_LABEL = "spend per rollout (USD, environment + LLM)"
REWARD_LABEL = "reward"
REWARD_VS_USD = "reward_vs_usd.png"
PARETO = "pareto.png"
DISTRIBUTION = "reward_distribution.png"
DPI = 100


def reward_vs_usd_figure(report: Report) -> Figure:
    """One scatter series per agent: each rollout the mean is over, at its spend."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for agent, points in spend_and_reward(report).items():
        ax.scatter([p[0] for p in points], [p[1] for p in points], label=agent, alpha=0.7)
    _finish(fig, ax, f"{report.campaign_id}: reward vs dollars per rollout")
    return fig


def pareto_figure(report: Report) -> Figure:
    """One step line per agent: the best reward it reached at or below each spend."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for agent, points in spend_and_reward(report).items():
        front = pareto_front(points)
        # Carried flat to the agent's costliest rollout: spending more bought nothing better.
        most = max(p[0] for p in points)
        if most > front[-1][0]:
            front.append((most, front[-1][1]))
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", marker="o", label=agent)
    _finish(fig, ax, f"{report.campaign_id}: each agent's Pareto front")
    return fig


def distribution_figure(report: Report) -> Figure:
    """One box per task: the rewards of its scored and limit rollouts, every agent."""
    rewards = rewards_by_task(report)
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(rewards) + 2), 4.5))
    if rewards:
        ax.boxplot(list(rewards.values()), tick_labels=list(rewards))
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


def _finish(fig: Figure, ax: Axes, title: str) -> None:
    ax.set_xlabel(SPEND_LABEL)
    ax.set_ylabel(REWARD_LABEL)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="agent")
    fig.tight_layout()
