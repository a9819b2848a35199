"""A cancel from outside (the Temporal UI, `temporal workflow cancel`, an SDK), in workflow code.

Temporal delivers a workflow's cancellation to whatever its main task awaits: a timer or a
condition raises `asyncio.CancelledError`, but an activity in flight is cancelled too and its
await raises `ActivityError` caused by `CancelledError`. Our workflows never cancel their own
activities, so that error means the workflow was cancelled: `reraise_cancel` turns it back into
the one exception a workflow's cancel handler catches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError


def reraise_cancel(err: ActivityError, patch: str) -> None:
    """Raise asyncio.CancelledError when `err` is an activity cancelled with its workflow.

    Under `patch` (the workflow's outside-cancel patch): histories recorded before it took such
    an error as the activity's failure, and replay so."""
    if isinstance(err.cause, CancelledError) and workflow.patched(patch):
        raise asyncio.CancelledError from err


def unawaited_child(handle: asyncio.Future[Any]) -> None:
    """An ABANDON child nobody awaits (its end comes by signal): when it is terminated from
    outside its handle fails, and asyncio would log "Task exception was never retrieved" with a
    stack trace. Its failure is read here and told in one line (the reconciler winds it down)."""

    def read(done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is not None:
            workflow.logger.warning(
                "child workflow closed without completing: %s", done.exception()
            )

    handle.add_done_callback(read)
