"""Campaign records carry each episode's contamination counts (issue 16): the rollout copies
them from the episode's end into its record, a record written before they were kept still
reads (schema_version 1, the field defaults to none), and the report counts the flagged
rollouts per cell (deciding attempts only), marks each attempt, and says so in its summary."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from posttrain_common.campaigns.records import (
    SCHEMA_VERSION,
    AgentView,
    Outcome,
    RolloutRecord,
    record_line,
)
from posttrain_common.campaigns.spec import AgentSpec
from posttrain_common.contracts.episode_calls import EpisodeClosed
from posttrain_common.contracts.jobs import RepoRef
from posttrain_env.models import ContaminationSummary, EndReason, EpisodeEnd, ServiceSpend
from posttrain_server.campaigns.report import build_report
from posttrain_server.campaigns.report_files import CELLS_CSV, SUMMARY_MD, write_report
from workflows.campaign.rollout_contract import RolloutCarry, RolloutInput
from workflows.campaign.rollout_rules import attempt_record

FLAGGED = ContaminationSummary(
    checked=True, flagged=True, policy="zero_reward", matched_items=3, unread_datasets=0
)
CLEAN = ContaminationSummary(checked=True, policy="zero_reward", unread_datasets=0)
T0 = datetime(2026, 1, 5, 12, tzinfo=UTC)


def record(
    epoch: int, contamination: ContaminationSummary | None, *, attempt: int = 1
) -> RolloutRecord:
    return RolloutRecord(
        campaign_id="c-1",
        rollout_id=f"c-1/t_public/scripted/{epoch}",
        attempt=attempt,
        task_id="t_public",
        epoch=epoch,
        agent=AgentView(name="scripted", agent="scripted"),
        outcome=Outcome.scored,
        end_reason="submitted",
        reward=0.0 if contamination is not None and contamination.flagged else 0.8,
        contamination=contamination,
    )


def test_the_rollout_copies_the_episodes_contamination_counts_into_its_record() -> None:
    inp = RolloutInput(
        campaign_id="c-1",
        campaign_workflow_id="campaign/c-1",
        rollout_id="c-1/t_public/scripted/0",
        attempt=1,
        task_id="t_public",
        epoch=0,
        agent=AgentSpec(name="scripted", agent="scripted"),
        base_model=RepoRef(repo_id="test-org/tiny-model", revision="c" * 40),
    )
    end = EpisodeEnd(reason=EndReason.submitted, reward=0.0, contamination=FLAGGED)
    carry = RolloutCarry(
        started_at=T0,
        episode_id="ep-0123456789abcdef",
        closed=EpisodeClosed(
            episode_id="ep-0123456789abcdef", end=end, service_spend=ServiceSpend()
        ),
    )
    made = attempt_record(inp, carry, T0 + timedelta(minutes=3))
    assert made.contamination == FLAGGED and made.contamination_flagged
    assert json.loads(record_line(made))["contamination"]["matched_items"] == 3
    unchecked = carry.model_copy(update={"closed": None})
    assert attempt_record(inp, unchecked, T0).contamination is None


def test_a_record_written_before_the_counts_were_kept_still_reads() -> None:
    line = json.loads(record_line(record(0, None)))
    del line["contamination"]
    old = RolloutRecord.model_validate_json(json.dumps(line))
    assert old.schema_version == SCHEMA_VERSION == 1
    assert old.contamination is None and not old.contamination_flagged


def test_the_report_counts_flagged_rollouts_by_their_deciding_attempt(tmp_path: Path) -> None:
    records = [
        record(0, FLAGGED),
        record(1, CLEAN),
        record(2, None),  # not checked (a task without a [contamination] table)
        record(3, FLAGGED),  # flagged, then tried again (attempt 2 decides)
        record(3, CLEAN, attempt=2),
    ]
    report = build_report("c-1", records, resamples=200)
    (cell,) = report.cells
    assert cell.contamination_flagged == 1 and report.contamination_flagged == 1
    marks = {(row.epoch, row.attempt): row.contamination_flagged for row in report.attempt_rows}
    assert marks == {(0, 1): True, (1, 1): False, (2, 1): None, (3, 1): True, (3, 2): False}

    out = tmp_path / "report"
    write_report(report, out)
    with (out / CELLS_CSV).open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["contamination_flagged"] == "1"
    assert "**1 rollout flagged by the contamination check**" in (out / SUMMARY_MD).read_text()


def test_a_report_with_nothing_flagged_says_nothing_of_it(tmp_path: Path) -> None:
    report = build_report("c-1", [record(0, CLEAN), record(1, None)], resamples=200)
    assert report.contamination_flagged == 0
    write_report(report, tmp_path / "report")
    assert "contamination" not in (tmp_path / "report" / SUMMARY_MD).read_text()


UNCHECKED = ContaminationSummary(checked=False, skipped="unchecked")


def test_the_report_counts_and_marks_rollouts_rewarded_unchecked(tmp_path: Path) -> None:
    """A rollout whose task's test items were missing, on a deployment that accepts unchecked
    rewards (POSTTRAIN_ACCEPT_UNCHECKED_REWARDS): counted per cell, marked per attempt, said in
    the summary."""
    records = [record(0, UNCHECKED), record(1, CLEAN), record(2, UNCHECKED), record(3, None)]
    report = build_report("c-1", records, resamples=200)
    (cell,) = report.cells
    assert cell.contamination_unchecked == 2 and report.contamination_unchecked == 2
    marks = {row.epoch: row.contamination_unchecked for row in report.attempt_rows}
    assert marks == {0: True, 1: False, 2: True, 3: False}

    out = tmp_path / "report"
    write_report(report, out)
    with (out / CELLS_CSV).open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["contamination_unchecked"] == "2"
    summary = (out / SUMMARY_MD).read_text()
    assert "**2 rollouts rewarded without a contamination check**" in summary
    assert "POSTTRAIN_ACCEPT_UNCHECKED_REWARDS" in summary
