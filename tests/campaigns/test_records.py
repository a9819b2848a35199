"""A campaign's records: each attempt appended once (also by two processes, also after a torn
line), outcome classes never merged, the mean over scored and limit rollouts only (pure)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from activities.campaigns.store import CampaignStore
from posttrain_common.campaigns.records import (
    RECORDS_FILE,
    AgentView,
    Outcome,
    RolloutRecord,
    outcome_of,
    read_records,
    summarize,
)
from posttrain_env.models import EndReason
from posttrain_server.campaigns.report import build_report
from posttrain_server.campaigns.report_files import (
    ATTEMPTS_CSV,
    CELLS_CSV,
    SUMMARY_MD,
    write_report,
)


def record(rollout: str, attempt: int = 1, **fields: Any) -> RolloutRecord:
    return RolloutRecord(
        campaign_id="c1",
        rollout_id=f"c1/t_a/a/{rollout}",
        attempt=attempt,
        task_id="t_a",
        epoch=int(rollout),
        agent=AgentView(name="a", agent="scripted", args={}),
        outcome=fields.pop("outcome", Outcome.scored),
        **fields,
    )


def test_an_attempt_is_appended_once_even_by_two_stores_and_after_a_torn_line(
    tmp_path: Path,
) -> None:
    one, two = CampaignStore(tmp_path), CampaignStore(tmp_path)  # as two processes
    assert one.append_record(record("1", reward=0.5))
    assert not two.append_record(record("1", reward=0.9))  # the same (rollout, attempt)
    assert two.append_record(record("1", attempt=2, reward=0.9))
    path = tmp_path / "c1" / RECORDS_FILE
    with path.open("ab") as out:
        out.write(b'{"schema_version": 1, "campaign_id": "c1", "rollo')  # a crash mid-write
    assert one.append_record(record("2", reward=1.0))
    assert not one.append_record(record("1", attempt=2))
    records = read_records(tmp_path / "c1")
    assert [(r.rollout_id[-1], r.attempt, r.reward) for r in records] == [
        ("1", 1, 0.5),
        ("1", 2, 0.9),
        ("2", 1, 1.0),
    ]
    assert all(r.schema_version == 1 for r in records)


@pytest.mark.parametrize(
    ("reason", "failed", "outcome"),
    [
        (EndReason.submitted, False, Outcome.scored),
        (EndReason.score_failed, False, Outcome.unscored),
        (EndReason.max_steps, False, Outcome.limit),
        (EndReason.time_limit, False, Outcome.limit),
        (EndReason.abandoned, False, Outcome.limit),
        (EndReason.cancelled, False, Outcome.cancelled),
        (EndReason.reset, False, Outcome.cancelled),
        (EndReason.replay_miss, False, Outcome.replay_miss),
        (EndReason.cancelled, True, Outcome.error),
        (None, True, Outcome.error),
    ],
)
def test_every_end_has_one_outcome_class(
    reason: EndReason | None, failed: bool, outcome: Outcome
) -> None:
    assert outcome_of(reason, failed=failed) is outcome


def test_the_mean_is_over_scored_and_limit_and_the_latest_attempt_decides() -> None:
    records = [
        record("1", reward=0.0),  # a valid 0 counts
        record("2", outcome=Outcome.limit, reward=0.0),
        record("3", outcome=Outcome.unscored, reward=None),  # never coerced to 0
        record("4", outcome=Outcome.error),
        record("4", attempt=2, reward=1.0),  # the retry decides
        record("5", outcome=Outcome.cancelled),
        record("6", outcome=Outcome.error),
    ]
    summary = summarize(records)
    assert summary.rollouts == 6 and summary.attempts == 7
    assert summary.counts == {
        Outcome.scored: 2,
        Outcome.limit: 1,
        Outcome.unscored: 1,
        Outcome.error: 1,
        Outcome.cancelled: 1,
        Outcome.replay_miss: 0,
    }
    assert summary.mean_reward == pytest.approx(1.0 / 3)
    assert summary.unscored_rate == 1 / 5 and summary.error_rate == 1 / 5


def test_replayed_rollouts_are_flagged_and_counted_by_their_deciding_attempt() -> None:
    records = [
        record("1", reward=0.5),
        record("2", reward=0.5, replayed=True),
        record("3", reward=0.2, replayed=True),
        record("3", attempt=2, reward=0.4),  # measured on its retry: it decides
    ]
    summary = summarize(records)
    assert summary.replayed == 1 and summary.rollouts == 3
    line = RolloutRecord.model_validate_json(records[1].model_dump_json())
    assert line.replayed is True and records[0].replayed is None


def test_the_report_counts_replayed_rollouts_per_cell_marks_each_attempt_and_says_so(
    tmp_path: Path,
) -> None:
    records = [
        record("1", reward=0.5),
        record("2", reward=0.5, replayed=True),
        record("3", reward=0.2, replayed=True),
        record("3", attempt=2, reward=0.4),  # measured on its retry: it decides
    ]
    report = build_report("c1", records)
    (cell,) = report.cells
    assert cell.replayed == 1 and report.replayed == 1
    marks = {(row.rollout_id[-1], row.attempt): row.replayed for row in report.attempt_rows}
    assert marks == {("1", 1): False, ("2", 1): True, ("3", 1): True, ("3", 2): False}
    write_report(report, tmp_path)
    with (tmp_path / CELLS_CSV).open() as cells:
        assert [row["replayed"] for row in csv.DictReader(cells)] == ["1"]
    with (tmp_path / ATTEMPTS_CSV).open() as attempts:
        assert sorted(row["replayed"] for row in csv.DictReader(attempts)) == [
            "False", "False", "True", "True",
        ]  # fmt: skip
    assert "**1 rollout replayed**" in (tmp_path / SUMMARY_MD).read_text()
    measured = build_report("c1", [record("1", reward=0.5)])
    write_report(measured, tmp_path / "measured")
    assert "replayed" not in (tmp_path / "measured" / SUMMARY_MD).read_text()


def test_replay_misses_are_counted_apart_never_averaged_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    records = [
        record("1", reward=0.5),
        record("2", outcome=Outcome.unscored),
        record("3", outcome=Outcome.replay_miss, end_reason="replay_miss", replayed=True),
        record("4", outcome=Outcome.replay_miss, end_reason="replay_miss", replayed=True),
    ]
    summary = summarize(records)
    assert summary.counts[Outcome.replay_miss] == 2 and summary.counts[Outcome.unscored] == 1
    assert summary.mean_reward == 0.5  # over the one scored rollout only
    assert summary.replay_miss_rate == 2 / 4 and summary.unscored_rate == 1 / 4
    report = build_report("c1", records)
    (cell,) = report.cells
    assert cell.counts[Outcome.replay_miss] == 2 and cell.replay_miss_rate == 0.5
    assert cell.averaged == 1 and report.replay_misses == 2
    write_report(report, tmp_path)
    with (tmp_path / CELLS_CSV).open() as cells:
        (row,) = csv.DictReader(cells)
    assert (row["n_replay_miss"], row["replay_miss_rate"], row["n_unscored"]) == ("2", "0.5", "1")
    summary_md = (tmp_path / SUMMARY_MD).read_text()
    assert "**2 rollouts ended replay_miss**" in summary_md
    measured = build_report("c1", [record("1", reward=0.5)])
    write_report(measured, tmp_path / "measured")
    assert "replay_miss**" not in (tmp_path / "measured" / SUMMARY_MD).read_text()


def test_counts_kept_before_replay_misses_existed_decode_with_them_at_zero() -> None:
    from workflows.campaign.contract import CampaignCarry

    old = {"created_at": "2026-12-01T00:00:00Z", "counts": {"scored": 3, "unscored": 1}}
    carry = CampaignCarry.model_validate(old)
    assert carry.counts[Outcome.replay_miss] == 0 and carry.counts[Outcome.scored] == 3
    carry.counts[Outcome.replay_miss] += 1  # the campaign's rules count one as it ends
