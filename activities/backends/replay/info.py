"""The replay backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code (its settings are read only when the replay backend is the one chosen)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pydantic import ValidationError

from activities.backends.interface import BackendInfo, Capabilities, built_by

# Replayed jobs are files: look every second, and again at once after a change. A job that
# falls through to a rate-limited backend is looked at as that backend allows all the same
# (ReplayBackend's `inner_look_s`).
WATCH_INTERVAL_S, BRISK_LOOK_S = 1.0, 0.1


def _in_force(backend_info: Callable[[str], BackendInfo]) -> BackendInfo:
    """The replay's own pace, with what the backend under it declares of money, orphans and
    interceptors: over `hf` what falls through runs on Hugging Face, so it spends money (API
    keys required even on loopback), its orphans are reaped, and its activities need hf's
    interceptors; over `fake` or `local`, none of these."""
    from activities.backends.replay.settings import ReplaySettings

    try:
        inner = backend_info(ReplaySettings().inner)
    except ValidationError as exc:
        raise SystemExit(f"POSTTRAIN_REPLAY_*: {exc}") from None
    capabilities = BACKEND.capabilities.model_copy(
        update={
            "spends_money": inner.capabilities.spends_money,
            "reaps_orphans": inner.capabilities.reaps_orphans,
        }
    )
    return dataclasses.replace(
        BACKEND, capabilities=capabilities, interceptors=inner.interceptors, in_force=None
    )


BACKEND = BackendInfo(
    name="replay",
    summary="jobs answered from recorded outcomes, keyed by script and inputs (training-time "
    "rollouts); unseen scripts refused or run on fake, local or hf and recorded",
    capabilities=Capabilities(
        spends_money=False, watch_interval_s=WATCH_INTERVAL_S, brisk_look_s=BRISK_LOOK_S
    ),
    build=built_by("activities.backends.replay.factory"),
    in_force=_in_force,
)
