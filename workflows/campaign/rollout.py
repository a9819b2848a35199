"""RolloutWorkflow: one agent driving one episode to its end, as one attempt of a rollout.

Workflow id `rollout/<campaign>/<task>/<agent>/<epoch>/a<attempt>`. The episode is started as
an ABANDON child at the commit the campaign pinned. Each agent turn is an activity on the agent
task queue (`posttrain-env agent-worker`); each of the turn's tool calls is sent to the episode
exactly as the gateway sends one (an update with id `<episode_id>:t<turn>c<index>`, accepted but
not awaited, by a short activity) and its answer is read back through `result_of` when the
episode signals that it answered (or on a fallback timer). The conversation lives in the
campaign's folder; this workflow holds its head, so a worker killed mid-rollout resumes the
same conversation. When the agent stops, runs out of turns or passes its LLM cap, the episode is
ended `abandoned` (reward 0). The attempt's record is appended, then the campaign is told.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.campaigns.records import RecordError
    from posttrain_common.contracts.activities import AgentsApi, CampaignsApi, EpisodesApi
    from posttrain_common.contracts.campaigns import (
        AgentTurn,
        CallRef,
        FinishAttempt,
        OpenConversation,
    )
    from posttrain_common.contracts.episode_calls import EndRequest, EpisodeClosed, ToolAnswered
    from posttrain_common.contracts.episodes import EpisodeSetup, PrepareEpisode
    from posttrain_common.failures import tool_error_of
    from posttrain_env.agents.conversation import BaseModelRef, TaskBrief
    from posttrain_env.errors import AGENT_FAILED, AGENT_INVALID, ErrorType
    from posttrain_env.limits import CONTINUE_AS_NEW_HISTORY_BYTES
    from posttrain_env.models import EndReason
    from workflows.campaign.rollout_contract import (
        RolloutCarry,
        RolloutInput,
        RolloutResult,
        RolloutStatus,
    )
    from workflows.campaign.rollout_rules import attempt_record, rollout_result
    from workflows.cancellation import reraise_cancel, unawaited_child
    from workflows.episode.workflow import EpisodeInput, EpisodeWorkflow
    from workflows.history import history_is_long
    from workflows.ids import (
        SIGNAL_EPISODE_CLOSED,
        SIGNAL_ROLLOUT_FINISHED,
        SIGNAL_TOOL_ANSWERED,
        episode_workflow_id,
        rollout_episode_id,
    )
    from workflows.policies import READ_RETRY, READ_TIMEOUT
    from workflows.waiting import Alarm, wait_until

# A cancel of a rollout from outside (the Temporal UI, `temporal workflow cancel`) ends it as the
# campaign's cancel does. Histories recorded before this closed at such a cancel, and replay so.
ROLLOUT_OUTSIDE_CANCEL_PATCH = "pt-rollout-outside-cancel-1"

# The server-wide caps refused the episode: try again after this long, doubling up to the cap.
CAPACITY_RETRY_S = 30
CAPACITY_RETRY_MAX_S = 600
# A turn may run `turn_timeout_s` in its process; this is the slack for starting it.
TURN_SLACK = timedelta(seconds=120)
# A worker killed mid-activity is noticed when the activity's heartbeats stop, this long after
# the last one (`activities/campaigns/agent_turns.py` beats every 5 s,
# `activities/campaigns/activities.py` every 2),
# not at its start-to-close timeout: a rollout killed mid-call stalled a minute before.
TURN_HEARTBEAT = timedelta(seconds=15)
CALL_HEARTBEAT = timedelta(seconds=10)
# A worker killed mid-turn: the turn runs again elsewhere (answered from the store if it was
# done). The agent's own failures are final for the attempt (the campaign may retry it).
TURN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
    non_retryable_error_types=[AGENT_INVALID, AGENT_FAILED],
)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)
CAPACITY_ERRORS = frozenset({ErrorType.limit_reached, ErrorType.budget_exhausted})


class AttemptFailed(Exception):
    """The attempt cannot go on for an infrastructure reason (recorded as an `error`)."""

    def __init__(self, error: RecordError) -> None:
        super().__init__(error.message)
        self.error = error


@workflow.defn
class RolloutWorkflow:
    @workflow.init
    def __init__(self, inp: RolloutInput) -> None:
        self._inp = inp
        self._s = inp.carry or RolloutCarry(started_at=workflow.now())
        self._answered: set[str] = set()

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        try:
            await self._play()
        except AttemptFailed as failed:
            self._s.error, self._s.play_end = failed.error, "error"
        except asyncio.CancelledError:
            if not workflow.patched(ROLLOUT_OUTSIDE_CANCEL_PATCH):
                raise
            self._cancelled_from_outside()
        try:
            return await self._finish()
        except asyncio.CancelledError:
            if not workflow.patched(ROLLOUT_OUTSIDE_CANCEL_PATCH):
                raise
            # Temporal delivers a workflow's cancellation once: this pass runs to its end.
            self._cancelled_from_outside()
            return await self._finish()

    def _cancelled_from_outside(self) -> None:
        """Cancelled through Temporal (the UI, `temporal workflow cancel`): as the campaign's
        cancel: its episode ends (its jobs are cancelled) and the attempt is recorded."""
        workflow.logger.warning("rollout %s was cancelled from outside", self._inp.rollout_id)
        self._s.cancel_requested = True
        if self._s.play_end is None:
            self._s.play_end = "cancelled"

    async def _finish(self) -> RolloutResult:
        """End the episode, record the attempt and tell the campaign."""
        inp = self._inp
        await self._close_episode()
        record = attempt_record(inp, self._s, workflow.now())
        try:
            await workflow.execute_activity_method(
                CampaignsApi.finish_attempt,
                FinishAttempt(record=record, episode_id=self._s.episode_id),
                start_to_close_timeout=READ_TIMEOUT,
                heartbeat_timeout=CALL_HEARTBEAT,
                retry_policy=STORE_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, ROLLOUT_OUTSIDE_CANCEL_PATCH)
            raise
        result = rollout_result(record, self._s)
        try:
            await workflow.get_external_workflow_handle(inp.campaign_workflow_id).signal(
                SIGNAL_ROLLOUT_FINISHED, result
            )
        except FailureError:
            workflow.logger.warning("campaign of %s is gone", inp.rollout_id)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    # -- signals and queries -------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_TOOL_ANSWERED)
    def tool_answered(self, answered: ToolAnswered) -> None:
        self._answered.add(answered.request_id)

    @workflow.signal(name=SIGNAL_EPISODE_CLOSED)
    def episode_closed(self, closed: EpisodeClosed) -> None:
        if closed.episode_id == self._s.episode_id and not closed.unconfirmed:
            self._s.closed = closed

    @workflow.query
    def resume_input(self) -> RolloutInput:
        """What a new run needs to go on from here (the reconciler starts one, cancelling, when
        this run was terminated from outside)."""
        return self._inp.model_copy(update={"carry": self._s})

    @workflow.signal
    def cancel(self) -> None:
        """The campaign is cancelled: end the episode (its jobs are cancelled) and finish."""
        self._s.cancel_requested = True

    @workflow.query
    def status(self) -> RolloutStatus:
        return RolloutStatus(
            rollout_id=self._inp.rollout_id,
            attempt=self._inp.attempt,
            episode_id=self._s.episode_id,
            turns=self._s.turns,
            llm_micro_usd=self._s.llm_micro_usd,
            play_end=self._s.play_end,
            waiting=self._s.waiting,
            cancel_requested=self._s.cancel_requested,
            closed=self._s.closed is not None,
        )

    # -- the play ------------------------------------------------------------------------------

    async def _play(self) -> None:
        inp, s = self._inp, self._s
        if s.play_end is not None:
            return
        if s.episode_id is None and not await self._start_episode():
            s.play_end = "cancelled"
            return
        agent = inp.agent
        while True:
            if s.cancel_requested:
                s.play_end = "cancelled"
                return
            if s.closed is not None:  # the episode ended by itself (its time limit)
                s.play_end = "done"
                return
            if s.turns >= agent.max_turns:
                s.play_end = "max_turns"
                return
            if agent.llm_cap_micro_usd and s.llm_micro_usd >= agent.llm_cap_micro_usd:
                s.play_end = "llm_cap"
                return
            if self._history_is_long():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"carry": s}))
            if await self._turn():
                return

    async def _turn(self) -> bool:
        """One agent turn and its calls; True when the play is over."""
        inp, s = self._inp, self._s
        assert s.conversation is not None and s.episode_id is not None
        number = s.turns + 1
        try:
            summary = await workflow.execute_activity_method(
                AgentsApi.agent_turn,
                AgentTurn(
                    campaign_id=inp.campaign_id,
                    attempt_key=inp.attempt_key,
                    number=number,
                    agent=inp.agent,
                    conversation=s.conversation,
                ),
                task_queue=inp.agent_task_queue,
                start_to_close_timeout=timedelta(seconds=inp.agent.turn_timeout_s) + TURN_SLACK,
                heartbeat_timeout=TURN_HEARTBEAT,
                retry_policy=TURN_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, ROLLOUT_OUTSIDE_CANCEL_PATCH)
            raise AttemptFailed(_record_error(err, AGENT_FAILED)) from None
        s.turns = number
        s.usage = s.usage + summary.usage
        s.llm_micro_usd += inp.agent.prices.cost_micro_usd(
            summary.usage.prompt_tokens, summary.usage.completion_tokens
        )
        s.conversation = summary.conversation
        if summary.kind == "stop":
            s.play_end = "stop"
            return True
        for index in range(summary.calls):
            if await self._call(number, index):
                return True
        return False

    async def _call(self, number: int, index: int) -> bool:
        """Send one call and wait for its answer; True when the play is over."""
        inp, s = self._inp, self._s
        assert s.conversation is not None and s.episode_id is not None
        if s.cancel_requested:
            s.play_end = "cancelled"
            return True
        ref = CallRef(
            campaign_id=inp.campaign_id,
            attempt_key=inp.attempt_key,
            number=number,
            index=index,
            episode_id=s.episode_id,
            reply_to=workflow.info().workflow_id,
            conversation=s.conversation,
        )
        state = await self._store_call(CampaignsApi.send_call, ref)
        alarm = Alarm()
        while not state.answered:
            await alarm.wait(
                lambda: ref.request_id in self._answered or s.cancel_requested,
                inp.answer_poll_s,
            )
            if s.cancel_requested:
                s.play_end = "cancelled"
                return True
            state = await self._store_call(CampaignsApi.collect_answer, ref)
        s.conversation = state.conversation
        if state.done:
            s.play_end = "done"
        return state.done

    async def _store_call(self, method, ref: CallRef):  # type: ignore[no-untyped-def]
        try:
            return await workflow.execute_activity_method(
                method,
                ref,
                start_to_close_timeout=READ_TIMEOUT,
                heartbeat_timeout=CALL_HEARTBEAT,
                retry_policy=STORE_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, ROLLOUT_OUTSIDE_CANCEL_PATCH)
            raise AttemptFailed(_record_error(err, "tool_call_failed")) from None

    # -- the episode ---------------------------------------------------------------------------

    async def _start_episode(self) -> bool:
        """Prepare and start the attempt's episode, waiting while the server-wide caps refuse
        it (that delays the rollout, never fails it). False if cancelled while waiting."""
        inp, s = self._inp, self._s
        episode_id = rollout_episode_id(inp.rollout_id, inp.attempt)
        delay = CAPACITY_RETRY_S
        while True:
            try:
                setup: EpisodeSetup = await workflow.execute_activity_method(
                    EpisodesApi.prepare_episode,
                    PrepareEpisode(
                        task_id=inp.task_id,
                        episode_id=episode_id,
                        session_workflow_id=workflow.info().workflow_id,
                        base_model_revision=inp.base_model.revision,
                    ),
                    start_to_close_timeout=READ_TIMEOUT,
                    retry_policy=READ_RETRY,
                )
                break
            except ActivityError as err:
                reraise_cancel(err, ROLLOUT_OUTSIDE_CANCEL_PATCH)
                error = tool_error_of(err)
                if error.type not in CAPACITY_ERRORS:
                    failure = RecordError(type=error.type.value, message=error.message)
                    raise AttemptFailed(failure) from None
                s.waiting = error.message
                if await wait_until(lambda: s.cancel_requested, timedelta(seconds=delay)):
                    return False
                delay = min(delay * 2, CAPACITY_RETRY_MAX_S)
        s.waiting = None
        # The episode carries its campaign (`PtCampaign`), so operators can list its episodes.
        setup = setup.model_copy(update={"campaign_id": inp.campaign_id})
        child = await workflow.start_child_workflow(
            EpisodeWorkflow.run,
            EpisodeInput(setup=setup),
            id=episode_workflow_id(episode_id),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
        unawaited_child(child)  # its close comes by signal
        s.episode_id = episode_id
        task = setup.task
        brief = TaskBrief(
            task_id=task.id,
            reference_task=task.family or task.id,
            prompt=task.prompt,
            base_model=BaseModelRef(
                repo_id=setup.base_model.repo_id, revision=setup.base_model.revision
            ),
            limits=task.limits_view(setup.prices),
            episode_id=episode_id,
        )
        s.conversation = await workflow.execute_activity_method(
            CampaignsApi.open_conversation,
            OpenConversation(campaign_id=inp.campaign_id, brief=brief),
            start_to_close_timeout=READ_TIMEOUT,
            heartbeat_timeout=CALL_HEARTBEAT,
            retry_policy=STORE_RETRY,
        )
        return True

    async def _close_episode(self) -> None:
        """End the episode unless it ended by itself, and wait until it closed (every job final,
        the spend settled): an attempt is recorded only with its final spend."""
        s = self._s
        if s.episode_id is None or s.closed is not None:
            return
        reason: EndReason | None = None
        if s.play_end in ("error", "cancelled"):
            reason = EndReason.cancelled
        elif s.play_end != "done":
            reason = EndReason.abandoned
        if reason is not None:
            handle = workflow.get_external_workflow_handle(episode_workflow_id(s.episode_id))
            try:
                await handle.signal(EpisodeWorkflow.end_requested, EndRequest(reason=reason))
            except FailureError:
                pass  # it completed already: its close announcement is on its way or here
        await workflow.wait_condition(lambda: s.closed is not None)

    def _history_is_long(self) -> bool:
        return history_is_long(CONTINUE_AS_NEW_HISTORY_BYTES, self._inp.continue_as_new_events)


def _record_error(err: ActivityError, default_type: str) -> RecordError:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type:
        return RecordError(type=cause.type, message=cause.message)
    message = cause.message if isinstance(cause, FailureError) else str(err)
    return RecordError(type=default_type, message=message)
