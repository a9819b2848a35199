"""The gateway's metrics hooks: tool-call latency and errors, size refusals, and `/metrics`.

Declared in `posttrain_common.metrics`. `POSTTRAIN_METRICS=off` turns every hook into a plain
await and the route into a 404. On: a call costs two clock reads, a label lookup and an
observation (a few microseconds against the milliseconds of a Temporal update).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.responses import Response
from temporalio.service import RPCError

from mcp_gateway.episode_calls import UnknownEpisode
from posttrain_common.contracts.episode_calls import ToolCall, ToolResult
from posttrain_common.failures import temporal_failure
from posttrain_common.metrics import PAYLOAD_REFUSALS, TOOL_CALL_ERRORS, TOOL_CALL_SECONDS
from posttrain_env.errors import ErrorType, GatewayCode, SessionError
from posttrain_env.tools import tool_catalog

# Label values are these sets only: an agent's made-up tool name or error type must not make
# a new series.
OTHER = "other"
ERROR_KINDS = frozenset(
    {e.value for e in ErrorType} | {c.value.lower() for c in GatewayCode} | {"unknown_episode"}
)


class GatewayMetrics:
    """What the gateway's edges report; one per app (`create_app`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._tools = frozenset(tool["name"] for tool in tool_catalog())

    async def timed(self, call: ToolCall, answer: Awaitable[ToolResult]) -> ToolResult:
        """`await answer`, timed under the call's tool and path; an error answer, or one of
        the exceptions a tool call raises, is counted by kind. A cancelled wait (a client that
        went away) is neither timed nor counted."""
        if not self.enabled:
            return await answer
        tool = call.tool if call.tool in self._tools else OTHER
        started = time.perf_counter()
        try:
            result = await answer
        except SessionError as err:
            if err.code == GatewayCode.payload_too_large:
                PAYLOAD_REFUSALS.labels("tool_call").inc()
            self._error(tool, str(err.code).lower())
            raise
        except UnknownEpisode:
            self._error(tool, "unknown_episode")
            raise
        except RPCError as err:
            self._error(tool, temporal_failure(err).code.value.lower())
            raise
        except Exception:
            self._error(tool, "internal")
            raise
        TOOL_CALL_SECONDS.labels(tool, call.path).observe(time.perf_counter() - started)
        error = result.data.get("error")
        if isinstance(error, dict):
            self._error(tool, str(error.get("type")))
        return result

    def refused(self, kind: str) -> None:
        """A request refused for its size before it became a call."""
        if self.enabled:
            PAYLOAD_REFUSALS.labels(kind).inc()

    @staticmethod
    def _error(tool: str, kind: str) -> None:
        TOOL_CALL_ERRORS.labels(tool, kind if kind in ERROR_KINDS else OTHER).inc()


async def metrics_endpoint() -> Response:
    """`GET /metrics`: the process's registry in Prometheus' text format (the gateway's series,
    and a worker's when it runs in this process). Written in a thread: with every tool, path
    and error kind in use it takes ~7 ms, which the event loop should not stall for."""
    return Response(
        await asyncio.to_thread(generate_latest, REGISTRY), media_type=CONTENT_TYPE_LATEST
    )
