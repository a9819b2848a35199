"""The hf backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from activities.backends.interface import BackendInfo, Capabilities

if TYPE_CHECKING:
    from temporalio.worker import Interceptor

    from activities.backends.interface import JobsBackend
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings


def _build(settings: Settings, key: ServerKey) -> JobsBackend:
    # Imported here: the declaration is read by processes that run no job (the gateway's).
    from activities.backends.hf.factory import build

    return build(settings, key)


def _interceptors() -> Sequence[Interceptor]:
    # Hub calls' budgets count from each activity attempt's start (attempt_clock.py).
    from activities.backends.hf.attempt_clock import AttemptClock

    return (AttemptClock(),)


BACKEND = BackendInfo(
    name="hf",
    summary="Hugging Face Jobs with the broker's token (spends money)",
    # One listing call per look for every live job: every 30 s keeps a deployment within the
    # Hub's rate limits (DESIGN §3).
    capabilities=Capabilities(spends_money=True, watch_interval_s=30.0, reaps_orphans=True),
    build=_build,
    interceptors=_interceptors,
)
