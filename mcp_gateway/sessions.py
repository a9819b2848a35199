"""Sessions resolved to Temporal workflows, with no state a restart could lose (DESIGN §9).

A session id is a capability (128 random bits and a 128-bit HMAC tag of them under the server
key: `SessionIds`) that the gateway never stores or logs: the session's workflow id is a hash
of it, so any replica, or this one after a restart, finds the same session from the id alone.
The only memory is a cache of session -> current episode, re-resolved when a call answers
`episode_over` (another replica may have reset the session) or the cached episode is unknown.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import uuid
from collections import OrderedDict
from datetime import UTC, datetime

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from mcp_gateway.episode_calls import UnknownEpisode, call_tool, wait_out_slow_polls
from mcp_gateway.episode_control import END_WAIT
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_common.failures import workflow_is_gone
from posttrain_common.keys import ServerKey
from posttrain_env.errors import ErrorType, GatewayCode, SessionError, ToolError, is_error
from posttrain_env.limits import MAX_REQUEST_ID_CHARS
from workflows.episode.session import ResetRequest, ResetResult, SessionState, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id, session_workflow_id

_SESSION_ID = re.compile(r"[0-9a-f]{64}")
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")
CACHE_SIZE = 10_000
# How long `close` waits for the episode's jobs to be confirmed cancelled before answering
# "closing" (the close itself is durable once Temporal has accepted it): as long as DELETE
# waits, for the same reasons (mcp_gateway/episode_control.py).
CLOSE_WAIT = END_WAIT


class SessionIds:
    """Session ids that only this deployment can mint: 128 random bits and a 128-bit HMAC tag
    of them under the server key. Any replica checks one without storing anything, and an id a
    client made up (or took from another deployment) is refused (DESIGN §10)."""

    def __init__(self, key: ServerKey) -> None:
        self._key = key

    def mint(self) -> str:
        nonce = secrets.token_hex(16)
        return nonce + self._key.session_tag(nonce)

    def check(self, session_id: object) -> str:
        """`session_id` if this deployment minted it. Raises SessionError INVALID_SESSION."""
        if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
            raise SessionError(GatewayCode.invalid_session, "malformed session id")
        nonce, tag = session_id[:32], session_id[32:]
        if not hmac.compare_digest(tag.encode(), self._key.session_tag(nonce).encode()):
            raise SessionError(
                GatewayCode.invalid_session,
                "unknown session id: sessions are created by the server (reset without a "
                "session id, or openenv/session/create)",
            )
        return session_id


def request_id_of(value: object) -> str:
    """The client's request id, or a fresh one for clients that send none (stock clients)."""
    if value is None or value == "":
        return uuid.uuid4().hex
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise SessionError(
            GatewayCode.invalid_request_id,
            f"request_id must be 1-{MAX_REQUEST_ID_CHARS} printable ASCII characters",
        )
    return value


class Sessions:
    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue
        self._episodes: OrderedDict[str, str] = OrderedDict()

    async def reset(self, session_id: str, task_id: object, request_id: str) -> ResetResult:
        """End the session's episode and start one of `task_id`. Raises SessionError typed by
        the error enum (unknown task, a cap reached, a cancellation left unconfirmed)."""
        if not isinstance(task_id, str) or not task_id:
            raise SessionError(
                ErrorType.invalid_argument.value, "reset needs task_id, e.g. reset(task_id=...)"
            )

        try:
            request = ResetRequest(task_id=task_id)
        except ValueError:
            raise SessionError(ErrorType.invalid_argument.value, "task_id is too long") from None

        def start_operation() -> WithStartWorkflowOperation:  # single-use: one per send
            return WithStartWorkflowOperation(
                SessionWorkflow.run,
                SessionState(),
                id=session_workflow_id(session_id),
                task_queue=self._task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )

        async def send() -> ResetResult:
            # The same update id each time: sent again, it attaches to the reset in flight.
            return await self._client.execute_update_with_start_workflow(
                SessionWorkflow.reset,
                request,
                start_workflow_operation=start_operation(),
                id=f"reset:{request_id}",
            )

        try:
            result = await wait_out_slow_polls(send)
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if not (isinstance(cause, ApplicationError) and cause.type):
                raise
            # Typed by the session's reset handler (an ErrorType: unknown task, a cap, ...).
            raise SessionError(cause.type, cause.message) from None
        self._remember(session_id, result.episode_id)
        return result

    async def close(self, session_id: str) -> bool:
        """End the session's live episode as cancelled. True once every job is confirmed."""
        handle = self._client.get_workflow_handle_for(
            SessionWorkflow.run, session_workflow_id(session_id)
        )
        self._episodes.pop(session_id, None)
        try:
            update = await handle.start_update(
                SessionWorkflow.close,
                id=f"close:{uuid.uuid4().hex}",
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
        except RPCError as err:
            if workflow_is_gone(err):
                return True  # never reset, or already closed: nothing is live
            raise
        result = asyncio.ensure_future(update.result())
        try:
            done, _ = await asyncio.wait({result}, timeout=CLOSE_WAIT.total_seconds())
        finally:
            if not result.done():  # still cancelling (or our caller left): the close goes on
                result.cancel()
                # The SDK reports the cancelled poll as WorkflowUpdateRPCTimeoutOrCancelledError,
                # not as a cancellation (so asyncio.timeout let it through as an error, logged
                # with a traceback): retrieve it, nothing waits for it.
                result.add_done_callback(lambda r: r.cancelled() or r.exception())
        if not done:
            return False
        result.result()  # raises what the close raised
        return True

    async def episode_of(self, session_id: str, *, refresh: bool = False) -> str:
        """The session's current episode. Raises SessionError NO_EPISODE before any reset."""
        if not refresh:
            cached = self._episodes.get(session_id)
            if cached is not None:
                self._episodes.move_to_end(session_id)
                return cached
        handle = self._client.get_workflow_handle_for(
            SessionWorkflow.run, session_workflow_id(session_id)
        )
        try:
            episode_id = await handle.query(SessionWorkflow.current_episode)
        except RPCError as err:
            if not workflow_is_gone(err):
                raise
            episode_id = None
        if episode_id is None:
            raise SessionError(
                GatewayCode.no_episode, "no episode in this session: call reset(task_id=...)"
            )
        self._remember(session_id, episode_id)
        return episode_id

    async def call(self, session_id: str, call: ToolCall) -> ToolResult:
        """Run a tool call in the session's current episode (the update id makes it once-only)."""
        episode_id = await self.episode_of(session_id)
        try:
            result = await call_tool(self._client, episode_id, call)
        except UnknownEpisode:
            result = None
        if result is not None and not _episode_over(result):
            return result
        # The cache may be stale: another replica reset this session since we looked.
        current = await self.episode_of(session_id, refresh=True)
        if current == episode_id and result is not None:
            return result
        try:
            return await call_tool(self._client, current, call)
        except UnknownEpisode:
            raise SessionError(
                GatewayCode.no_episode, "the session's episode no longer exists"
            ) from None

    async def status(self, episode_id: str) -> EpisodeStatus:
        handle = self._client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )
        status = await handle.query(EpisodeWorkflow.status)
        return status.as_of(datetime.now(UTC))  # a query's clock is its last task's

    def _remember(self, session_id: str, episode_id: str) -> None:
        self._episodes[session_id] = episode_id
        self._episodes.move_to_end(session_id)
        while len(self._episodes) > CACHE_SIZE:
            self._episodes.popitem(last=False)


def _episode_over(result: ToolResult) -> bool:
    data = result.data
    return is_error(data) and ToolError.from_envelope(data).type is ErrorType.episode_over
