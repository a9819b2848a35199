"""Tool calls into an episode's workflow, as every edge (OpenEnv, MCP) makes them.

The update id is `<episode_id>:<request_id>`, so a retried request is answered once. A call to
an episode whose workflow has completed is answered as `episode_over` with the episode's final
state (or with its earlier answer, if the call was answered before the end). Every answer leaves
here worded for the call's path (`ToolResult.worded_for`: what to do after the end).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

from posttrain_common.contracts.episode_calls import (
    EpisodeStatus,
    ToolCall,
    ToolResult,
    episode_over,
)

# Built in the ground (a rollout's activity builds its calls the same way); the edge's name.
from posttrain_common.contracts.episode_calls import tool_call as tool_call
from posttrain_common.failures import workflow_is_gone
from posttrain_env.errors import ErrorType, GatewayCode, SessionError, ToolError
from posttrain_env.limits import MAX_UPDATE_BYTES
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id

log = logging.getLogger(__name__)
T = TypeVar("T")


class UnknownEpisode(LookupError):
    """No episode with this id exists."""


def update_id(episode_id: str, request_id: str) -> str:
    return f"{episode_id}:{request_id}"


async def call_tool(
    client: Client, episode_id: str, call: ToolCall, rpc_timeout: timedelta | None = None
) -> ToolResult:
    """Run one tool call; raises UnknownEpisode for an episode that never existed, and
    SessionError PAYLOAD_TOO_LARGE (permanent) for a call too large to send, which `tool_call`
    never builds: a payload over Temporal's limit would wedge the episode instead of failing."""
    encoded = await client.data_converter.encode([call])
    size = sum(payload.ByteSize() for payload in encoded)
    if size > MAX_UPDATE_BYTES:
        raise SessionError(
            GatewayCode.payload_too_large,
            f"the tool call is {size} bytes encoded; at most {MAX_UPDATE_BYTES} can be sent",
        )
    handle = client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(episode_id))

    async def send() -> ToolResult:
        return await handle.execute_update(
            EpisodeWorkflow.call_tool,
            call,
            id=update_id(episode_id, call.request_id),
            rpc_timeout=rpc_timeout,
        )

    try:
        result = await (send() if rpc_timeout is not None else wait_out_slow_polls(send))
        return result.worded_for(call.path)
    except (WorkflowUpdateFailedError, RPCError) as err:
        if not workflow_is_gone(err):
            raise
    return (await _answer_after_the_end(client, episode_id, call)).worded_for(call.path)


async def wait_out_slow_polls(send: Callable[[], Awaitable[T]]) -> T:
    """`send()`, sent again with the same update id whenever the SDK gives up waiting for the
    update's outcome (`WorkflowUpdateRPCTimeoutOrCancelledError` for a caller that was not
    cancelled). That only means one poll of a busy Temporal server did not answer in time (seen
    in a burst of 200 resets, issue 18); the update carries on, and the same id attaches to it
    again rather than running it twice. Without this the gateway answered UNAVAILABLE and the
    client had to re-send. Any other failure (Temporal unreachable, a refused update) is
    raised as before."""
    while True:
        try:
            return await send()
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller is going away: nothing waits for the answer
            log.info("waiting again for an update: a poll of a busy Temporal server timed out")


async def _answer_after_the_end(client: Client, episode_id: str, call: ToolCall) -> ToolResult:
    handle = client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(episode_id))
    try:
        answered = await handle.query(EpisodeWorkflow.result_of, call.request_id)
        if answered is None:  # a submit of the graded job, sent again: its grading's answer
            answered = await handle.query(EpisodeWorkflow.answer_again, call)
        status: EpisodeStatus = await handle.query(EpisodeWorkflow.status)
        again = answered is None and await handle.query(EpisodeWorkflow.answered, call.request_id)
    except RPCError as err:
        if workflow_is_gone(err):
            raise UnknownEpisode(episode_id) from None
        raise
    if answered is not None:  # the call was made before the end: the same answer again
        return answered
    error = episode_over(status.end)
    if again:
        error = ToolError(
            ErrorType.already_answered,
            f"request {call.request_id!r} was already answered and its answer is no longer kept",
            request_id=call.request_id,
        )
    assert status.metadata is not None
    return ToolResult(
        tool=call.tool,
        data=error.envelope(),
        done=True,
        reward=status.end.reward if status.end is not None else None,
        metadata=status.metadata,
    )
