"""The replay store: recorded outcomes, one file per key (`<root>/recordings/<key>.json`).

A recording is written once (atomically: a reader never sees half of one) and never changed:
the first outcome recorded for a key is the one replayed. Files are read back bounded
(MAX_RECORDING_BYTES) and validated; one that is too large, of another format or corrupt is
skipped with a warning, as if it were not there.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from pydantic import ValidationError

from activities.backends.replay.recording import (
    MAX_RECORDING_BYTES,
    JobInputs,
    NearKey,
    Recording,
    RecordingTooLarge,
    fit,
    nearest,
)

log = logging.getLogger(__name__)

KEY = re.compile(r"[0-9a-f]{64}")
# Recordings read when looking for the nearest keys (the newest first); the rest are not compared.
MAX_SCANNED = 2_000


class ReplayStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "recordings"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Recording] = {}

    def path(self, key: str) -> Path:
        if not KEY.fullmatch(key):
            raise ValueError(f"not a recording key: {key!r}")
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Recording | None:
        """The recording of `key`, or None (never recorded, or unreadable: logged)."""
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        recording = self._read(self.path(key))
        if recording is not None:
            self._cache[key] = recording
        return recording

    def put(self, recording: Recording) -> bool:
        """Store `recording` unless its key has one already (the first one stays); True when
        written. Raises RecordingTooLarge when it cannot fit even without its log."""
        path = self.path(recording.key)
        if path.exists():
            return False
        data = fit(recording)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return True

    def keys(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.json") if KEY.fullmatch(p.stem))

    def nearest(self, inputs: JobInputs, script: str, count: int) -> list[NearKey]:
        """The recorded keys closest to a job that has none (recording.nearest)."""
        paths = sorted(self.folder.glob("*.json"), key=_mtime, reverse=True)[:MAX_SCANNED]
        recorded: list[tuple[JobInputs, str]] = []
        for path in paths:
            recording = self._read(path)
            if recording is not None:
                recorded.append((recording.inputs, recording.script))
        return nearest(inputs, script, recorded, count)

    def _read(self, path: Path) -> Recording | None:
        try:
            with path.open("rb") as file:
                data = file.read(MAX_RECORDING_BYTES + 1)
        except FileNotFoundError:
            return None
        try:
            if len(data) > MAX_RECORDING_BYTES:
                raise RecordingTooLarge(f"over the limit of {MAX_RECORDING_BYTES} bytes")
            recording = Recording.model_validate_json(data)
            if recording.key != path.stem or recording.inputs.key() != recording.key:
                raise ValueError("its key is not the hash of its inputs")
        except (ValidationError, ValueError) as err:
            log.warning("replay store: %s is skipped: %s", path.name, str(err)[:300])
            return None
        return recording


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
