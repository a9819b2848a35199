"""SessionWorkflow: one per client session; owns "the current episode".

`reset` ends the current episode (cancelling its live jobs and waiting for confirmation) and
starts the next as an ABANDON child. If a cancellation is not confirmed within the episode's
`cancel_confirm_s`, the reset fails with an error naming the jobs, and the old episode stays
visible as cancelling. `close` ends the current episode as cancelled.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import EpisodesApi
    from posttrain_common.contracts.episode_calls import EndRequest, EpisodeClosed
    from posttrain_common.contracts.episodes import EpisodeSetup, PrepareEpisode
    from posttrain_common.failures import tool_error_of
    from posttrain_env.errors import ErrorType
    from posttrain_env.models import EndReason
    from workflows.episode.workflow import EpisodeInput, EpisodeWorkflow
    from workflows.ids import SIGNAL_EPISODE_CLOSED, episode_workflow_id
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import wait_until

# Beyond the episode's own confirmation window: time for its reply to travel.
REPLY_SLACK_S = 60


class ResetRequest(BaseModel):
    task_id: str = Field(min_length=1, max_length=100)


class ResetResult(BaseModel):
    episode_id: str
    workflow_id: str
    setup: EpisodeSetup


class SessionState(BaseModel):
    current: EpisodeSetup | None = None
    closed: bool = False


@workflow.defn
class SessionWorkflow:
    @workflow.init
    def __init__(self, state: SessionState) -> None:
        self._state = state
        self._replies: dict[str, EpisodeClosed] = {}
        self._busy = False

    @workflow.run
    async def run(self, state: SessionState) -> None:
        await workflow.wait_condition(
            lambda: self._state.closed or workflow.info().is_continue_as_new_suggested()
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self._state.closed:
            workflow.continue_as_new(self._state)

    @workflow.update
    async def reset(self, request: ResetRequest) -> ResetResult:
        """End the current episode, then start a new one of `request.task_id`."""
        await workflow.wait_condition(lambda: not self._busy)
        self._busy = True
        try:
            await self._end_current(EndReason.reset, fail_if_unconfirmed=True)
            episode_id = f"ep-{workflow.uuid4().hex[:16]}"
            try:
                setup: EpisodeSetup = await workflow.execute_activity_method(
                    EpisodesApi.prepare_episode,
                    PrepareEpisode(
                        task_id=request.task_id,
                        episode_id=episode_id,
                        session_workflow_id=workflow.info().workflow_id,
                    ),
                    start_to_close_timeout=READ_TIMEOUT,
                    retry_policy=READ_RETRY,
                )
            except ActivityError as err:
                error = tool_error_of(err)
                raise ApplicationError(
                    error.message, error.details, type=error.type.value, non_retryable=True
                ) from None
            workflow_id = episode_workflow_id(episode_id)
            await workflow.start_child_workflow(
                EpisodeWorkflow.run,
                EpisodeInput(setup=setup),
                id=workflow_id,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
            self._state.current = setup
            return ResetResult(episode_id=episode_id, workflow_id=workflow_id, setup=setup)
        finally:
            self._busy = False

    @workflow.update
    async def close(self) -> EpisodeClosed | None:
        """End the live episode as cancelled (reward None, jobs cancelled) and the session."""
        await workflow.wait_condition(lambda: not self._busy)
        self._busy = True
        try:
            closed = await self._end_current(EndReason.cancelled, fail_if_unconfirmed=False)
            self._state.closed = True
            return closed
        finally:
            self._busy = False

    @workflow.signal(name=SIGNAL_EPISODE_CLOSED)
    def episode_closed(self, closed: EpisodeClosed) -> None:
        self._replies[closed.episode_id] = closed

    @workflow.query
    def current_episode(self) -> str | None:
        return self._state.current.episode_id if self._state.current else None

    async def _end_current(
        self, reason: EndReason, *, fail_if_unconfirmed: bool
    ) -> EpisodeClosed | None:
        current = self._state.current
        if current is None:
            return None
        episode_id = current.episode_id
        earlier = self._replies.pop(episode_id, None)
        if earlier is not None and not earlier.unconfirmed:
            return earlier  # the episode told us it closed: its workflow has completed
        handle = workflow.get_external_workflow_handle(episode_workflow_id(episode_id))
        try:
            await handle.signal(
                EpisodeWorkflow.end_requested,
                EndRequest(reason=reason, reply_to=workflow.info().workflow_id),
            )
        except FailureError:
            return None  # the episode's workflow has completed: every job is final
        await wait_until(
            lambda: episode_id in self._replies,
            timedelta(seconds=current.cancel_confirm_s + REPLY_SLACK_S),
        )
        closed = self._replies.get(episode_id)
        if closed is not None and not closed.unconfirmed:
            return closed
        if fail_if_unconfirmed:
            jobs = ", ".join(closed.unconfirmed) if closed else "(no reply from the episode)"
            raise ApplicationError(
                f"episode {episode_id} could not be ended: the cancellation of job(s) {jobs} was "
                f"not confirmed within {current.cancel_confirm_s} s; they may still be billing. "
                "The episode stays cancelling; reset again to retry.",
                {
                    "episode_id": episode_id,
                    "unconfirmed_jobs": closed.unconfirmed if closed else [],
                },
                type=ErrorType.hf_error.value,
                non_retryable=True,
            )
        return closed
