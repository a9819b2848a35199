"""The local backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from activities.backends.interface import BackendInfo, Capabilities, built_by

BACKEND = BackendInfo(
    name="local",
    summary="jobs on this machine, each in a bubblewrap sandbox without network (the default)",
    # Local jobs are files: look every 2 s, and again at once after a change (short jobs end
    # in well under a second).
    capabilities=Capabilities(spends_money=False, watch_interval_s=2.0, brisk_look_s=0.1),
    build=built_by("activities.backends.local.factory"),
)
