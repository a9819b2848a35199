"""Hub errors in the backend's terms.

A Hub that does not answer usefully (408, 429, 5xx, a transport error, a call out of time) is
`HubTransientError`: a retryable failure, retried by the activity's policy alone (the library's
own retries are off: `activities/backends/hf/http.py`); a 429's reset, or a `Retry-After`, becomes
the
next attempt's delay. 401, 402, 403 and every other 4xx are `ToolError(hf_error)` with a message
that names what to fix; retrying cannot make them succeed, so they are not retried. Messages name
what failed and the status, never a request header (which holds the token).
"""

from __future__ import annotations

from datetime import timedelta

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from temporalio.exceptions import ApplicationError

from activities.backends.hf.http import HubBusy, HubNotAnswering
from activities.backends.interface import TransientBackendError
from posttrain_env.errors import ErrorType, ToolError


def _xet_authentication_error() -> type[Exception]:
    """hf_xet's refusal of a token (a PermissionError); the upload of a job's script goes
    through hf_xet, which makes its own requests."""
    try:
        import hf_xet
    except ImportError:  # pragma: no cover - hf_xet ships with huggingface_hub here
        return PermissionError
    return getattr(hf_xet, "XetAuthenticationError", PermissionError)


XetAuthenticationError = _xet_authentication_error()

BILLING_URL = "https://huggingface.co/settings/billing"
TOKENS_URL = "https://huggingface.co/settings/tokens"

# What `translate` knows; anything else propagates as it is.
TRANSLATED: tuple[type[Exception], ...] = (
    HfHubHTTPError,
    HubNotAnswering,
    OfflineModeIsEnabled,
    XetAuthenticationError,
    httpx2.TransportError,
    ConnectionError,
    TimeoutError,
)


class HubTransientError(TransientBackendError, ApplicationError):
    """A failure a later attempt may not have. An ApplicationError so that it can carry the
    Hub's own wait as the next attempt's delay; typed like the plain TransientBackendError
    Temporal would report, and retryable."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        delay = timedelta(seconds=retry_after_s) if retry_after_s else None
        ApplicationError.__init__(
            self,
            message,
            type=TransientBackendError.__name__,
            non_retryable=False,
            next_retry_delay=delay,
        )
        self.retry_after_s = retry_after_s


def status_of(err: HfHubHTTPError) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _path_of(err: HfHubHTTPError) -> str:
    try:
        return err.response.request.url.path
    except (AttributeError, RuntimeError):  # a response built without its request
        return ""


def _server_says(said: str | None) -> str:
    said = (said or "").strip().replace("\n", " ")
    return f" (Hugging Face said: {said[:300]})" if said else ""


def translate(err: Exception, doing: str, namespace: str | None = None) -> Exception:
    """The exception to raise for `err`, raised while `doing` (e.g. "starting the job")."""
    where = f" in namespace {namespace!r}" if namespace else ""
    if isinstance(err, HubBusy):
        return HubTransientError(
            f"Hugging Face answered {err.status} while {doing}{_server_says(err.server_said)}",
            err.retry_after_s,
        )
    if isinstance(err, HubNotAnswering):
        return HubTransientError(f"Hugging Face did not answer while {doing}: {err}")
    if isinstance(err, XetAuthenticationError):
        return _bucket_forbidden(doing, namespace, f" ({err})")
    if isinstance(err, OfflineModeIsEnabled):
        return ToolError(
            ErrorType.hf_error,
            f"the worker cannot reach Hugging Face while {doing}: HF_HUB_OFFLINE is set in its "
            "environment; the operator must unset it for the hf backend",
        )
    if isinstance(err, HfHubHTTPError):
        return _http_error(err, doing, namespace, where)
    if isinstance(err, httpx2.TransportError | ConnectionError | TimeoutError):
        return HubTransientError(f"could not reach Hugging Face while {doing}: {err!r}")
    return err


def _http_error(err: HfHubHTTPError, doing: str, namespace: str | None, where: str) -> Exception:
    status = status_of(err)
    said = _server_says(err.server_message)
    if status is not None and (status in (408, 429) or status >= 500):
        return HubTransientError(f"Hugging Face answered {status} while {doing}{said}")
    if status == 402:
        return ToolError(
            ErrorType.hf_error,
            f"Hugging Face refused {doing}: billing. The account{where} has no credits or "
            f"payment method for Jobs (402 Payment Required){said}. The operator must add "
            f"credits or a payment method at {BILLING_URL}; retrying before that cannot succeed.",
            status=402,
        )
    if status == 401:
        return ToolError(
            ErrorType.hf_error,
            f"Hugging Face rejected the broker's token while {doing} (401 Unauthorized)"
            f"{said}. The operator must set a valid HF_TOKEN ({TOKENS_URL}).",
            status=401,
        )
    if status == 403 and _path_of(err).startswith("/api/buckets/"):
        return _bucket_forbidden(doing, namespace, said)
    if status == 403:
        return ToolError(
            ErrorType.hf_error,
            f"Hugging Face forbade {doing}{where} (403 Forbidden){said}. The broker's token "
            f"needs write access to Jobs{where}; the operator can grant it at {TOKENS_URL}.",
            status=403,
            permission="jobs",
        )
    return ToolError(
        ErrorType.hf_error,
        f"Hugging Face refused {doing} ({status}){said}; change the request before retrying.",
        status=status,
    )


def _bucket_forbidden(doing: str, namespace: str | None, said: str) -> ToolError:
    bucket = f"{namespace or '<namespace>'}/{constants.HF_JOBS_ARTIFACTS_BUCKET_NAME}"
    return ToolError(
        ErrorType.hf_error,
        f"Hugging Face forbade {doing}: writing to the bucket {bucket} (403 Forbidden){said}. "
        "Every job's script is uploaded to that bucket before the job starts, and evaluations "
        "read the artifact from it, so the broker's token needs write access to buckets in "
        f"that namespace as well as to Jobs; the operator can grant it at {TOKENS_URL}.",
        status=403,
        permission="bucket write",
    )
