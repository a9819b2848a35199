"""Every error of the system and every translation between its forms, in one place.

- `ErrorType`: what an agent can get back as data, `{"error": {"type", "message", ...}}`.
- `ToolError`: that error inside our code. Activities raise it; `agent_errors` turns it into a
  non-retryable `ApplicationError` typed by the enum; workflows turn a failed activity back into
  it with `tool_error_of`, and raise it to their callers with `application_error`.
- `GatewayCode` and `SessionError`: the gateway's own refusals, made before a request reaches an
  episode (transport-level: a bad session id, malformed JSON, Temporal unreachable).
- `workflow_is_gone` and `update_failure`: what Temporal's client errors mean, read from their
  types and status codes, never from their message text.

The translations import Temporal's classes where they use them, so that the error types alone
load no Temporal code: the backends and the contract use them in processes that have none (the
local backend runs as an unprivileged user on the system's Python in tests/local).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

from posttrain_env.limits import cut_text

if TYPE_CHECKING:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError, FailureError

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


class ErrorType(enum.StrEnum):
    """Every error an agent can get back. The first twelve are the specification's."""

    budget_exhausted = "budget_exhausted"
    flavor_not_allowed = "flavor_not_allowed"
    timeout_not_allowed = "timeout_not_allowed"
    invalid_script = "invalid_script"
    invalid_dependency = "invalid_dependency"
    dataset_not_allowed = "dataset_not_allowed"
    limit_reached = "limit_reached"
    not_ready = "not_ready"
    unknown_job = "unknown_job"
    not_allowed = "not_allowed"
    episode_over = "episode_over"
    hf_error = "hf_error"
    invalid_argument = "invalid_argument"
    # A request sent again whose answer the episode no longer keeps (DESIGN §9 "Dedup"): it
    # was run once and is never run again.
    already_answered = "already_answered"


ERROR_TYPES = frozenset(t.value for t in ErrorType)
# Not an agent-facing error: an evaluation refused because of its artifact, before it started
# (activities.backend.ArtifactRejected). The job's workflow turns it into a score of 0.
ARTIFACT_REJECTED = "artifact_rejected"
# Errors that retrying cannot fix (activity retry policies).
NON_RETRYABLE = sorted(ERROR_TYPES | {ARTIFACT_REJECTED})


class ToolError(Exception):
    """An error answered to the agent as data: `{"error": {"type", "message", ...}}`."""

    def __init__(self, type: ErrorType, message: str, **details: Any) -> None:
        # Messages may quote what an agent or a job sent: cut, so that no answer grows with it.
        message = cut_text(message)
        super().__init__(message)
        self.type = ErrorType(type)
        self.message = message
        self.details = details

    def envelope(self) -> dict[str, Any]:
        return {"error": {"type": self.type.value, "message": self.message, **self.details}}

    @classmethod
    def from_envelope(cls, data: dict[str, Any]) -> ToolError:
        body = dict(data["error"])
        return cls(ErrorType(body.pop("type")), body.pop("message"), **body)


def is_error(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


class GatewayCode(enum.StrEnum):
    """The gateway's own refusals (a client branches on these; tool errors are ErrorType)."""

    invalid_session = "INVALID_SESSION"  # malformed, or not a session id this server issued
    invalid_request_id = "INVALID_REQUEST_ID"
    invalid_json = "INVALID_JSON"  # not JSON, or nested deeper than MAX_JSON_DEPTH
    validation_error = "VALIDATION_ERROR"  # well-formed JSON, but not a valid request
    no_episode = "NO_EPISODE"  # the session has no episode yet
    payload_too_large = "PAYLOAD_TOO_LARGE"  # permanent: sending it again cannot succeed
    unavailable = "UNAVAILABLE"  # transient: Temporal could not be reached; send it again


class SessionError(Exception):
    """A request the gateway refuses before it reaches an episode; `code` is stable (a
    GatewayCode, or an ErrorType value for a refused reset)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message


# -- inside Temporal -------------------------------------------------------------------------------


def application_error(error: ToolError) -> ApplicationError:
    """`error` as a non-retryable ApplicationError typed by the enum (raised by activities and
    by workflow handlers)."""
    from temporalio.exceptions import ApplicationError

    return ApplicationError(error.message, error.details, type=error.type.value, non_retryable=True)


def agent_errors(fn: F) -> F:
    """An activity whose ToolErrors reach its workflow as typed, non-retryable failures."""

    @wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ToolError as err:
            raise application_error(err) from None

    return cast(F, wrapper)  # the same signature: what an interface declares stays checkable


def artifact_rejection(err: FailureError) -> str | None:
    """Why an evaluation's start was refused because of its artifact, or None."""
    from temporalio.exceptions import ActivityError, ApplicationError

    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type == ARTIFACT_REJECTED:
        return cause.message
    return None


def tool_error_of(err: FailureError) -> ToolError:
    """A failure (an activity's, a child's, an update's) as the agent-facing error it stands
    for: a typed ApplicationError keeps its type; anything else is the jobs service's fault."""
    from temporalio.exceptions import ActivityError, ApplicationError, FailureError

    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type in ERROR_TYPES:
        details: dict[str, Any] = {}
        if cause.details and isinstance(cause.details[0], dict):
            details = dict(cause.details[0])
        return ToolError(ErrorType(cause.type), cause.message, **details)
    reason = cause.message if isinstance(cause, FailureError) else str(err)
    return ToolError(ErrorType.hf_error, f"the jobs service failed: {reason}; try again later")


# -- Temporal's client errors ----------------------------------------------------------------------

# The SDK's type for an update whose workflow completed before answering it (sdk-python#735).
UPDATE_ON_COMPLETED_WORKFLOW = "AcceptedUpdateCompletedWorkflow"


def workflow_is_gone(err: Exception) -> bool:
    """True when Temporal says the workflow has completed (or never existed): an update or a
    signal to it can never be delivered. The dev server answers NOT_FOUND ("workflow execution
    already completed"), the test server NOT_FOUND ("update not found"), and an update accepted
    just before the end fails with UPDATE_ON_COMPLETED_WORKFLOW."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(err, RPCError):
        return err.status is RPCStatusCode.NOT_FOUND
    if isinstance(err, WorkflowUpdateFailedError):
        cause = err.cause
        return isinstance(cause, ApplicationError) and cause.type == UPDATE_ON_COMPLETED_WORKFLOW
    return False


def update_failure(err: WorkflowUpdateFailedError, what: str) -> ToolError:
    """A failed update to one of our workflows as the typed error its handler raised."""
    from temporalio.exceptions import ApplicationError

    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in ERROR_TYPES:
        return tool_error_of(cause)
    return ToolError(ErrorType.hf_error, f"{what} could not be updated: {err}")


# -- failures of the work around episodes (never an agent's tool error) ----------------------------
# Activities raise these as typed ApplicationErrors; the workflow above branches on the type.

# A turn of an agent (the rollout records the type): the agent's spec is wrong (never retried),
# or the agent failed (its LLM, its code, its process).
AGENT_INVALID = "agent_invalid"
AGENT_FAILED = "agent_failed"
# A campaign spec that cannot run: the campaign ends `invalid`, nothing started.
CAMPAIGN_INVALID = "campaign_invalid"


def artifact_rejected(reason: str) -> ApplicationError:
    """An evaluation refused because of its artifact, before it started (the backend's
    ArtifactRejected); non-retryable, and read back by `artifact_rejection`."""
    from temporalio.exceptions import ApplicationError

    return ApplicationError(reason, type=ARTIFACT_REJECTED, non_retryable=True)


def agent_failure(type: str, message: str, *, non_retryable: bool = True) -> ApplicationError:
    """A turn's failure typed AGENT_INVALID or AGENT_FAILED (the rollout's retry policy names
    both as non-retryable whatever the flag says; the flag keeps what each raise always said)."""
    from temporalio.exceptions import ApplicationError

    if type not in (AGENT_INVALID, AGENT_FAILED):
        raise ValueError(f"not an agent failure type: {type!r}")
    return ApplicationError(message, type=type, non_retryable=non_retryable)


def campaign_invalid(message: str) -> ApplicationError:
    """A campaign that cannot run (its spec, its tasks, its folder): non-retryable."""
    from temporalio.exceptions import ApplicationError

    return ApplicationError(message, type=CAMPAIGN_INVALID, non_retryable=True)
