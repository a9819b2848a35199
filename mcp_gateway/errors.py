"""The gateway's own refusals: requests refused before they reach an episode.

Tool errors are data answered by the episode (`posttrain_env.models.ErrorType`); these are the
transport-level answers the gateway gives itself, each with a stable code a client can branch on.
"""

from __future__ import annotations

import enum


class GatewayCode(enum.StrEnum):
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
