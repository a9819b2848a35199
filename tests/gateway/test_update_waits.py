"""The gateway waits out a slow poll of a busy Temporal server instead of answering UNAVAILABLE
(`mcp_gateway.episode_calls.wait_out_slow_polls`), and only that: a caller that is going away
is not kept, and any other failure reaches the caller at once."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from mcp_gateway.episode_calls import wait_out_slow_polls


class Sends:
    """A stand-in for one update call, failing the first `timeouts` times as a poll that timed
    out does (the update itself carries on in Temporal)."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.timeouts:
            raise WorkflowUpdateRPCTimeoutOrCancelledError()
        return "the update's answer"


def test_an_update_whose_poll_timed_out_is_waited_for_again_until_it_answers() -> None:
    send = Sends(timeouts=3)
    assert asyncio.run(wait_out_slow_polls(send)) == "the update's answer"
    assert send.calls == 4


def test_a_caller_that_is_cancelled_is_not_kept_waiting() -> None:
    calls = 0

    async def scenario() -> None:
        sent = asyncio.Event()

        async def send() -> str:
            nonlocal calls
            calls += 1
            if calls > 1:
                return "sent again after the caller went away"
            sent.set()
            try:
                await asyncio.Event().wait()  # an update that is slow to answer
            except asyncio.CancelledError:
                # What the SDK raises when the caller's wait is cancelled.
                raise WorkflowUpdateRPCTimeoutOrCancelledError() from None
            return "never reached"

        waiting = asyncio.ensure_future(wait_out_slow_polls(send))
        await asyncio.wait_for(sent.wait(), 5)  # the update is out, waiting for its answer
        waiting.cancel()
        with pytest.raises(WorkflowUpdateRPCTimeoutOrCancelledError):
            await waiting

    asyncio.run(scenario())
    assert calls == 1


def test_any_other_failure_of_the_update_reaches_the_caller_at_once() -> None:
    calls = 0

    async def send() -> str:
        nonlocal calls
        calls += 1
        raise RPCError("the episode service is down", RPCStatusCode.UNAVAILABLE, b"")

    with pytest.raises(RPCError):
        asyncio.run(wait_out_slow_polls(send))
    assert calls == 1
