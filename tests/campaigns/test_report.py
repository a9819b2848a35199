"""`campaign report`: its numbers recomputed here from the records (means, seeded intervals,
rates, spend), its files written and non-empty, its plots drawing what they say, `--compare`
flagging a planted change and not a re-run, and the report commands of docs/campaigns.md run as
written there (pure: no Temporal)."""

from __future__ import annotations

import csv
import itertools
import os
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

from posttrain_common.campaigns.records import (
    RECORDS_FILE,
    AgentView,
    LlmSpend,
    Outcome,
    RolloutRecord,
    record_line,
)
from posttrain_env.models import ContaminationSummary, ServiceSpend, SettledSpend, StorageSpend
from posttrain_server.campaigns.plots import (
    FLAGGED_LABEL,
    REWARD_LABEL,
    REWARD_LIMITS,
    SPEND_LABEL,
    SPEND_LABEL_MICRO,
    UNCHECKED_LABEL,
    distribution_figure,
    pareto_figure,
    reward_vs_usd_figure,
)
from posttrain_server.campaigns.report import Report, build_report, compare, pareto_front
from posttrain_server.campaigns.report_files import (
    ATTEMPTS_CSV,
    CELLS_CSV,
    SUMMARY_MD,
    write_report,
)

REPO = Path(__file__).resolve().parents[2]
REWARD = {Outcome.scored: None, Outcome.limit: 0.0}


def rec(
    campaign: str,
    task: str,
    agent: str,
    epoch: int,
    outcome: Outcome,
    reward: float | None = None,
    attempt: int = 1,
    env_usd: float = 0.1,
    llm_usd: float = 0.02,
) -> RolloutRecord:
    return RolloutRecord(
        campaign_id=campaign,
        rollout_id=f"{campaign}/{task}/{agent}/{epoch}",
        attempt=attempt,
        task_id=task,
        epoch=epoch,
        agent=AgentView(name=agent, agent="scripted"),
        outcome=outcome,
        reward=reward if outcome in (Outcome.scored, Outcome.limit) else None,
        service_spend=ServiceSpend(settled=SettledSpend(usd=env_usd)),
        llm=LlmSpend(usd=llm_usd),
        total_usd=round(env_usd + llm_usd, 6),
    )


def mixed_records(campaign: str = "mixed") -> list[RolloutRecord]:
    """Every outcome class, retried attempts (an error then a score; a score then an unscored
    retry: the latest decides), cancelled ones, two tasks, two agents."""
    rng = np.random.default_rng(3)
    records = []
    for task in ("t_a", "t_b"):
        for agent in ("solver", "llm"):
            for epoch in range(1, 13):
                roll = rng.random()
                env, llm = round(rng.uniform(0.05, 0.4), 6), round(rng.uniform(0, 0.05), 6)
                if roll < 0.6:
                    outcome, reward = Outcome.scored, round(float(rng.uniform(0, 1)), 4)
                elif roll < 0.7:
                    outcome, reward = Outcome.limit, 0.0
                elif roll < 0.8:
                    outcome, reward = Outcome.unscored, None
                elif roll < 0.9:
                    outcome, reward = Outcome.error, None
                else:
                    outcome, reward = Outcome.cancelled, None
                records.append(rec(campaign, task, agent, epoch, outcome, reward, 1, env, llm))
    # Rollout 1 of t_a/solver: an error, then scored on its second attempt.
    first = records[0]
    records[0] = first.model_copy(update={"outcome": Outcome.error, "reward": None})
    records.append(rec(campaign, "t_a", "solver", 1, Outcome.scored, 0.9, 2, 0.2, 0.01))
    # Rollout 2 of t_b/llm: scored first, then a retry that came back unscored.
    records.append(rec(campaign, "t_b", "llm", 2, Outcome.scored, 0.5, 1, 0.1, 0.0))
    records = [r for r in records if r.key != (f"{campaign}/t_b/llm/2", 1) or r.reward == 0.5]
    records.append(rec(campaign, "t_b", "llm", 2, Outcome.unscored, None, 2, 0.1, 0.0))
    return records


def write_folder(root: Path, campaign: str, records: list[RolloutRecord]) -> Path:
    folder = root / campaign
    folder.mkdir(parents=True)
    text = "".join(record_line(r) + "\n" for r in records)
    (folder / RECORDS_FILE).write_text(text, encoding="utf-8")
    return folder


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_reports_numbers_are_those_recomputed_from_the_records() -> None:
    records = mixed_records()
    report = build_report("mixed", records, seed=11, resamples=2000)

    assert report.rollouts == 48 and report.attempts == 50
    assert len(report.cells) == 4
    for cell in report.cells:
        mine = [r for r in records if (r.task_id, r.agent.name) == cell.key]
        latest: dict[str, RolloutRecord] = {}
        for r in mine:
            if r.rollout_id not in latest or r.attempt > latest[r.rollout_id].attempt:
                latest[r.rollout_id] = r
        deciding = [latest[k] for k in sorted(latest)]
        rewards = [r.reward or 0.0 for r in deciding if r.outcome in ("scored", "limit")]
        assert cell.rollouts == len(deciding) and cell.attempts == len(mine)
        assert cell.averaged == len(rewards)
        assert cell.mean_reward == pytest.approx(np.mean(rewards))
        # The interval with the same seed: the same resamples, drawn here again.
        rng = np.random.default_rng([11, zlib.crc32(f"{cell.task_id}/{cell.agent}".encode())])
        means = np.asarray(rewards)[rng.integers(0, len(rewards), (2000, len(rewards)))]
        low, high = np.percentile(means.mean(axis=1), [2.5, 97.5])
        assert cell.interval is not None
        assert (cell.interval.low, cell.interval.high) == pytest.approx((low, high))
        assert cell.interval.low <= cell.mean_reward <= cell.interval.high
        counted = [r for r in deciding if r.outcome != "cancelled"]
        for outcome, rate in (
            ("unscored", cell.unscored_rate),
            ("error", cell.error_rate),
            ("limit", cell.limit_rate),
        ):
            assert rate == pytest.approx(sum(r.outcome == outcome for r in counted) / len(counted))
        # Every attempt's money, the retried ones' included.
        assert cell.env_usd == pytest.approx(sum(r.service_spend.settled.usd for r in mine))
        assert cell.llm_usd == pytest.approx(sum(r.llm.usd for r in mine))
        per_rollout = (cell.env_usd + cell.llm_usd) / len(deciding)
        assert cell.reward_per_usd == pytest.approx(np.mean(rewards) / per_rollout)

    # The latest attempt decides: the error retried into a score is averaged as 0.9; the score
    # retried into an unscored attempt is not averaged at all.
    solver = report.cell("t_a", "solver")
    assert solver is not None and solver.attempts == 13
    rows = {(r.rollout_id, r.attempt): r for r in report.attempt_rows}
    assert rows[("mixed/t_a/solver/1", 1)].deciding is False
    assert rows[("mixed/t_a/solver/1", 2)].deciding is True
    assert rows[("mixed/t_b/llm/2", 2)].outcome is Outcome.unscored
    # Reproducible: the same seed, the same report; another seed, other intervals.
    assert build_report("mixed", records, seed=11, resamples=2000) == report
    assert build_report("mixed", records, seed=12, resamples=2000).cells != report.cells


def test_an_unscored_or_errored_cell_has_rates_but_no_mean() -> None:
    records = [
        rec("u", "t_a", "a", 1, Outcome.unscored),
        rec("u", "t_a", "a", 2, Outcome.error),
    ]
    (cell,) = build_report("u", records).cells
    assert cell.mean_reward is None and cell.interval is None and cell.reward_per_usd is None
    assert cell.unscored_rate == 0.5 and cell.error_rate == 0.5 and cell.averaged == 0


def test_the_pareto_front_keeps_only_points_nothing_cheaper_beats() -> None:
    points = [(0.3, 0.5), (0.1, 0.2), (0.2, 0.2), (0.4, 0.4), (0.5, 0.9), (0.1, 0.1)]
    assert pareto_front(points) == [(0.1, 0.2), (0.3, 0.5), (0.5, 0.9)]


def test_the_plots_draw_one_series_per_agent_or_task_with_their_labels() -> None:
    report = build_report("mixed", mixed_records(), resamples=200)
    scatter = reward_vs_usd_figure(report)
    (ax,) = scatter.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == (SPEND_LABEL, REWARD_LABEL)
    assert len(ax.collections) == 2  # solver, llm
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["llm", "solver"]
    averaged = sum(c.averaged for c in report.cells)
    assert sum(len(c.get_offsets()) for c in ax.collections) == averaged

    (ax,) = pareto_figure(report).axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == (SPEND_LABEL, REWARD_LABEL)
    assert len(ax.lines) == 2
    (ax,) = distribution_figure(report).axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["t_a", "t_b"]
    assert ax.get_ylabel() == REWARD_LABEL


def degenerate_records() -> list[RolloutRecord]:
    """Two agents, every rollout at the same reward and the same spend ($0.00016: the
    replay backend's and a scripted agent's kind of cost); one flagged, one unchecked."""
    records = [
        rec("same", "t_a", agent, epoch, Outcome.scored, 0.5, env_usd=0.00015, llm_usd=0.00001)
        for agent in ("solver", "twin")
        for epoch in (1, 2, 3)
    ]
    flagged = ContaminationSummary(checked=True, flagged=True, policy="report")
    unchecked = ContaminationSummary(checked=False, skipped="unchecked")
    records[1] = records[1].model_copy(update={"contamination": flagged})
    records[2] = records[2].model_copy(update={"contamination": unchecked})
    return records


def drawn_ticks(fig: Figure, ax: Axes, axis: str) -> list[Text]:
    """The tick labels shown within an axis ("x" or "y"), as drawn."""
    fig.canvas.draw()
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    at = 0 if axis == "x" else 1
    return [t for t in labels if t.get_text() and low <= t.get_position()[at] <= high]


def readable(ticks: list[Text], axis: str) -> None:
    """A few short labels, none touching the next."""
    assert 2 <= len(ticks) <= 7
    assert all(len(t.get_text()) <= 6 for t in ticks), [t.get_text() for t in ticks]
    boxes = sorted((t.get_window_extent() for t in ticks), key=lambda b: (b.x0, b.y0))
    if axis == "x":
        assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes)), "labels touch"
    else:
        boxes.sort(key=lambda b: b.y0)
        assert all(a.y1 < b.y0 for a, b in itertools.pairwise(boxes)), "labels touch"


@pytest.mark.parametrize("campaign", ["degenerate", "typical"])
@pytest.mark.parametrize("build", [reward_vs_usd_figure, pareto_figure, distribution_figure])
def test_each_plot_shows_the_whole_reward_range_and_ticks_that_can_be_read(
    campaign: str, build: Callable[[Report], Figure]
) -> None:
    """Issue 45: every reward equal drew the reward axis from -0.04 to 0.04, and a spend of a
    few hundred µUSD drew USD ticks that ran into each other ("0.0001600 0.0001625 …")."""
    records = degenerate_records() if campaign == "degenerate" else mixed_records()
    report = build_report(campaign, records, resamples=100)
    fig = build(report)
    (ax,) = fig.axes
    assert ax.get_ylim() == REWARD_LIMITS
    rewards = drawn_ticks(fig, ax, "y")
    readable(rewards, "y")
    assert rewards[0].get_text() == "0.0" and rewards[-1].get_text() == "1.0"
    if build is distribution_figure:
        tasks = [t.get_text() for t in drawn_ticks(fig, ax, "x")]
        assert tasks == sorted({r.task_id for r in records})
        return
    readable(drawn_ticks(fig, ax, "x"), "x")
    spends = [r.total_usd for r in report.attempt_rows if r.deciding]
    scale, label = (1e6, SPEND_LABEL_MICRO) if campaign == "degenerate" else (1, SPEND_LABEL)
    assert ax.get_xlabel() == label
    low, high = ax.get_xlim()
    assert low == 0 and max(spends) * scale < high <= max(spends) * scale * 1.25
    if campaign == "degenerate":  # 160 µUSD: "0", "50", "100", "150" or the like
        assert all(t.get_text().isdigit() for t in drawn_ticks(fig, ax, "x"))


def test_agents_at_one_point_both_show_and_flagged_rollouts_are_marked() -> None:
    report = build_report("same", degenerate_records(), resamples=100)
    (ax,) = reward_vs_usd_figure(report).axes
    by_label = {c.get_label(): c for c in ax.collections}
    solver, twin = by_label["solver"], by_label["twin"]
    # The same points, drawn hollow in two shapes: the one drawn last hides nothing.
    assert (solver.get_offsets() == twin.get_offsets()).all()
    assert solver.get_paths()[0] != twin.get_paths()[0]
    for series in (solver, twin):
        assert all(face[3] == 0 for face in series.get_facecolors())
    flagged, unchecked = by_label[FLAGGED_LABEL], by_label[UNCHECKED_LABEL]
    assert [tuple(p) for p in flagged.get_offsets()] == [(160.0, 0.5)]
    assert [tuple(p) for p in unchecked.get_offsets()] == [(160.0, 0.5)]
    legend = sorted(t.get_text() for t in ax.get_legend().get_texts())
    assert legend == sorted(["solver", "twin", FLAGGED_LABEL, UNCHECKED_LABEL])
    # A campaign with nothing flagged marks nothing.
    (ax,) = reward_vs_usd_figure(build_report("mixed", mixed_records(), resamples=100)).axes
    assert {c.get_label() for c in ax.collections} == {"solver", "llm"}
    (ax,) = pareto_figure(report).axes
    assert ax.lines[0].get_linestyle() != ax.lines[1].get_linestyle()


def test_the_report_writes_its_tables_plots_and_a_summary_that_embeds_them(
    tmp_path: Path,
) -> None:
    report = build_report("mixed", mixed_records(), resamples=500)
    written = write_report(report, tmp_path / "out")

    assert all(path.stat().st_size > 0 for path in written)
    for name in ("reward_vs_usd.png", "pareto.png"):
        assert png_size(tmp_path / "out" / name) == (700, 450)  # 7 x 4.5 in at 100 dpi
        assert (tmp_path / "out" / name).stat().st_size > 10_000
    width, height = png_size(tmp_path / "out" / "reward_distribution.png")
    assert width >= 500 and height == 450
    with (tmp_path / "out" / CELLS_CSV).open() as f:
        cells = list(csv.DictReader(f))
    assert [(c["task_id"], c["agent"]) for c in cells] == [c.key for c in report.cells]
    assert float(cells[0]["mean_reward"]) == pytest.approx(report.cells[0].mean_reward)
    assert float(cells[0]["ci_low"]) == pytest.approx(report.cells[0].interval.low)  # type: ignore[union-attr]
    with (tmp_path / "out" / ATTEMPTS_CSV).open() as f:
        attempts = list(csv.DictReader(f))
    assert len(attempts) == 50 and sum(a["deciding"] == "True" for a in attempts) == 48
    summary = (tmp_path / "out" / SUMMARY_MD).read_text()
    embedded = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", summary)
    assert embedded == ["reward_vs_usd.png", "pareto.png", "reward_distribution.png"]
    assert "never averaged in" in summary and "mean spend per rollout" in summary


def test_the_report_counts_what_every_attempts_artifacts_keep(tmp_path: Path) -> None:
    """Issue 41: what an episode stores is in service_spend's storage block; the report sums
    it per cell over every attempt (a retried attempt's artifacts are kept too), per attempt in
    attempts.csv, and says the campaign's total in its summary."""
    records = []
    for n, record in enumerate(mixed_records()):
        storage = StorageSpend(bytes=(n + 1) << 20, usd=round((n + 1) * 1e-6, 6))
        spend = record.service_spend.model_copy(update={"storage": storage})
        records.append(record.model_copy(update={"service_spend": spend}))
    report = build_report("mixed", records, resamples=200)
    for cell in report.cells:
        mine = [r for r in records if (r.task_id, r.agent.name) == cell.key]
        assert cell.stored_bytes == sum(r.service_spend.storage.bytes for r in mine) > 0
        assert cell.storage_usd == pytest.approx(sum(r.service_spend.storage.usd for r in mine))
    total = sum(n + 1 for n in range(len(records))) << 20
    assert sum(cell.stored_bytes for cell in report.cells) == total
    write_report(report, tmp_path / "out")
    with (tmp_path / "out" / ATTEMPTS_CSV).open() as f:
        attempts = {(a["rollout_id"], int(a["attempt"])): a for a in csv.DictReader(f)}
    for record in records:
        row = attempts[(record.rollout_id, record.attempt)]
        assert int(row["stored_bytes"]) == record.service_spend.storage.bytes
    with (tmp_path / "out" / CELLS_CSV).open() as f:
        cells = list(csv.DictReader(f))
    assert sum(int(c["stored_bytes"]) for c in cells) == total
    summary = (tmp_path / "out" / SUMMARY_MD).read_text()
    assert f"Its artifacts keep {total:,} bytes ({total / 2**20:.1f} MiB)" in summary


def campaign_like(name: str, seed: int, shift: dict[tuple[str, str], float] | None = None):
    """30 rollouts per cell, rewards uniform in [0.5, 0.9] (plus a planted shift), from `seed`."""
    rng = np.random.default_rng(seed)
    records = []
    for task in ("t_a", "t_b"):
        for agent in ("solver", "llm"):
            for epoch in range(1, 31):
                reward = float(rng.uniform(0.5, 0.9)) + (shift or {}).get((task, agent), 0.0)
                records.append(rec(name, task, agent, epoch, Outcome.scored, reward))
    return records


def test_compare_flags_a_planted_change_and_not_a_rerun_with_another_seed() -> None:
    base = build_report("base", campaign_like("base", seed=1))
    rerun = build_report("rerun", campaign_like("rerun", seed=2), seed=5)
    planted = campaign_like("planted", seed=3, shift={("t_b", "llm"): -0.3})
    planted.append(rec("planted", "t_c", "llm", 1, Outcome.scored, 0.7))

    same = compare(rerun, base)
    assert same.moved == [] and len(same.unmoved) == 4
    changed = compare(build_report("planted", planted), base)
    assert [(c.task_id, c.agent) for c in changed.moved] == [("t_b", "llm")]
    assert changed.moved[0].delta is not None and changed.moved[0].delta < -0.2
    assert len(changed.unmoved) == 3
    assert changed.only_after == [("t_c", "llm")] and changed.only_before == []


def cli(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    args = command.split()
    assert args[:3] == ["uv", "run", "posttrain-env"], command
    return subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", *args[3:]],
        cwd=REPO,
        env={**os.environ, "POSTTRAIN_CAMPAIGNS_DIR": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def page_commands(prefix: str) -> list[str]:
    """The lines of docs/campaigns.md that start with `prefix`, without their comments."""
    text = (REPO / "docs" / "campaigns.md").read_text()
    found = re.findall(rf"^({re.escape(prefix)}[^\n#]*?)\s*(?:#.*)?$", text, re.M)
    return [line.strip() for line in found]


def test_the_docs_report_commands_write_the_report_and_the_comparison(
    tmp_path: Path,
) -> None:
    commands = page_commands("uv run posttrain-env campaign report")
    assert len(commands) == 2, commands
    ids: list[Any] = sorted(set(re.findall(r"smoke-[0-9a-f]{8}", " ".join(commands))))
    assert len(ids) == 2
    for campaign, seed in zip(ids, (1, 2), strict=True):
        write_folder(tmp_path, campaign, campaign_like(campaign, seed))

    for command in commands:
        done = cli(tmp_path, command)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "| t_a | solver |" in done.stdout
    report = tmp_path / ids[0] / "report"
    for name in (SUMMARY_MD, CELLS_CSV, ATTEMPTS_CSV, "pareto.png", "comparison.md"):
        assert (report / name).stat().st_size > 0
    assert "did not move (4)" in (report / "comparison.md").read_text()
