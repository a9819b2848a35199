"""An episode seen and ended by its id, for clients that hold only its token (MCP-only clients):
`GET` and `DELETE /episodes/<id>` (DESIGN §9 "MCP-only clients").

Reading is the episode's `status` query; ending is the `end_requested` signal with reason
`abandoned` (the client gave up without submitting: reward 0, as for the other limits; every
live job cancelled), then waiting until the episode's
workflow completes, which it does once every job is confirmed final. Nothing is kept here.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from posttrain_common.contracts.episode_calls import EndRequest, EpisodeStatus, JobsPage
from posttrain_common.failures import EpisodeNotFound, workflow_is_gone
from posttrain_env.models import EndReason
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id

# How long DELETE (and a session's close) waits for the jobs' cancellations to be confirmed
# before it answers "ending" (the end itself is durable once the signal is in). A backend that
# can confirm does so at once (local: the kill; Hugging Face: the cancel call's own looks), so
# the wait covers a loaded Temporal's round trips; a cancellation still unconfirmed then is one
# the job's workflow will have to ask for again (after 15 s, doubling), and the client is told
# at once rather than held for it (it was 30 s: issue 45). `GET /episodes/<id>` shows the end.
END_WAIT = timedelta(seconds=10)
EpisodeState = Literal["running", "ending", "ended"]


class InvalidPage(ValueError):
    """A page of an episode's jobs it cannot answer: a cursor it did not give."""


class EpisodeControl:
    def __init__(self, client: Client) -> None:
        self._client = client

    def _handle(self, episode_id: str) -> Any:
        return self._client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )

    async def status(self, episode_id: str, page: JobsPage | None = None) -> EpisodeStatus:
        """The episode as it is now, with one page of its jobs (the first unless `page` names
        another). Raises EpisodeNotFound, and InvalidPage for a cursor the episode refused."""
        handle = self._handle(episode_id)
        try:
            if page is None:
                status = await handle.query(EpisodeWorkflow.status)
            else:
                status = await handle.query(EpisodeWorkflow.status, page)
            return status.as_of(datetime.now(UTC))  # a query's clock is its last task's
        except RPCError as err:
            if workflow_is_gone(err):
                raise EpisodeNotFound(episode_id) from None
            raise
        except WorkflowQueryFailedError as err:
            # The query is pure: it fails only on a cursor it did not give (a typed message).
            raise InvalidPage(str(err)) from None

    async def end(self, episode_id: str, wait: timedelta = END_WAIT) -> EpisodeStatus:
        """End the episode as abandoned (an episode already over keeps its end) and wait up to
        `wait` for every job to be confirmed final. Raises EpisodeNotFound."""
        handle = self._handle(episode_id)
        try:
            await handle.signal(
                EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.abandoned)
            )
        except RPCError as err:
            if not workflow_is_gone(err):
                raise
            return await self.status(episode_id)  # completed: nothing is live
        try:
            async with asyncio.timeout(wait.total_seconds()):
                await handle.result()
        except TimeoutError:
            pass  # still cancelling: the answer says which jobs
        return await self.status(episode_id)


def state_of(status: EpisodeStatus) -> EpisodeState:
    if not status.done:
        return "running"
    return "ended" if status.service_spend.final and not status.cancelling else "ending"


def episode_body(status: EpisodeStatus) -> dict[str, Any]:
    """What `GET /episodes/<id>` answers: the episode's progress, spend and end."""
    return {
        "episode_id": status.episode_id,
        "task_id": status.task_id,
        "state": state_of(status),
        "done": status.done,
        "steps_used": status.steps_used,
        "steps_left": status.steps_left,
        "time_left_s": status.time_left_s,
        "service_spend": status.service_spend.model_dump(mode="json"),
        # `reward` always present, null when there is none (DESIGN §10).
        "episode_end": {
            **status.end.model_dump(mode="json", exclude_none=True),
            "reward": status.end.reward,
        }
        if status.end
        else None,
        # One page of the jobs, oldest first (`?cursor=<jobs_next_cursor>&limit=<n>` for the
        # next); `jobs_total` counts them all.
        "jobs": status.jobs,
        "jobs_total": status.jobs_total,
        "jobs_next_cursor": status.jobs_next_cursor,
        "cancelling": status.cancelling,
    }
