"""SessionWorkflow: one per client session; owns "the current episode".

`reset` ends the current episode (cancelling its live jobs and waiting for confirmation) and
starts the next as an ABANDON child. If a cancellation is not confirmed within the episode's
`cancel_confirm_s`, the reset fails with an error naming the jobs, and the old episode stays
visible as cancelling. `close` ends the current episode as cancelled.

A session closes too once it is idle: its current episode has closed (every job final) and no
reset came for `IDLE_CLOSE`. Until then it stays open for a `reset`; a reset after that starts a
new run of the same workflow id (the gateway's update-with-start), so nothing is lost, and the
Temporal UI does not list every session an agent ever used as Running.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import EpisodesApi
    from posttrain_common.contracts.episode_calls import EndRequest, EpisodeClosed
    from posttrain_common.contracts.episodes import EpisodeSetup, PrepareEpisode
    from posttrain_common.failures import tool_error_of
    from posttrain_env.errors import ErrorType
    from posttrain_env.models import EndReason
    from workflows.episode.session_contract import ResetRequest, ResetResult, SessionState
    from workflows.episode.workflow import EpisodeInput, EpisodeWorkflow
    from workflows.ids import SIGNAL_EPISODE_CLOSED, episode_workflow_id
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import wait_until

# Beyond the episode's own confirmation window: time for its reply to travel.
REPLY_SLACK_S = 60
# How long a session whose episode has closed waits for a reset before it closes itself.
IDLE_CLOSE = timedelta(hours=1)
# Closing when idle: histories recorded before it waited for `close` alone. Asked only once the
# session is idle, so a session reset again within the bound records no marker.
IDLE_CLOSE_PATCH = "pt-session-idle-close-1"
# A cancel of the session from outside (the Temporal UI, `temporal workflow cancel`) ends its
# current episode as an operator's cancel and closes the session. Histories recorded before
# this closed at such a cancel, and replay so.
SESSION_OUTSIDE_CANCEL_PATCH = "pt-session-outside-cancel-1"


@workflow.defn
class SessionWorkflow:
    @workflow.init
    def __init__(self, state: SessionState) -> None:
        self._state = state
        self._replies: dict[str, EpisodeClosed] = {}
        self._busy = False
        self._idle_close = True  # False in runs recorded before IDLE_CLOSE_PATCH

    @workflow.run
    async def run(self, state: SessionState) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            if not workflow.patched(SESSION_OUTSIDE_CANCEL_PATCH):
                raise
            await self._cancelled_from_outside()

    async def _cancelled_from_outside(self) -> None:
        """End the current episode as an operator's cancel (it cancels its jobs and settles on
        its own) and close: nothing is left live for a client that is gone."""
        current = self._state.current
        workflow.logger.warning(
            "session %s was cancelled from outside; ending its episode %s",
            workflow.info().workflow_id,
            current.episode_id if current else None,
        )
        if current is not None:
            handle = workflow.get_external_workflow_handle(episode_workflow_id(current.episode_id))
            try:
                await handle.signal(
                    EpisodeWorkflow.end_requested,
                    EndRequest(reason=EndReason.cancelled_by_operator),
                )
            except FailureError:
                pass  # the episode has completed
        self._state.closed = True
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _run(self) -> None:
        while not self._should_stop():
            await workflow.wait_condition(
                lambda: self._should_stop() or (self._idle_close and self._idle())
            )
            if not self._should_stop():
                await self._close_if_still_idle()
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

    async def _close_if_still_idle(self) -> None:
        """Close the session if it stays idle for IDLE_CLOSE (see the module's docstring)."""
        if not workflow.patched(IDLE_CLOSE_PATCH):
            self._idle_close = False  # recorded before sessions closed when idle
            return
        # A timer of its own, never cancelled: a reset meanwhile leaves it to fire unheeded
        # (cancelling a timer as an update arrives is a race the test server mishandles).
        timer = asyncio.ensure_future(asyncio.sleep(IDLE_CLOSE.total_seconds()))
        await workflow.wait_condition(
            lambda: self._should_stop() or not self._idle() or timer.done()
        )
        if self._should_stop() or not self._idle():
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._idle():  # no reset slipped in while the handlers finished
            self._state.closed = True

    def _should_stop(self) -> bool:
        return self._state.closed or workflow.info().is_continue_as_new_suggested()

    def _idle(self) -> bool:
        """The current episode has closed (its jobs all final) and nothing is in flight."""
        current = self._state.current
        if current is None or self._busy:
            return False
        closed = self._replies.get(current.episode_id)
        return closed is not None and not closed.unconfirmed

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
