"""Build a replay store from a deployment's audit records (`posttrain-env replay-store build`).

Every episode writes its audit record when it ends (`<audit dir>/<episode_id>.json`,
posttrain_common/contracts/audit.py); a campaign's rollouts are episodes whose records carry its
`campaign_id`. A record holds what a recording needs: each agent job's script, dependencies,
datasets and base model at their commits, flavor, timeout, times, billed running time and final
state, and each evaluation's score. What it does not hold: a job's log (a recording built from
it replays an evaluation's score line, written from the recorded score, and no other line), an
evaluation's details, and the evaluator script, which is read from the tasks folder as the
server would send it (so the tasks must be the ones the records were made with: a changed
evaluator gives other keys, nothing replays, and a replayed `submit` or `dev_evaluate` ends
`replay_miss`).

Every outcome a record holds is recorded, or the build says why not, job by job
(`BuildReport.not_recorded`): a job that succeeded, failed or timed out is recorded as it ended,
an evaluation whose grader failed or timed out too (no score line: it replays unscored, as it
ended); a cancelled job is not (its run says nothing of what the script does), nor a job whose
start was refused (no run: a replay cannot refuse it again), nor an evaluation that succeeded
without a score read (its log could not be read: the recording could not say so).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from activities.backends.replay.recording import (
    NONCE_PLACEHOLDER,
    JobInputs,
    Recording,
    RecordingTooLarge,
    sha256_text,
)
from activities.backends.replay.store import ReplayStore
from job_launcher.trusted_lines import SCORE_TAG, format_trusted_line
from posttrain_common.contracts.audit import AuditEvaluation, AuditJob, AuditRecord
from posttrain_common.contracts.jobs import JobRole, RepoRef
from tasks.registry import TaskSpecError, evaluator_script, load_task

RECORDED_STATES = ("succeeded", "failed", "timed_out")
# An audit record larger than this is not read (a record holds at most a few MiB of scripts).
MAX_AUDIT_RECORD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class NotRecorded:
    """One job of a record that the build did not record, and why."""

    episode_id: str
    job_id: str
    role: str
    why: str


@dataclass
class BuildReport:
    episodes: int = 0
    recorded: int = 0  # recordings written
    known: int = 0  # keys the store had already (the first recording stays)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many jobs (or records)
    # Each job not recorded, in the order met (unreadable records are counted in `skipped` only).
    not_recorded: list[NotRecorded] = field(default_factory=list)

    def skip(
        self, why: str, record: AuditRecord | None = None, job: AuditJob | None = None
    ) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1
        if record is not None and job is not None:
            self.not_recorded.append(NotRecorded(record.episode_id, job.job_id, job.role, why))


def build_store(
    audit_dir: Path, tasks_dir: Path, store: ReplayStore, *, campaign_id: str | None = None
) -> BuildReport:
    """Record every ended job of the audit records in `audit_dir` (only a campaign's rollouts
    when `campaign_id`) into `store`."""
    report = BuildReport()
    for record in _records(audit_dir, report):
        if campaign_id is not None and record.campaign_id != campaign_id:
            continue
        report.episodes += 1
        for job, recording in recordings_of(record, tasks_dir, report):
            try:
                written = store.put(recording)
            except RecordingTooLarge:
                report.skip("over the recording size limit", record, job)
                continue
            if written:
                report.recorded += 1
            else:
                report.known += 1
    return report


def recordings_of(
    record: AuditRecord, tasks_dir: Path, report: BuildReport
) -> list[tuple[AuditJob, Recording]]:
    """The recordings one episode's record gives, each with its job: its agent jobs first (an
    evaluation's key holds the key of the job it evaluated). Each job not recorded is reported
    with why (`BuildReport.not_recorded`)."""
    keys: dict[str, str] = {}  # agent job id -> its recording key
    out: list[tuple[AuditJob, Recording]] = []
    evaluations = {e.job_id: e for e in record.evaluations}
    for job in sorted(record.jobs, key=lambda j: j.role != JobRole.agent.value):
        if job.final_state not in RECORDED_STATES:
            report.skip(f"{job.role} job ended {job.final_state or 'without an end'}", record, job)
            continue
        if job.backend_job_id is None:
            report.skip(
                f"{job.role} job never ran (its start was refused: a recording holds a run)",
                record,
                job,
            )
            continue
        if job.role == JobRole.agent.value:
            script = record.scripts.get(job.script_sha256 or "")
            if script is None:
                report.skip("agent job without its script", record, job)
                continue
            inputs = _inputs(job, record.task_id, sha256_text(script))
            keys[job.job_id] = inputs.key()
            out.append((job, _recording(record, job, inputs, script=script)))
            continue
        evaluated = keys.get(job.evaluated_job_id or "")
        evaluation = evaluations.get(job.job_id)
        if evaluated is None:
            report.skip("evaluation of an agent job that was not recorded", record, job)
            continue
        if evaluation is None:
            report.skip("evaluation without its outcome in the record", record, job)
            continue
        if evaluation.valid is None and job.final_state == "succeeded":
            # The evaluator ended but its score was never read (the log could not be read):
            # the episode was unscored, which a recording of a job that succeeded cannot say.
            report.skip("evaluation that succeeded but whose score was never read", record, job)
            continue
        try:
            task = load_task(record.task_id, tasks_dir)
            evaluator = evaluator_script(task, tasks_dir)
        except TaskSpecError:
            why = f"evaluation of task {record.task_id}, not in the tasks folder"
            report.skip(why, record, job)
            continue
        inputs = _inputs(
            job,
            record.task_id,
            sha256_text(evaluator),
            task_params=json.dumps(task.evaluation, sort_keys=True),
            evaluated=evaluated,
        )
        out.append((job, _recording(record, job, inputs, lines=_score_lines(evaluation))))
    return out


def _records(audit_dir: Path, report: BuildReport) -> Iterable[AuditRecord]:
    for path in sorted(audit_dir.glob("*.json")):
        try:
            if path.stat().st_size > MAX_AUDIT_RECORD_BYTES:
                report.skip("audit record over its size limit")
                continue
            yield AuditRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            report.skip("unreadable audit record")


def _inputs(
    job: AuditJob,
    task_id: str,
    script_sha256: str,
    *,
    task_params: str = "",
    evaluated: str | None = None,
) -> JobInputs:
    return JobInputs(
        role=JobRole(job.role),
        task_id=task_id,
        script_sha256=script_sha256,
        dependencies=list(job.dependencies),
        flavor=job.flavor,
        datasets=[RepoRef(repo_id=r, revision=v) for r, v in job.datasets.items()],
        base_model=RepoRef(repo_id=job.base_model, revision=job.base_model_revision),
        task_params=task_params,
        evaluated=evaluated,
    )


def _recording(
    record: AuditRecord,
    job: AuditJob,
    inputs: JobInputs,
    *,
    script: str = "",
    lines: list[str] | None = None,
) -> Recording:
    created = job.state_changes[0].at if job.state_changes else None
    queue_s = 0.0
    if created is not None and job.started_at is not None:
        queue_s = max(0.0, (job.started_at - created).total_seconds())
    recorded_at = record.ended_at or job.finished_at or created or datetime.fromtimestamp(0)
    return Recording(
        key=inputs.key(),
        inputs=inputs,
        script=script,
        state=job.final_state,  # type: ignore[arg-type]  (checked: RECORDED_STATES)
        queue_s=queue_s,
        running_s=job.running_s,
        timeout_s=job.timeout_s,
        message=job.state_changes[-1].message if job.state_changes else "",
        lines=lines or [],
        trusted=[0] if lines and lines[0].startswith(SCORE_TAG) else [],
        log_synthesized=True,
        artifact_bytes=job.artifact_bytes,
        source=f"audit:{record.episode_id}/{job.job_id}",
        recorded_at=recorded_at,
    )


def _score_lines(evaluation: AuditEvaluation) -> list[str]:
    """The evaluator's output as far as the record tells it: its score line when it was valid;
    a line saying why it was not when it was invalid (no score line: the replay reads it as
    invalid); nothing for a grader that failed or timed out (its job replays so, unscored)."""
    if evaluation.valid and evaluation.score is not None:
        return [format_trusted_line(SCORE_TAG, NONCE_PLACEHOLDER, {"score": evaluation.score})]
    if evaluation.valid is None:
        return []
    return [f"replayed evaluation: the recorded score was invalid: {evaluation.reason}"]
