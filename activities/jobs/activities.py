"""Activities that touch the jobs backend: start, watch, cancel, read logs and scores.

Every secret a job needs (its nonce; a grader's hidden-split seed) is derived here, inside the
activity, and handed to the backend; none is returned to a workflow (DESIGN §9).
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

from temporalio import activity

from activities.backends.interface import (
    ArtifactRejected,
    JobRequest,
    JobsBackend,
    TransientBackendError,
    known_run_source,
)
from activities.heartbeat import heartbeating
from activities.jobs.launcher_report import read_launcher_lines
from activities.ports import JobToWatch, JobWatch
from job_launcher.syntax import check_syntax
from job_launcher.trusted_lines import NO_SCORE_LINE, NONCE_ENV, read_score
from posttrain_common.contracts.activities import JobsApi
from posttrain_common.contracts.jobs import (
    BackendJob,
    CheckScript,
    JobLogs,
    JobRef,
    JobRole,
    KeepOutputs,
    LogLines,
    ObserveJobs,
    RepoRef,
    ResolveDatasets,
    ScoreResult,
    SubmitJob,
)
from posttrain_common.contracts.known_runs import KnownStart
from posttrain_common.contracts.watching import OBSERVE_ANSWER_BUDGET
from posttrain_common.failures import agent_errors, artifact_rejected
from posttrain_common.keys import ServerKey
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import LAUNCHER_LOG_TAIL, bound_log_lines, cut_text
from posttrain_env.models import JobState, TaskSpec
from tasks.registry import TaskSpecError, evaluator_script, load_task

HIDDEN_SEED_SECRET = "POSTTRAIN_HIDDEN_SPLIT_SEED"
# LAUNCHER_LOG_TAIL: the launcher's lines come first (installed) and last (the end): a failure
# before the script ran leaves a short log; a script that ran may have printed much, and its
# exit line is last.
# An evaluation's task parameters (`[evaluation]` of task.toml), as JSON.
TASK_PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
# A submit that lasts longer than this (a slow or retried create on the Hub) heartbeats this
# often; the job workflow's SUBMIT_HEARTBEAT timeout is several of these.
SUBMIT_BEAT_S = 5.0
# The lines of an evaluation's log its score is read from (the score line is among the last).
SCORE_LOG_TAIL = 10_000
# Replays of an evaluation's log that must agree before "no score line" counts (read_score).
SCORE_CONFIRM_READS = 3


class JobsActivities(JobsApi):
    def __init__(
        self, backend: JobsBackend, key: ServerKey, watch: JobWatch, tasks_dir: Path
    ) -> None:
        self._backend = backend
        self._key = key
        self._watch = watch
        self._tasks_dir = tasks_dir

    @activity.defn
    @agent_errors
    async def submit_job(self, job: SubmitJob) -> BackendJob:
        """Start the job unless one with its key exists (a retried submit), then watch it."""
        async with heartbeating(SUBMIT_BEAT_S, first_after_s=SUBMIT_BEAT_S):
            found = await self._backend.find_by_key(job.key, job.now)
            try:
                started = found or await self._backend.submit(self._request(job))
            except ArtifactRejected as err:
                raise artifact_rejected(str(err)) from None
            if not started.state.terminal:
                await self._watch.watch(
                    JobToWatch(
                        ref=started.ref,
                        job_workflow_id=job.key,
                        state=started.state.value,
                        job_id=job.job_id,
                        episode_id=job.episode_id,
                        started=started if job.report_start else None,
                        watcher_workflow_id=job.watcher_workflow_id,
                    )
                )
            return started

    @activity.defn
    @agent_errors
    async def start_known_job(self, job: SubmitJob) -> KnownStart:
        """Start the job if the backend knows its whole run now (`KnownRunSource`), and answer
        that run; an evaluation's score is read now from the log it ends with, as the job's
        workflow would read it at the end. Nothing is watched: the episode follows the run. An
        agent script's syntax is checked first, for the backend's Python (invalid_script), as
        `check_script` checks it: the episode asks no check of its own then."""
        source = known_run_source(self._backend)
        if source is None:
            return KnownStart()
        if job.role is JobRole.agent:  # as `check_script`: the episode asks no check of its own
            await asyncio.to_thread(check_syntax, job.script, self._backend.job_python_version)
        async with heartbeating(SUBMIT_BEAT_S, first_after_s=SUBMIT_BEAT_S):
            try:
                run = await source.start_known(self._request(job))
            except ArtifactRejected as err:
                raise artifact_rejected(str(err)) from None
            if run is None or job.role is JobRole.agent or run.outcome is not JobState.succeeded:
                return KnownStart(run=run)
            lines = await self._backend.logs(run.ref, SCORE_LOG_TAIL, run.ends_at)
            reading = read_score(lines, self._key.job_nonce(job.key))
            score = ScoreResult(
                score=reading.score,
                valid=reading.valid,
                reason=reading.reason,
                details=reading.details,
            )
            return KnownStart(run=run.model_copy(update={"score": score}))

    @activity.defn
    async def observe_jobs(self, observe: ObserveJobs) -> dict[str, BackendJob]:
        jobs = await self._backend.observe(observe.all_refs(), observe.now)
        if observe.states is None:  # a watcher recorded before it sent what it knew
            return {ref: await self._explained(job, observe.now) for ref, job in jobs.items()}
        known = observe.states
        changed = [job for job in jobs.values() if job.state.value != known.get(job.ref)]
        return await self._within_budget(changed, observe.now)

    async def _within_budget(
        self, changed: list[BackendJob], now: datetime
    ) -> dict[str, BackendJob]:
        """The changed jobs, ends first, as many as fit in OBSERVE_ANSWER_BUDGET bytes: the
        rest still differ from what the watcher knows and are answered at its next look."""
        changed.sort(key=lambda job: (not job.state.terminal, job.ref))
        answer: dict[str, BackendJob] = {}
        size = 2  # the braces
        for job in changed:
            explained = await self._explained(job, now)
            cost = len(explained.model_dump_json()) + len(json.dumps(job.ref)) + 2
            if answer and size + cost > OBSERVE_ANSWER_BUDGET:
                activity.logger.info(
                    "%d of %d changed jobs left for the next look (answer budget)",
                    len(changed) - len(answer),
                    len(changed),
                )
                break
            answer[job.ref] = explained
            size += cost
        return answer

    @activity.defn
    @agent_errors
    async def cancel_job(self, job: JobRef) -> BackendJob:
        return await self._backend.cancel(job.ref, job.now)

    @activity.defn
    @agent_errors
    async def job_logs(self, job: JobLogs) -> LogLines:
        lines = await self._backend.logs(job.ref, job.tail, job.now)
        # The launcher's own lines carry the job's nonce; the agent never needs to see it.
        nonce = self._key.job_nonce(job.key)
        # Cut here, before the answer crosses Temporal: a job controls its own log.
        tail = bound_log_lines([line.replace(nonce, "<nonce>") for line in lines], job.tail)
        return LogLines(
            lines=tail.lines, dropped_lines=tail.dropped_lines, cut_bytes=tail.cut_bytes
        )

    @activity.defn
    @agent_errors
    async def read_score(self, job: JobRef) -> ScoreResult:
        """The evaluation's score, from its log; a log without a score line is invalid (score
        0, the evaluator contract) only once SCORE_CONFIRM_READS replays of it agree.

        A log replay can end early with no error: on Hugging Face the library reads 5 s of
        silence in the stream as "the replay is drained", which a slow Hub also produces
        mid-replay, and a read cut at the call's deadline ends the same way under some
        transports. Such a cut loses the last lines, where the score line is. So a reading
        without a score line is read again; replays that disagree (a later one saw more) mean
        the log was not read completely: `TransientBackendError`, retried by the job
        workflow's policy, never a score of 0 for a fault on our side. Faults of the read
        itself (timeouts, 5xx, the deadline) are transient errors of the backend already."""
        nonce = self._key.job_nonce(job.key)
        seen: list[list[str]] = []
        while True:
            lines = await self._backend.logs(job.ref, SCORE_LOG_TAIL, job.now)
            reading = read_score(lines, nonce)
            if reading.reason != NO_SCORE_LINE:
                break  # a score line was read: complete enough (or several: invalid anyway)
            seen.append(lines)
            if len(seen) >= SCORE_CONFIRM_READS:
                if all(replay == seen[0] for replay in seen):
                    break  # the same whole log every time: the evaluator printed none
                raise TransientBackendError(
                    f"the log of evaluation {job.ref} read differently on {len(seen)} replays "
                    f"({', '.join(str(len(replay)) for replay in seen)} lines) and held no "
                    "score line; reading it again"
                )
        return ScoreResult(
            score=reading.score, valid=reading.valid, reason=reading.reason, details=reading.details
        )

    @activity.defn
    @agent_errors
    async def resolve_datasets(self, datasets: ResolveDatasets) -> list[RepoRef]:
        return [
            RepoRef(
                repo_id=repo_id,
                revision=await self._backend.resolve_dataset(repo_id, datasets.denylist),
            )
            for repo_id in datasets.repo_ids
        ]

    @activity.defn
    @agent_errors
    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        return await self._explained(await self._backend.keep_outputs(job), job.now)

    @activity.defn
    @agent_errors
    async def check_script(self, check: CheckScript) -> None:
        await asyncio.to_thread(check_syntax, check.script, check.python)

    # -- helpers -------------------------------------------------------------------------------

    async def _explained(self, job: BackendJob, now: datetime) -> BackendJob:
        """An ended job, with what the launcher's own lines say: the sandbox it ran in
        (`loopback_tcp`), and for a failed job why, in its message: the stage that failed
        before the script ran, or how the script exited (the agent need not spend a
        `jobs_logs` step on it). Read once, when the job is seen ended. A job that met one of
        its limits, or whose outputs were refused, keeps the backend's message: it says which
        (the launcher would only say how the script exited, "killed by signal 9")."""
        if not job.state.terminal:
            return job
        try:
            lines = await self._backend.logs(job.ref, LAUNCHER_LOG_TAIL, now)
        except (ToolError, TransientBackendError):
            return job  # the backend's own message stands
        nonce = self._key.job_nonce(job.key)
        report = read_launcher_lines(lines, nonce)
        update: dict[str, object] = {}
        if report.loopback_tcp is not None:
            update["loopback_tcp"] = report.loopback_tcp
            update["loopback_reason"] = cut_text(report.loopback_reason or "")
        failed = job.state is JobState.failed and not (job.limits_met or job.outputs_refused)
        why = report.failure_message if failed else None
        if why is not None:
            # The installer's output may quote the line that carried the nonce: never pass it
            # on.
            update["message"] = cut_text(why.replace(nonce, "<nonce>"))
        return job.model_copy(update=update) if update else job

    def _request(self, job: SubmitJob) -> JobRequest:
        env = {NONCE_ENV: self._key.job_nonce(job.key)}
        secrets: dict[str, str] = {}
        script = job.script
        if job.role is not JobRole.agent:
            task, script = self._evaluation(job.task_id)
            # The task's evaluation parameters (public: the same for every episode).
            env[TASK_PARAMS_ENV] = json.dumps(task.evaluation, sort_keys=True)
        if job.role is JobRole.grader:
            secrets[HIDDEN_SEED_SECRET] = self._key.hidden_split_seed(job.episode_id)
        # A SubmitJob is a JobRequest without its secrets: copy it, then add them.
        fields = job.model_dump(exclude={"script"})
        return JobRequest(**fields, script=script, env=env, secrets=secrets)

    def _evaluation(self, task_id: str) -> tuple[TaskSpec, str]:
        """The task and its evaluator script, in one file: the shared evaluator helpers are
        embedded (DESIGN §9, "Evaluators"). Raises not_allowed when either cannot be read."""
        try:
            task = load_task(task_id, self._tasks_dir)
            return task, evaluator_script(task, self._tasks_dir)
        except TaskSpecError as err:
            raise ToolError(
                ErrorType.not_allowed, f"evaluations are unavailable for this task: {err}"
            ) from None
