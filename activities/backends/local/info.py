"""The local backend as it declares itself to the registry (`activities/backends/registry.py`):
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
    from activities.backends.local.factory import build

    return build(settings, key)


BACKEND = BackendInfo(
    name="local",
    summary="jobs on this machine, each in a bubblewrap sandbox without network (the default)",
    # Local jobs are files: look every 2 s, and again at once after a change (short jobs end
    # in well under a second).
    capabilities=Capabilities(spends_money=False, watch_interval_s=2.0, brisk_look_s=0.1),
    build=_build,
)
