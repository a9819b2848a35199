"""The nine tools of an episode, as a mixin of EpisodeWorkflow (workflow code: deterministic).

Each tool returns its answer as a dict or raises ToolError, which the update handler turns into
the `{"error": ...}` envelope. Jobs of every role are started by `_start_job` as ABANDON children.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.backend import JobRole, RepoRef
    from activities.episodes import EpisodeActivities, ServerSpend
    from activities.jobs import JobLogs, JobsActivities, ResolveDatasets
    from job_launcher.requirements import merged_dependencies, validate_script
    from posttrain_env.limits import MAX_JOBS_PER_EPISODE
    from posttrain_env.models import (
        EndReason,
        ErrorType,
        JobIdArgs,
        JobsLogsArgs,
        JobsStatusArgs,
        JobsSubmitArgs,
        JobState,
        JobsWaitArgs,
        JobView,
        ServiceSpend,
        ToolArgs,
        ToolError,
    )
    from workflows.account import AccountWorkflow, Exposure
    from workflows.episode_state import (
        EpisodeCarry,
        EpisodeSetup,
        JobRecord,
        ToolCall,
        ToolResult,
        job_view,
    )
    from workflows.errors import tool_error_of
    from workflows.ids import SIGNAL_LOOK_NOW, job_workflow_id
    from workflows.job import JobInput, JobSnapshot, JobWorkflow
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import wait_until


_RANKS = {JobState.queued: 0, JobState.running: 1, JobState.cancelling: 2}


def _rank(state: JobState) -> int:
    return _RANKS.get(state, 3)


class EpisodeTools:
    _setup: EpisodeSetup
    _s: EpisodeCarry

    async def _end(
        self, reason: EndReason, reward: float | None, invalid_score: str | None = None
    ) -> None:
        raise NotImplementedError

    # -- dispatch ------------------------------------------------------------------------------

    async def _dispatch(self, tool: str, args: ToolArgs) -> dict[str, Any]:
        match tool:
            case "task_info":
                return self._task_info()
            case "list_hardware":
                return {"flavors": [self._setup.prices[f].view() for f in self._allowed_flavors()]}
            case "jobs_submit":
                assert isinstance(args, JobsSubmitArgs)
                return await self._jobs_submit(args)
            case "jobs_wait":
                assert isinstance(args, JobsWaitArgs)
                return await self._jobs_wait(args)
            case "jobs_status":
                assert isinstance(args, JobsStatusArgs)
                return self._jobs_status(args)
            case "jobs_logs":
                assert isinstance(args, JobsLogsArgs)
                return await self._jobs_logs(args)
            case "jobs_cancel":
                assert isinstance(args, JobIdArgs)
                return await self._jobs_cancel(args)
            case "dev_evaluate":
                assert isinstance(args, JobIdArgs)
                return await self._dev_evaluate(args)
            case "submit":
                assert isinstance(args, JobIdArgs)
                return await self._submit(args)
        raise ToolError(ErrorType.invalid_argument, f"unknown tool {tool!r}")

    # -- tools ---------------------------------------------------------------------------------

    def _task_info(self) -> dict[str, Any]:
        task, model = self._setup.task, self._setup.base_model
        return {
            "task_id": task.id,
            "prompt": task.prompt,
            "base_model": {"repo_id": model.repo_id, "revision": model.revision},
            **task.limits_view(self._setup.prices),
        }

    async def _jobs_submit(self, args: JobsSubmitArgs) -> dict[str, Any]:
        task = self._setup.task
        if args.flavor not in self._allowed_flavors():
            raise ToolError(
                ErrorType.flavor_not_allowed,
                f"flavor {args.flavor!r} is not allowed; use one of "
                f"{', '.join(self._allowed_flavors())}",
                flavor=args.flavor,
            )
        if args.timeout_minutes > task.max_timeout_minutes:
            raise ToolError(
                ErrorType.timeout_not_allowed,
                f"timeout_minutes {args.timeout_minutes} is above this task's maximum "
                f"of {task.max_timeout_minutes}",
            )
        validate_script(args.script)
        dependencies = merged_dependencies(args.script, args.dependencies)
        live = [r for r in self._s.jobs.values() if r.role is JobRole.agent and r.live]
        if len(live) >= task.max_concurrent_jobs:
            raise ToolError(
                ErrorType.limit_reached,
                f"{len(live)} jobs are live and this task allows "
                f"{task.max_concurrent_jobs} at once; wait for or cancel one",
            )
        datasets = await self._resolve_datasets(args.datasets)
        record = await self._start_job(
            JobRole.agent,
            args.flavor,
            args.timeout_minutes,
            script=args.script,
            dependencies=dependencies,
            datasets=datasets,
        )
        return self._view(record, workflow.now()).model_dump(mode="json")

    async def _jobs_wait(self, args: JobsWaitArgs) -> dict[str, Any]:
        record = self._agent_job(args.job_id)
        version = record.version
        if not record.final:
            await self._ask_watcher_to_look()
            await wait_until(
                lambda: record.version != version or self._s.end is not None,
                timedelta(seconds=args.timeout_s),
            )
        view = self._view(record, workflow.now()).model_dump(mode="json")
        return {**view, "changed": record.version != version}

    def _jobs_status(self, args: JobsStatusArgs) -> dict[str, Any]:
        now = workflow.now()
        if args.job_id is not None:
            return self._view(self._agent_job(args.job_id), now).model_dump(mode="json")
        agent_jobs = [r for r in self._s.jobs.values() if r.role is JobRole.agent]
        return {"jobs": [self._view(r, now).model_dump(mode="json") for r in agent_jobs]}

    async def _jobs_logs(self, args: JobsLogsArgs) -> dict[str, Any]:
        record = self._agent_job(args.job_id)
        if record.backend_ref is None:
            return {"job_id": record.job_id, "lines": [], "truncated": {"lines": 0, "bytes": 0}}
        try:
            logs = await workflow.execute_activity_method(
                JobsActivities.job_logs,
                JobLogs(
                    ref=record.backend_ref,
                    key=record.workflow_id,
                    tail=args.tail,
                    now=workflow.now(),
                ),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None
        return {
            "job_id": record.job_id,
            "lines": logs.lines,
            "truncated": {"lines": logs.dropped_lines, "bytes": logs.cut_bytes},
        }

    async def _jobs_cancel(self, args: JobIdArgs) -> dict[str, Any]:
        record = self._agent_job(args.job_id)
        if not record.final:
            await self._cancel_job(record)
            # Unconfirmed in time: answered as `cancelling`; jobs_status shows the rest.
            await wait_until(lambda: record.final, timedelta(seconds=self._setup.cancel_confirm_s))
        return self._view(record, workflow.now()).model_dump(mode="json")

    async def _dev_evaluate(self, args: JobIdArgs) -> dict[str, Any]:
        task = self._setup.task
        job = self._succeeded_agent_job(args.job_id)
        if self._s.dev_evaluations >= task.max_dev_evaluations:
            raise ToolError(
                ErrorType.limit_reached,
                f"this task allows {task.max_dev_evaluations} dev evaluations and all are used",
            )
        self._s.dev_evaluations += 1
        try:
            evaluation = await self._start_job(
                JobRole.dev,
                task.eval_flavor,
                task.eval_timeout_minutes,
                artifact_ref=job.backend_ref,
                evaluated_job_id=job.job_id,
            )
        except ToolError:
            self._s.dev_evaluations -= 1  # one that never started uses up no allowance
            raise
        await workflow.wait_condition(lambda: evaluation.final or self._s.end is not None)
        if not evaluation.final:
            raise ToolError(
                ErrorType.episode_over, "the episode ended while the dev evaluation ran"
            )
        if evaluation.score is None:
            raise ToolError(
                ErrorType.hf_error,
                f"the dev evaluation job did not finish: {evaluation.message}",
                evaluation_id=evaluation.job_id,
            )
        cost = evaluation.settlement.cost_micro_usd if evaluation.settlement else 0
        return {
            "job_id": job.job_id,
            "evaluation_id": evaluation.job_id,
            "split": "dev",
            **evaluation.score.model_dump(),
            "cost_usd": cost / 1_000_000,
        }

    async def _submit(self, args: JobIdArgs) -> dict[str, Any]:
        task = self._setup.task
        job = self._succeeded_agent_job(args.job_id)
        if self._s.submitting:
            raise ToolError(ErrorType.not_allowed, "a submission is already being graded")
        self._s.submitting = True
        try:
            grader = await self._start_job(
                JobRole.grader,
                task.eval_flavor,
                math.ceil(task.score_timeout_s / 60),
                timeout_s=task.score_timeout_s,
                artifact_ref=job.backend_ref,
                evaluated_job_id=job.job_id,
                reserve=False,
            )
        except ToolError as err:
            self._s.submitting = False
            await self._end(EndReason.score_failed, None)
            return {"job_id": job.job_id, "score": None, "reason": err.message}
        # Only a reset or an operator's cancel interrupts grading; the deadline does not.
        await workflow.wait_condition(
            lambda: (
                grader.final
                or (
                    self._s.end is not None
                    and self._s.end.reason in (EndReason.reset, EndReason.cancelled)
                )
            )
        )
        self._s.submitting = False
        score = grader.score
        if score is None:
            await self._end(EndReason.score_failed, None)
            return {
                "job_id": job.job_id,
                "score": None,
                "reason": grader.message or f"the grader job ended {grader.state.value}",
            }
        reward = score.score if score.valid else 0.0
        await self._end(EndReason.submitted, reward, None if score.valid else score.reason)
        return {"job_id": job.job_id, "split": "hidden", **score.model_dump(), "score": reward}

    # -- jobs ----------------------------------------------------------------------------------

    async def _start_job(
        self,
        role: JobRole,
        flavor: str,
        timeout_minutes: int,
        *,
        timeout_s: int | None = None,
        script: str = "",
        dependencies: list[str] | None = None,
        datasets: list[RepoRef] | None = None,
        artifact_ref: str | None = None,
        evaluated_job_id: str | None = None,
        reserve: bool = True,
    ) -> JobRecord:
        """Reserve, start the child, and wait until the job exists (or its start failed)."""
        if len(self._s.jobs) >= MAX_JOBS_PER_EPISODE:
            # The job table travels through continue-as-new: it must stay bounded.
            raise ToolError(
                ErrorType.limit_reached,
                f"this episode has started {len(self._s.jobs)} jobs and evaluations, the most "
                "an episode may; submit one of the finished jobs",
            )
        self._s.job_counter += 1
        n = self._s.job_counter
        prefix = "job" if role is JobRole.agent else "eval"
        job_id = f"{prefix}-{workflow.uuid4().hex[:12]}"
        price = self._setup.prices.get(flavor)
        if price is None:
            raise ToolError(ErrorType.flavor_not_allowed, f"no price is known for {flavor!r}")
        reserved = 0
        if reserve:
            kind = "job" if role is JobRole.agent else "dev"
            reserved = self._s.ledger.reserve(job_id, kind, price, timeout_minutes).amount_micro_usd
            try:
                await self._account_reserve(reserved)
            except ToolError:
                self._s.ledger.release(job_id)
                raise
        record = JobRecord(
            job_id=job_id,
            workflow_id=job_workflow_id(self._setup.episode_id, n),
            role=role,
            flavor=flavor,
            timeout_minutes=timeout_minutes,
            reserved_micro_usd=reserved,
            evaluated_job_id=evaluated_job_id,
            created_at=workflow.now(),
        )
        self._s.jobs[job_id] = record
        await workflow.start_child_workflow(
            JobWorkflow.run,
            JobInput(
                job_id=job_id,
                role=role,
                episode_id=self._setup.episode_id,
                task_id=self._setup.task.id,
                flavor=flavor,
                timeout_s=timeout_s or timeout_minutes * 60,
                base_model=self._setup.base_model,
                script=script,
                dependencies=dependencies or [],
                datasets=datasets or [],
                artifact_ref=artifact_ref,
                parent_workflow_id=workflow.info().workflow_id,
                watcher_workflow_id=self._setup.watcher_workflow_id,
            ),
            id=record.workflow_id,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
        await workflow.wait_condition(lambda: record.submitted or record.error is not None)
        if record.error is not None:
            raise ToolError.from_envelope(record.error)
        return record

    def _take_snapshot(self, record: JobRecord, snap: JobSnapshot) -> None:
        """Apply what a job's workflow (or, short of the end, the watcher) reported; settle the
        ledger when the job is final. Reports come by two routes, so none may move a job back."""
        if snap.backend is not None:
            record.submitted = True
            record.backend_ref = snap.backend.ref
            record.created_at = snap.backend.created_at
        if not snap.final and snap.error is None and _rank(snap.state) <= _rank(record.state):
            return
        record.version += 1
        record.state = snap.state
        record.message = snap.message
        if snap.backend is not None:
            record.started_at = snap.backend.started_at
            record.finished_at = snap.backend.finished_at
            record.running_s = snap.backend.running_s
        if snap.error is not None:
            record.error = snap.error
            record.final = True
            if record.reserved_micro_usd:
                self._s.ledger.release(record.job_id)
            return
        if snap.final:
            record.score = snap.score
            record.final = True
            if record.role is not JobRole.grader:
                record.settlement = self._s.ledger.settle(record.job_id, record.running_s)

    async def _resolve_datasets(self, repo_ids: list[str]) -> list[RepoRef]:
        if not repo_ids:
            return []
        try:
            return await workflow.execute_activity_method(
                JobsActivities.resolve_datasets,
                ResolveDatasets(repo_ids=repo_ids, denylist=self._setup.task.dataset_denylist),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None

    def _agent_job(self, job_id: str) -> JobRecord:
        record = self._s.jobs.get(job_id)
        if record is None or record.role is not JobRole.agent:
            raise ToolError(
                ErrorType.unknown_job,
                f"this episode has no job {job_id!r}; jobs_status lists its jobs",
                job_id=job_id,
            )
        return record

    def _succeeded_agent_job(self, job_id: str) -> JobRecord:
        record = self._agent_job(job_id)
        if record.state is not JobState.succeeded:
            raise ToolError(
                ErrorType.not_ready,
                f"job {job_id} is {record.state.value}; only a succeeded job's "
                "outputs can be evaluated",
                job_id=job_id,
                state=record.state.value,
            )
        return record

    async def _cancel_job(self, record: JobRecord) -> None:
        raise NotImplementedError

    async def _ask_watcher_to_look(self) -> None:
        handle = workflow.get_external_workflow_handle(self._setup.watcher_workflow_id)
        try:
            await handle.signal(SIGNAL_LOOK_NOW)
        except FailureError:
            pass  # no watcher is running, so no job of ours is live

    # -- server-wide caps ----------------------------------------------------------------------

    async def _account_reserve(self, amount_micro_usd: int) -> None:
        caps = self._setup.caps
        if caps.spend_cap_micro_usd is None:
            return
        try:
            await workflow.execute_activity_method(
                EpisodeActivities.reserve_server_spend,
                ServerSpend(
                    account_workflow_id=caps.account_workflow_id,
                    episode_id=self._setup.episode_id,
                    committed_micro_usd=self._s.ledger.committed_micro_usd,
                    cap_micro_usd=caps.spend_cap_micro_usd,
                ),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None

    async def _account_report(self) -> None:
        caps = self._setup.caps
        if caps.tracked:
            handle = workflow.get_external_workflow_handle(caps.account_workflow_id)
            try:
                await handle.signal(
                    AccountWorkflow.exposure,
                    Exposure(
                        episode_id=self._setup.episode_id,
                        committed_micro_usd=self._s.ledger.committed_micro_usd,
                    ),
                )
            except FailureError:
                pass

    async def _account_retire(self) -> None:
        caps = self._setup.caps
        if caps.tracked:
            handle = workflow.get_external_workflow_handle(caps.account_workflow_id)
            try:
                await handle.signal(AccountWorkflow.retire, self._setup.episode_id)
            except FailureError:
                pass

    # -- views ---------------------------------------------------------------------------------

    def _allowed_flavors(self) -> list[str]:
        return [f for f in self._setup.task.flavors if f in self._setup.prices]

    def _view(self, record: JobRecord, now: datetime) -> JobView:
        return job_view(self._setup.episode_id, record, now)

    def _deadline(self) -> datetime:
        return self._s.started_at + timedelta(seconds=self._setup.task.time_limit_s)

    def _deadline_passed(self) -> bool:
        return workflow.now() >= self._deadline()

    def _time_left_s(self) -> float:
        if self._s.end is not None:
            return 0.0
        return max(0.0, (self._deadline() - workflow.now()).total_seconds())

    def _steps_left(self) -> int:
        return max(0, self._setup.task.max_steps - self._s.steps_used)

    def _all_final(self) -> bool:
        return all(r.final for r in self._s.jobs.values())

    def _unconfirmed(self) -> list[str]:
        return [
            r.job_id
            for r in self._s.jobs.values()
            if r.state is JobState.cancelling and not r.final
        ]

    def _spend(self) -> ServiceSpend:
        return self._s.ledger.service_spend(final=self._all_final())

    def _result(self, call: ToolCall, data: dict[str, Any]) -> ToolResult:
        end = self._s.end
        metadata: dict[str, Any] = {
            "episode_id": self._setup.episode_id,
            "steps_used": self._s.steps_used,
            "steps_left": self._steps_left(),
            "time_left_s": round(self._time_left_s(), 3),
        }
        if self._setup.prices_simulated:
            metadata["prices_simulated"] = True
        reward = None
        if call.path == "step":  # only the step path carries reward and spend (DESIGN §9)
            metadata["service_spend"] = self._spend().model_dump(mode="json")
            if end is not None:
                metadata["episode_end"] = end.model_dump(mode="json", exclude_none=True)
                reward = end.reward
        return ToolResult(
            tool=call.tool, data=data, done=end is not None, reward=reward, metadata=metadata
        )
