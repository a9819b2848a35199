"""What an episode sends besides its answers (workflow code: deterministic): the reply to its
session's end request, the announcement that it closed, the `ToolAnswered` signal to a rollout
whose call it answered, and its audit record. None of them can fail the episode: a workflow that
is gone is logged; the audit record is retried until it is written (AUDIT_RETRY), and only a
failure that retrying cannot fix is logged instead.

When each is due is decided by the pure rules of `timing.py` (beside it).
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import AuditApi
    from posttrain_common.contracts.audit import AuditEnd, WriteAudit
    from posttrain_common.contracts.episode_calls import EpisodeClosed, ToolAnswered
    from posttrain_common.contracts.episodes import EpisodeSetup
    from posttrain_common.contracts.jobs import JobRole
    from workflows.cancellation import reraise_cancel
    from workflows.episode.rules import service_spend, unconfirmed
    from workflows.episode.state import EpisodeCarry
    from workflows.episode.timing import SessionReply, close_needs_announcing, reply_is_due
    from workflows.ids import SIGNAL_EPISODE_CLOSED, SIGNAL_TOOL_ANSWERED
    from workflows.policies import AUDIT_RETRY, AUDIT_TIMEOUT

# The episode's outside-cancel patch (workflows/episode/workflow.py): an audit write cancelled
# with the episode is written again, not given up.
OUTSIDE_CANCEL_PATCH = "pt-outside-cancel-1"


class EpisodeOutbox:
    def __init__(self, setup: EpisodeSetup, state: EpisodeCarry) -> None:
        self._setup = setup
        self._s = state
        self.reply = SessionReply()

    async def reply_if_due(self) -> None:
        """Tell the session the episode is closed, or which jobs did not confirm in time."""
        if not reply_is_due(self._setup, self._s, self.reply, workflow.now()):
            return
        assert self.reply.reply_to is not None
        self.reply.replied = True
        await self._tell_session(self.reply.reply_to, self._closed(unconfirmed(self._s)))

    async def announce_close(self) -> None:
        """Tell the session the episode is closed, so that it never signals a completed run."""
        session = self._setup.session_workflow_id
        if session is not None and close_needs_announcing(self._setup, self._s, self.reply):
            await self._tell_session(session, self._closed([]))

    async def tell_answered(self, workflow_id: str, request_id: str) -> None:
        """Tell a caller (a rollout) that its call `request_id` has its answer."""
        answered = ToolAnswered(request_id=request_id)
        await _signal(workflow_id, SIGNAL_TOOL_ANSWERED, answered, f"the caller of {request_id}")

    async def write_audit(self) -> None:
        """The audit record, written by an activity that reads this history itself (only
        ids and the end cross Temporal), retried until it lands. It never fails the episode."""
        end = self._s.end
        assert end is not None
        try:
            await workflow.execute_activity_method(
                AuditApi.write_audit,
                WriteAudit(
                    episode_id=self._setup.episode_id,
                    end=AuditEnd(
                        reason=end.reason.value,
                        reward=end.reward,
                        invalid_score=end.invalid_score,
                        replayed=end.replayed,
                        replay_miss=end.replay_miss,
                        replay_misses=end.replay_misses,
                    ),
                    now=workflow.now(),
                    contamination=self._s.contamination,
                    operator_actions=self._s.operator_actions,
                    settled_micro_usd={
                        r.job_id: r.settlement.cost_micro_usd
                        for r in self._s.jobs.values()
                        if r.settlement is not None
                    },
                    final_spend_micro_usd=self._s.ledger.settled_micro_usd,
                    final_states={
                        r.job_id: r.state.value for r in self._s.jobs.values() if r.final
                    },
                    stored_bytes={
                        r.job_id: r.settlement.stored_bytes
                        for r in self._s.jobs.values()
                        if r.settlement is not None and r.role is JobRole.agent
                    },
                    outputs_refused={
                        r.job_id: r.outputs_refused.message
                        for r in self._s.jobs.values()
                        if r.outputs_refused is not None
                    },
                    storage=self._s.ledger.service_spend(final=True).storage,
                ),
                start_to_close_timeout=AUDIT_TIMEOUT,
                retry_policy=AUDIT_RETRY,
            )
        except ActivityError as err:
            reraise_cancel(err, OUTSIDE_CANCEL_PATCH)  # the run writes it again after a cancel
            workflow.logger.warning("no audit record for %s: %s", self._setup.episode_id, err)

    def _closed(self, unconfirmed_jobs: list[str]) -> EpisodeClosed:
        assert self._s.end is not None
        return EpisodeClosed(
            episode_id=self._setup.episode_id,
            end=self._s.end,
            service_spend=service_spend(self._s),
            unconfirmed=unconfirmed_jobs,
        )

    async def _tell_session(self, session: str, closed: EpisodeClosed) -> None:
        whom = f"session of episode {self._setup.episode_id}"
        await _signal(session, SIGNAL_EPISODE_CLOSED, closed, whom)


async def _signal(workflow_id: str, signal: str, arg: BaseModel, whom: str) -> None:
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(signal, arg)
    except FailureError:
        workflow.logger.warning("%s is gone", whom)
