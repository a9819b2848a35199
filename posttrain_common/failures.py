"""Translations between the client's errors (`posttrain_env.errors`) and Temporal's failures,
for the server's layers.

- `agent_errors` turns an activity's ToolError into a non-retryable `ApplicationError` typed by
  the enum; workflows turn a failed activity back into it with `tool_error_of`, and raise it to
  their callers with `application_error`.
- `NON_RETRYABLE`: every failure type that retrying cannot fix (the activities' retry policies).
- `workflow_is_gone`, `update_failure` and `temporal_failure`: what Temporal's client errors
  mean, read from their types, status codes and details, never from their message text;
  `running_description`, a workflow's description while it runs; `EpisodeNotFound`, what the
  gateway and the operator's commands raise for an unknown episode.
- The failures of the work around episodes (artifact rejected, agent, campaign), typed.

Temporal's classes are imported where they are used, so that importing this module loads no
Temporal code: the backends use it in processes that have none (the local backend runs as an
unprivileged user on the system's Python in tests/local).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

from posttrain_env.errors import (
    AGENT_FAILED,
    AGENT_INVALID,
    ERROR_TYPES,
    ErrorType,
    GatewayCode,
    ToolError,
)

if TYPE_CHECKING:
    from temporalio.client import (
        WorkflowExecutionDescription,
        WorkflowHandle,
        WorkflowUpdateFailedError,
    )
    from temporalio.exceptions import ApplicationError, FailureError
    from temporalio.service import RPCError

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])

# Not an agent-facing error: an evaluation refused because of its artifact, before it started
# (activities.backends.interface.ArtifactRejected). The job's workflow turns it into a score of 0.
ARTIFACT_REJECTED = "artifact_rejected"
# Errors that retrying cannot fix (every activity retry policy names these).
NON_RETRYABLE = sorted(ERROR_TYPES | {ARTIFACT_REJECTED})


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


async def running_description(
    handle: WorkflowHandle[Any, Any],
) -> WorkflowExecutionDescription | None:
    """The workflow's description while it runs; None once it has closed or never existed."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    try:
        description = await handle.describe()
    except RPCError as err:
        if workflow_is_gone(err):
            return None
        raise
    return description if description.status == WorkflowExecutionStatus.RUNNING else None


class EpisodeNotFound(LookupError):
    """Temporal knows no episode of this id (never started, or past its retention); the
    gateway's `/episodes/<id>` routes answer 404, the operator's `episodes` commands exit 1."""


@dataclass(frozen=True)
class GatewayAnswer:
    """How the gateway answers a failed call to Temporal: a code clients branch on (only
    UNAVAILABLE is worth sending again), the HTTP status of a plain route, and the message."""

    code: GatewayCode
    status: int
    message: str

    @property
    def retryable(self) -> bool:
        return self.code is GatewayCode.unavailable

    def tool_error(self) -> ToolError:
        """The same answer as a tool's error (the per-episode MCP endpoint answers calls so):
        a request too large is the caller's argument; a refusal is the service's failure."""
        kind = (
            ErrorType.invalid_argument
            if self.code is GatewayCode.payload_too_large
            else ErrorType.hf_error
        )
        return ToolError(kind, self.message, code=self.code.value, retryable=self.retryable)


# RESOURCE_EXHAUSTED causes (Temporal's `ResourceExhaustedFailure` detail) that a later attempt
# does not outlast: storage and deployment quotas. Every other cause is a rate, concurrency or
# load limit (RPS_LIMIT, CONCURRENT_LIMIT, SYSTEM_OVERLOADED, BUSY_WORKFLOW, ...), which passes.
_QUOTA_CAUSES = frozenset(
    {
        "RESOURCE_EXHAUSTED_CAUSE_PERSISTENCE_STORAGE_LIMIT",
        "RESOURCE_EXHAUSTED_CAUSE_WORKER_DEPLOYMENT_LIMITS",
    }
)


def temporal_failure(err: RPCError) -> GatewayAnswer:
    """What a failed call to Temporal means for the caller, from its gRPC status (the SDK has
    already retried what its core retries, for up to 10 s):

    - transient (UNAVAILABLE, 503): the service is away, slow or busy: UNAVAILABLE,
      DEADLINE_EXCEEDED, CANCELLED, ABORTED, INTERNAL and UNKNOWN (what a restarting server, a
      moving shard or a failing-over database answers), and RESOURCE_EXHAUSTED for a rate or
      load limit (it carries a `ResourceExhaustedFailure` detail naming the cause);
    - too large (PAYLOAD_TOO_LARGE, 413): RESOURCE_EXHAUSTED without that detail, which is how
      gRPC itself refuses a message over its size limit;
    - refused (REFUSED, 422): everything else, INVALID_ARGUMENT first (Temporal's own answer to
      a payload over its blob limit), and NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
      PERMISSION_DENIED, UNAUTHENTICATED, UNIMPLEMENTED, OUT_OF_RANGE, DATA_LOSS, and storage
      or deployment quotas. Sending the same request again cannot succeed."""
    from temporalio.service import RPCStatusCode

    status = err.status
    transient = {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.UNKNOWN,
    }
    cause = _exhausted_cause(err) if status is RPCStatusCode.RESOURCE_EXHAUSTED else None
    if status in transient or (cause is not None and cause not in _QUOTA_CAUSES):
        return GatewayAnswer(
            GatewayCode.unavailable,
            503,
            "the episode service is temporarily unavailable; send the same request again",
        )
    if status is RPCStatusCode.RESOURCE_EXHAUSTED and cause is None:
        return GatewayAnswer(
            GatewayCode.payload_too_large,
            413,
            "the episode service refused the request as too large; sending it again cannot succeed",
        )
    name = status.name if isinstance(status, RPCStatusCode) else str(status)
    return GatewayAnswer(
        GatewayCode.refused,
        422,
        f"the episode service refused the request ({name}); sending it again cannot succeed",
    )


def _exhausted_cause(err: RPCError) -> str | None:
    """The cause named by a `ResourceExhaustedFailure` detail of `err`, or None without one."""
    from google.protobuf.message import DecodeError
    from temporalio.api.enums.v1 import ResourceExhaustedCause
    from temporalio.api.errordetails.v1 import ResourceExhaustedFailure

    try:
        details = list(err.grpc_status.details)
    except DecodeError:
        return None
    for detail in details:
        if detail.Is(ResourceExhaustedFailure.DESCRIPTOR):
            failure = ResourceExhaustedFailure()
            detail.Unpack(failure)
            if failure.cause in ResourceExhaustedCause.values():
                return ResourceExhaustedCause.Name(failure.cause)
            return f"RESOURCE_EXHAUSTED_CAUSE_{failure.cause}"  # newer than this SDK: a limit
    return None


def update_failure(err: WorkflowUpdateFailedError, what: str) -> ToolError:
    """A failed update to one of our workflows as the typed error its handler raised."""
    from temporalio.exceptions import ApplicationError

    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in ERROR_TYPES:
        return tool_error_of(cause)
    return ToolError(ErrorType.hf_error, f"{what} could not be updated: {err}")


# -- failures of the work around episodes (never an agent's tool error) ----------------------------
# Activities raise these as typed ApplicationErrors; the workflow above branches on the type.

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
