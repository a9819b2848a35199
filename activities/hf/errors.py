"""Hub errors in the backend's terms, and the one way the backend calls the (sync) Hub client.

429 and 5xx (and a dropped connection) are `TransientBackendError`: the activity's retry policy
retries them with backoff. 401, 402, 403 and every other 4xx are `ToolError(hf_error)` with a
message a person can act on; they are never retried, since retrying cannot make them succeed.
Messages name what failed and the status, never a request header (which holds the token).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TypeVar

import httpx2
from huggingface_hub.errors import HfHubHTTPError

from activities.backend import TransientBackendError
from posttrain_env.errors import ErrorType, ToolError

T = TypeVar("T")

BILLING_URL = "https://huggingface.co/settings/billing"
TOKENS_URL = "https://huggingface.co/settings/tokens"


def status_of(err: HfHubHTTPError) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _server_says(err: HfHubHTTPError) -> str:
    said = (err.server_message or "").strip().replace("\n", " ")
    return f" (Hugging Face said: {said[:300]})" if said else ""


def translate(err: Exception, doing: str, namespace: str | None = None) -> Exception:
    """The exception to raise for `err`, raised while `doing` (e.g. "starting the job")."""
    where = f" in namespace {namespace!r}" if namespace else ""
    if isinstance(err, HfHubHTTPError):
        status = status_of(err)
        said = _server_says(err)
        if status is not None and (status == 429 or status >= 500):
            return TransientBackendError(f"Hugging Face answered {status} while {doing}{said}")
        if status == 402:
            return ToolError(
                ErrorType.hf_error,
                f"Hugging Face refused {doing}: the account{where} has no credits left "
                f"(402 Payment Required){said}. The operator must add credits or a payment "
                f"method at {BILLING_URL}; retrying before that cannot succeed.",
                status=402,
            )
        if status == 401:
            return ToolError(
                ErrorType.hf_error,
                f"Hugging Face rejected the broker's token while {doing} (401 Unauthorized)"
                f"{said}. The operator must set a valid HF_TOKEN ({TOKENS_URL}).",
                status=401,
            )
        if status == 403:
            return ToolError(
                ErrorType.hf_error,
                f"Hugging Face forbade {doing}{where} (403 Forbidden){said}. The broker's token "
                f"needs write access to Jobs{where}; the operator can grant it at {TOKENS_URL}.",
                status=403,
            )
        return ToolError(
            ErrorType.hf_error,
            f"Hugging Face refused {doing} ({status}){said}; change the request before retrying.",
            status=status,
        )
    if isinstance(err, httpx2.TransportError | ConnectionError | TimeoutError):
        return TransientBackendError(f"could not reach Hugging Face while {doing}: {err!r}")
    return err


async def hub_call(
    doing: str,
    fn: Callable[..., T],
    /,
    *args: object,
    keep: tuple[type[Exception], ...] = (),
    **kwargs: object,
) -> T:
    """`fn(*args, **kwargs)` in a thread (huggingface_hub is synchronous), errors translated
    except those of the `keep` types, which the caller handles itself."""
    return await _in_thread(doing, lambda: fn(*args, **kwargs), keep, kwargs.get("namespace"))


async def hub_list(
    doing: str,
    fn: Callable[..., Iterable[T]],
    /,
    *args: object,
    keep: tuple[type[Exception], ...] = (),
    **kwargs: object,
) -> list[T]:
    """As `hub_call`, for listings: the iterable is consumed inside the thread, since its
    pages (and a log stream's events) are requests too."""
    return await _in_thread(doing, lambda: list(fn(*args, **kwargs)), keep, kwargs.get("namespace"))


async def _in_thread(
    doing: str, thunk: Callable[[], T], keep: tuple[type[Exception], ...], namespace: object
) -> T:
    try:
        return await asyncio.to_thread(thunk)
    except (HfHubHTTPError, httpx2.TransportError, ConnectionError, TimeoutError) as err:
        if keep and isinstance(err, keep):
            raise
        raise translate(err, doing, namespace if isinstance(namespace, str) else None) from None
