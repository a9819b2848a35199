"""Building the replay backend from the settings (`BACKEND.build`)."""

from __future__ import annotations

from pydantic import ValidationError

from activities.backends.registry import backend_info
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.settings import ReplaySettings
from activities.backends.replay.store import ReplayStore
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings


def build(settings: Settings, key: ServerKey) -> ReplayBackend:
    """The replay backend over the backend POSTTRAIN_REPLAY_INNER names (SystemExit when the
    settings are invalid or that backend cannot run here)."""
    try:
        replay = ReplaySettings()
    except ValidationError as exc:
        raise SystemExit(f"POSTTRAIN_REPLAY_*: {exc}") from None
    inner_info = backend_info(replay.inner)
    inner = inner_info.build(settings, key)
    # A backend that bills (hf) is looked at as often as it allows, whatever the replay's pace.
    inner_look_s = (
        inner_info.capabilities.watch_interval_s if inner_info.capabilities.spends_money else 0.0
    )
    root = settings.state_dir / "replay"
    store = ReplayStore(replay.store if replay.store is not None else root / "store")
    return ReplayBackend(
        root / "state",
        store,
        inner,
        time_scale=replay.time_scale,
        fall_through=replay.fall_through,
        inner_look_s=inner_look_s,
    )
