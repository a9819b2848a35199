"""The fake backend as it declares itself to the registry (`activities/backends/registry.py`):
its name, its capabilities, and how it is built. Light on purpose: reading it loads none of the
backend's code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities.backends.interface import BackendInfo, Capabilities

if TYPE_CHECKING:
    from activities.backends.interface import JobsBackend
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings


def _build(settings: Settings, key: ServerKey) -> JobsBackend:
    # Imported here: the declaration is read by processes that run no job (the gateway's).
    from activities.backends.fake.factory import build

    return build(settings, key)


BACKEND = BackendInfo(
    name="fake",
    summary="in-memory jobs scripted by a scenario, file-backed (development and tests)",
    capabilities=Capabilities(spends_money=False, watch_interval_s=30.0),
    build=_build,
)
