"""The errors a client sees, defined once: the server raises and answers these same types.

- `ErrorType`: what an agent can get back as data, `{"error": {"type", "message", ...}}`.
- `ToolError`: that error as an exception (the server's activities and workflows raise it; the
  client rebuilds it from an answer with `ToolError.from_envelope`).
- `GatewayCode` and `SessionError`: the gateway's own refusals, made before a request reaches an
  episode (transport-level: a bad session id, malformed JSON, Temporal unreachable).

No Temporal here: the server's translations between these and Temporal's failures live in
`posttrain_common/failures.py`.
"""

from __future__ import annotations

import enum
from typing import Any

from posttrain_env.limits import MAX_ERROR_DETAIL_CHARS, cut_text


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
    # The replay backend (a stand-in for the jobs service, for training-time rollouts) has no
    # recorded outcome for this job's script and inputs; `nearest` names the recorded keys
    # closest to it and which inputs differ.
    not_recorded = "not_recorded"


ERROR_TYPES = frozenset(t.value for t in ErrorType)


class ToolError(Exception):
    """An error answered to the agent as data: `{"error": {"type", "message", ...}}`."""

    def __init__(self, type: ErrorType, message: str, **details: Any) -> None:
        # Messages and details may quote what an agent or a job sent (a requirement, a job id,
        # an unknown key): cut here, where they enter, so that no answer grows with them.
        message = cut_text(message)
        super().__init__(message)
        self.type = ErrorType(type)
        self.message = message
        self.details = {
            key: cut_text(value, MAX_ERROR_DETAIL_CHARS) if isinstance(value, str) else value
            for key, value in details.items()
        }

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
    # Permanent: Temporal refused the request itself (invalid, not allowed, not found); sending
    # it again cannot succeed.
    refused = "REFUSED"
    unavailable = "UNAVAILABLE"  # transient: Temporal could not be reached; send it again


class SessionError(Exception):
    """A request the gateway refuses before it reaches an episode; `code` is stable (a
    GatewayCode, or an ErrorType value for a refused reset)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message


# How an agent's turn failed, as its runner process reports it and the rollout records it (never
# an agent's tool error): the agent's spec is wrong (never retried), or the agent failed (its LLM,
# its code, its process).
AGENT_INVALID = "agent_invalid"
AGENT_FAILED = "agent_failed"
