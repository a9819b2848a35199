"""Turn a failed activity into the agent-facing error it stands for."""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from posttrain_env.models import ErrorType, ToolError

_TYPES = {t.value for t in ErrorType}


def tool_error_of(err: FailureError) -> ToolError:
    """An activity's typed error as a ToolError; anything else is the jobs service's fault."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type in _TYPES:
        details: dict[str, Any] = {}
        if cause.details and isinstance(cause.details[0], dict):
            details = dict(cause.details[0])
        return ToolError(ErrorType(cause.type), cause.message, **details)
    reason = cause.message if isinstance(cause, FailureError) else str(err)
    return ToolError(ErrorType.hf_error, f"the jobs service failed: {reason}; try again later")
