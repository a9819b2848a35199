"""The hf backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from activities.backends.interface import BackendInfo, Capabilities, built_by

if TYPE_CHECKING:
    from temporalio.worker import Interceptor


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
    build=built_by("activities.backends.hf.factory"),
    interceptors=_interceptors,
)
