"""The replay backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from activities.backends.interface import BackendInfo, Capabilities, built_by

BACKEND = BackendInfo(
    name="replay",
    summary="jobs answered from recorded outcomes, keyed by script and inputs (training-time "
    "rollouts); unseen scripts refused or run on fake/local and recorded",
    # Replayed jobs are files: look every second, and again at once after a change.
    capabilities=Capabilities(spends_money=False, watch_interval_s=1.0, brisk_look_s=0.1),
    build=built_by("activities.backends.replay.factory"),
)
