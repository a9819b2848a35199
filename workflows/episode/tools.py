"""The tools of an episode (workflow code: deterministic).

Each handler is bound to its entry in the one tool registry (`posttrain_env.tools`) with
`@handles`, and receives that entry's validated arguments. A handler returns its answer as a
dict or raises ToolError, which the update handler turns into the `{"error": ...}` envelope.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from job_launcher.requirements import merged_dependencies, validate_script, validate_text
    from posttrain_common.contracts.activities import JobsApi
    from posttrain_common.contracts.contamination import reward_under_policy
    from posttrain_common.contracts.episodes import EpisodeSetup
    from posttrain_common.contracts.jobs import JobLogs, JobRole, RepoRef
    from posttrain_common.failures import tool_error_of
    from posttrain_env.errors import ErrorType, ToolError
    from posttrain_env.models import (
        ContaminationSummary,
        EndReason,
        EpisodeEnd,
        JobIdArgs,
        JobsLogsArgs,
        JobsStatusArgs,
        JobsSubmitArgs,
        JobsWaitArgs,
        NoArgs,
        ReplayMiss,
        ToolArgs,
    )
    from posttrain_env.tools import (
        DEV_EVALUATE,
        JOBS_CANCEL,
        JOBS_LOGS,
        JOBS_STATUS,
        JOBS_SUBMIT,
        JOBS_WAIT,
        LIST_HARDWARE,
        SUBMIT,
        TASK_INFO,
        Tool,
        parse_tool_args,
    )
    from workflows.episode.contamination import check_contamination
    from workflows.episode.jobs import EpisodeJobs
    from workflows.episode.misses import replay_miss_of
    from workflows.episode.paging import page_of
    from workflows.episode.rules import (
        agent_job,
        allowed_flavors,
        check_concurrency,
        check_dev_evaluation,
        check_flavor_and_timeout,
        check_not_grading,
        job_view,
        succeeded_agent_job,
    )
    from workflows.episode.state import EpisodeCarry, JobRecord
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import wait_until

A = TypeVar("A", bound=ToolArgs)
# Patch ids (workflow.patched): changes to the commands this code makes.
SYNTAX_OF_THE_JOBS_PYTHON = "jobs-submit-checks-syntax-for-the-jobs-python"
Answer = dict[str, Any]


class EndEpisode(Protocol):
    """How a tool ends the episode: reason, reward, why a score was invalid, and the
    contamination check's counts (a submit's end)."""

    async def __call__(
        self,
        reason: EndReason,
        reward: float | None,
        invalid_score: str | None = None,
        *,
        contamination: ContaminationSummary | None = None,
        replay_miss: ReplayMiss | None = None,
    ) -> None: ...


_HANDLERS: dict[str, Callable[[Any, Any], Awaitable[Answer]]] = {}
# A long call sent again attaches to the work in flight (see EpisodeTools, "sent again").
ATTACH_REPEATED_CALLS = "attach-repeated-long-calls"
# ... and takes no step, so that it is answered even when no step is left.
REPEATS_TAKE_NO_STEP = "repeated-long-calls-take-no-step"
# A `dev_evaluate` whose evaluation was not recorded ends the episode `replay_miss` (before, it
# was answered `not_recorded` and the episode went on), and so does a `submit`'s (before: it
# ended `score_failed`). Asked only on a miss (workflows/episode/misses.py), so that no other
# history holds its marker.
REPLAY_MISS_ENDS_PATCH = "pt-replay-miss-ends-1"
# What interrupts a grading before its grader is final, and how its answer says so.
INTERRUPTED_BY = {
    EndReason.reset: "the episode was reset",
    EndReason.cancelled: "the episode was cancelled (its session closed, or an operator)",
    EndReason.cancelled_by_operator: "the episode was cancelled by an operator",
    EndReason.abandoned: "the episode was abandoned (DELETE /episodes/<episode_id>)",
}
# Only a reset or a cancel interrupts a grading; the deadline does not.
GRADING_INTERRUPTED_BY = frozenset(
    {EndReason.reset, EndReason.cancelled, EndReason.cancelled_by_operator}
)


def handles(
    tool: Tool[A],
) -> Callable[[Callable[[EpisodeTools, A], Awaitable[Answer]]], Callable[..., Awaitable[Answer]]]:
    """Bind the decorated method to `tool`'s registry entry; its argument type is the entry's."""

    def bind(handler: Callable[[EpisodeTools, A], Awaitable[Answer]]) -> Callable[..., Any]:
        if tool.name in _HANDLERS:
            raise RuntimeError(f"tool {tool.name!r} has two handlers")
        _HANDLERS[tool.name] = handler
        return handler

    return bind


class EpisodeTools:
    def __init__(
        self, setup: EpisodeSetup, state: EpisodeCarry, jobs: EpisodeJobs, end: EndEpisode
    ) -> None:
        self._setup = setup
        self._s = state
        self._jobs = jobs
        self._end = end

    async def run(self, tool: str, arguments: dict[str, Any]) -> Answer:
        """Validate the arguments against the tool's entry and run its handler."""
        args = parse_tool_args(tool, arguments)
        return await _HANDLERS[tool](self, args)

    # -- the tools -----------------------------------------------------------------------------

    @handles(TASK_INFO)
    async def task_info(self, _args: NoArgs) -> Answer:
        task, model = self._setup.task, self._setup.base_model
        answer: Answer = {
            "task_id": task.id,
            "prompt": task.prompt,
            "base_model": {"repo_id": model.repo_id, "revision": model.revision},
            **task.limits_view(self._setup.prices),
        }
        if self._setup.job_limits is not None:
            # What one job may use per flavor here, and what this host cannot enforce.
            answer["job_limits"] = self._setup.job_limits.model_dump()
        return answer

    @handles(LIST_HARDWARE)
    async def list_hardware(self, _args: NoArgs) -> Answer:
        return {"flavors": [self._setup.prices[f].view() for f in allowed_flavors(self._setup)]}

    @handles(JOBS_SUBMIT)
    async def jobs_submit(self, args: JobsSubmitArgs) -> Answer:
        check_not_grading(self._s, JOBS_SUBMIT.name)
        check_flavor_and_timeout(self._setup, args.flavor, args.timeout_minutes)
        if self._jobs.known_start_checks_syntax:  # checked by the job's start itself
            validate_text(args.script)
        elif self._jobs.known_runs or workflow.patched(SYNTAX_OF_THE_JOBS_PYTHON):
            validate_text(args.script)
            await self._jobs.check_syntax(args.script)
        else:  # episodes started before: the server's own compile
            validate_script(args.script)
        dependencies = merged_dependencies(args.script, args.dependencies)
        check_concurrency(self._setup, self._s)
        datasets = await self._jobs.resolve_datasets(args.datasets)
        record = await self._jobs.start(
            JobRole.agent,
            args.flavor,
            args.timeout_minutes,
            script=args.script,
            dependencies=dependencies,
            datasets=datasets,
        )
        return self._view(record)

    @handles(JOBS_WAIT)
    async def jobs_wait(self, args: JobsWaitArgs) -> Answer:
        record = agent_job(self._s, args.job_id)
        version = record.version
        if not record.final:
            await self._jobs.ask_watcher_to_look(record)
            await wait_until(
                lambda: record.version != version or self._s.end is not None,
                timedelta(seconds=args.timeout_s),
            )
        return {**self._view(record), "changed": record.version != version}

    @handles(JOBS_STATUS)
    async def jobs_status(self, args: JobsStatusArgs) -> Answer:
        if args.job_id is not None:
            return self._view(agent_job(self._s, args.job_id))
        # A page, oldest first: the answer stays bounded however many jobs the episode has.
        agent_jobs = [r for r in self._s.jobs.values() if r.role is JobRole.agent]
        page = page_of(self._setup.episode_id, "agent", agent_jobs, args.cursor, args.limit)
        return {
            "jobs": [self._view(r) for r in page.items],
            "total": page.total,
            "next_cursor": page.next_cursor,
        }

    @handles(JOBS_LOGS)
    async def jobs_logs(self, args: JobsLogsArgs) -> Answer:
        record = agent_job(self._s, args.job_id)
        if record.backend_ref is None:
            return {"job_id": record.job_id, "lines": [], "truncated": {"lines": 0, "bytes": 0}}
        try:
            logs = await workflow.execute_activity_method(
                JobsApi.job_logs,
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

    @handles(JOBS_CANCEL)
    async def jobs_cancel(self, args: JobIdArgs) -> Answer:
        check_not_grading(self._s, JOBS_CANCEL.name)
        record = agent_job(self._s, args.job_id)
        if not record.final:
            await self._jobs.cancel(record)
            # Unconfirmed in time: answered as `cancelling`; jobs_status shows the rest.
            await wait_until(lambda: record.final, timedelta(seconds=self._setup.cancel_confirm_s))
        return self._view(record)

    @handles(DEV_EVALUATE)
    async def dev_evaluate(self, args: JobIdArgs) -> Answer:
        task = self._setup.task
        check_not_grading(self._s, DEV_EVALUATE.name)
        job = succeeded_agent_job(self._s, args.job_id)
        attached = await self._attach_to_dev_evaluation(job)
        if attached is not None:
            return attached
        check_dev_evaluation(self._setup, self._s)
        check_concurrency(self._setup, self._s)
        self._s.dev_evaluations += 1
        try:
            evaluation = await self._jobs.start(
                JobRole.dev,
                task.eval_flavor,
                task.eval_timeout_minutes,
                artifact_ref=job.backend_ref,
                evaluated_job_id=job.job_id,
                datasets=evaluation_datasets(self._setup),
            )
        except ToolError as err:
            self._s.dev_evaluations -= 1  # one that never started uses up no allowance
            miss = replay_miss_of(err, "dev_evaluate", job.job_id)
            if miss is not None and workflow.patched(REPLAY_MISS_ENDS_PATCH):
                # Answered `not_recorded`, and the episode ends: what follows would be played
                # against a service that no longer stands in for the real one.
                await self._end(EndReason.replay_miss, None, replay_miss=miss)
            raise
        return await self._dev_evaluation_answer(job, evaluation)

    @handles(SUBMIT)
    async def submit(self, args: JobIdArgs) -> Answer:
        task = self._setup.task
        job = succeeded_agent_job(self._s, args.job_id)
        attached = await self._attach_to_grading(job)
        if attached is not None:
            return attached
        if self._s.submitting:
            raise ToolError(ErrorType.not_allowed, "a submission is already being graded")
        self._s.submitting = True
        try:
            grader = await self._jobs.start(
                JobRole.grader,
                task.eval_flavor,
                math.ceil(task.score_timeout_s / 60),
                timeout_s=task.score_timeout_s,
                artifact_ref=job.backend_ref,
                evaluated_job_id=job.job_id,
                reserve=False,
                datasets=evaluation_datasets(self._setup),
            )
        except ToolError as err:
            self._s.submitting = False
            miss = replay_miss_of(err, "submit", job.job_id)
            if miss is not None and workflow.patched(REPLAY_MISS_ENDS_PATCH):
                # No recording of this grading: not the grader's fault, and no measurement.
                await self._end(EndReason.replay_miss, None, replay_miss=miss)
            else:
                await self._end(EndReason.score_failed, None, None)
            return {"job_id": job.job_id, "score": None, "reason": err.message}
        # Only a reset or an operator's cancel interrupts grading; the deadline does not.
        await workflow.wait_condition(
            lambda: (
                grader.final
                or (self._s.end is not None and self._s.end.reason in GRADING_INTERRUPTED_BY)
            )
        )
        score = grader.score
        if score is None:
            self._s.submitting = False
            await self._end(EndReason.score_failed, None, None)
            return grading_answer(job.job_id, grader, self._s.end)
        reward = score.score if score.valid else 0.0
        # Before the reward is final, still `submitting` (the deadline waits for it too).
        report = await check_contamination(self._setup) if self._s.end is None else None
        self._s.submitting = False
        summary = None
        if report is not None:
            self._s.contamination = report
            summary = report.summary
            reward = reward_under_policy(reward, summary)
        await self._end(
            EndReason.submitted,
            reward,
            None if score.valid else score.reason,
            contamination=summary,
        )
        return grading_answer(job.job_id, grader, self._s.end)

    # -- long calls sent again (issue 20) --------------------------------------------------------
    # A client that gave up waiting (the OpenAI Agents SDK after 5 s, the MCP Inspector after
    # 60 s) leaves the call running in the episode; an agent then calls again. The call sent
    # again attaches to the work in flight, or is answered from the work done: never a second
    # grader, a second evaluation or a second charge. Behind a patch: the old code started a
    # second dev evaluation, or refused a second submit at once.

    # Such a call starts nothing, so it takes no step (`takes_no_step`): with a client that
    # gives up after 5 s, a grading of minutes would otherwise cost a step every 5 s, and a
    # submit that used the last step could not be asked again for its result.

    def takes_no_step(self, tool: str, arguments: dict[str, Any]) -> bool:
        """True for a call that will attach to, or be answered from, the work an earlier call
        started: a `submit` of the job being graded, a `dev_evaluate` of a job whose dev
        evaluation is running or has scored. The episode neither counts it nor refuses it at
        the step limit. Asked before the call runs, with what its handler will find."""
        job_id = arguments.get("job_id")
        if not isinstance(job_id, str):
            return False
        if tool == SUBMIT.name:
            repeat = self._grading_of(job_id) is not None
        elif tool == DEV_EVALUATE.name:
            repeat = not self._s.submitting and self._dev_evaluation_of(job_id) is not None
        else:
            return False
        return repeat and workflow.patched(REPEATS_TAKE_NO_STEP)

    def _dev_evaluation_of(self, job_id: str) -> JobRecord | None:
        """The dev evaluation of agent job `job_id` that is running or has scored, if any."""
        earlier = [
            e
            for e in self._evaluations_of(JobRole.dev, job_id)
            if not e.final or e.score is not None
        ]
        return earlier[-1] if earlier else None

    def _grading_of(self, job_id: str) -> JobRecord | None:
        """The grader of agent job `job_id` while its submit is in flight, if any."""
        graders = self._evaluations_of(JobRole.grader, job_id)
        return graders[-1] if self._s.submitting and graders else None

    async def _attach_to_dev_evaluation(self, job: JobRecord) -> Answer | None:
        """The answer of `job`'s dev evaluation that is running (once it ends) or has scored,
        or None when there is none to attach to (a new one then starts)."""
        earlier = self._dev_evaluation_of(job.job_id)
        if earlier is None or not workflow.patched(ATTACH_REPEATED_CALLS):
            return None
        return await self._dev_evaluation_answer(job, earlier)

    async def _attach_to_grading(self, job: JobRecord) -> Answer | None:
        """The answer of the grading of `job` in flight, once it ends; None when `job` is not
        being graded."""
        grader = self._grading_of(job.job_id)
        if grader is None or not workflow.patched(ATTACH_REPEATED_CALLS):
            return None
        # Until the submit that started the grading ends the episode (after the contamination
        # check, when the task has one), or a reset or cancel interrupts it.
        await workflow.wait_condition(
            lambda: (grader.final and not self._s.submitting) or self._grading_interrupted()
        )
        return grading_answer(job.job_id, grader, self._s.end)

    def answer_after_the_end(self, tool: str, arguments: dict[str, Any]) -> Answer | None:
        """A `submit` of the graded job sent again once the episode ended by its grading: the
        grading's answer (the reward stands as it was). None for any other call."""
        end = self._s.end
        if tool != SUBMIT.name or end is None:
            return None
        if end.reason not in (EndReason.submitted, EndReason.score_failed, EndReason.replay_miss):
            return None
        job_id = arguments.get("job_id")
        graders = [r for r in self._evaluations_of(JobRole.grader, str(job_id)) if r.final]
        if not graders:
            return None
        return grading_answer(graders[-1].evaluated_job_id or "", graders[-1], end)

    def _evaluations_of(self, role: JobRole, job_id: str) -> list[JobRecord]:
        """`role` evaluations of the agent job `job_id`, oldest first."""
        return [r for r in self._s.jobs.values() if r.role is role and r.evaluated_job_id == job_id]

    def _grading_interrupted(self) -> bool:
        """Only a reset or an operator's cancel interrupts grading; the deadline does not."""
        end = self._s.end
        return end is not None and end.reason in GRADING_INTERRUPTED_BY

    async def _dev_evaluation_answer(self, job: JobRecord, evaluation: JobRecord) -> Answer:
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

    # -- helpers -------------------------------------------------------------------------------

    def _view(self, record: JobRecord) -> Answer:
        return job_view(self._setup.episode_id, record, workflow.now()).model_dump(mode="json")


def grading_answer(job_id: str, grader: JobRecord, end: EpisodeEnd | None = None) -> Answer:
    """What `submit` answers once its grading ended: the hidden-split score (0 when the score
    line was invalid), or `score: None` with the reason the grader gave none. When the episode
    ended by this grading, `score` is its reward (0 for a flagged episode under the task's
    `zero_reward` policy) and `contamination` the check's counts."""
    score = grader.score
    if score is None:
        interrupted = INTERRUPTED_BY.get(end.reason) if end is not None else None
        if interrupted is not None:
            # Cut short before the grader was final (it is being cancelled): not its failure.
            reason = f"{interrupted} before its grading finished: the submission has no score"
        else:
            reason = grader.message or f"the grader job ended {grader.state.value}"
        return {"job_id": job_id, "score": None, "reason": reason}
    reward = score.score if score.valid else 0.0
    answer = {"job_id": job_id, "split": "hidden", **score.model_dump(), "score": reward}
    if end is not None and end.reason is EndReason.submitted and end.contamination is not None:
        answer["score"] = end.reward
        answer["contamination"] = end.contamination.model_dump(mode="json", exclude_none=True)
    return answer


# Every entry of the registry has exactly one handler (also checked by a test).
HANDLED_TOOLS = frozenset(_HANDLERS)


def evaluation_datasets(setup: EpisodeSetup) -> list[RepoRef]:
    """The task's own datasets for its evaluation jobs, at their pinned commits. Empty for every
    task that declares none, so such an evaluation's command is the one it always was (no
    patch: histories of those tasks replay unchanged)."""
    return [RepoRef(repo_id=d.repo_id, revision=d.revision) for d in setup.task.evaluation_datasets]
