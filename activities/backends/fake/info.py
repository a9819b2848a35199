"""The fake backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from activities.backends.interface import BackendInfo, Capabilities, built_by

BACKEND = BackendInfo(
    name="fake",
    summary="in-memory jobs scripted by a scenario, file-backed (development and tests)",
    capabilities=Capabilities(spends_money=False, watch_interval_s=30.0),
    build=built_by("activities.backends.fake.factory"),
)
