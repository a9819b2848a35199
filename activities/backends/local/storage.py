"""The local backend's job folders as `activities.backends.storage.JobStorage` sees them: sizes of
artifacts, and deletion for retention.

A folder is `<state>/local/jobs/<ref>/` (activities/backends/local/jobfiles.py) and nothing else: a
ref
that is not one of ours (`local-<24 hex>`, so no `/` or `..`) and a folder that is a link are
refused, and deleting never follows a link inside the folder (`scratch.remove_tree`). A job
that has not ended is refused for now (its supervisor still writes there).

`job_folders` lists the folders with what their own `job.json` says (the episode, from the
job's key `episode-<episode_id>/job/<n>`; its job id and role) and when `result.json` says the
job ended, for retention of folders whose episode has no audit record. Links are skipped, both
as folders and as those two files; a folder whose files do not say all of that is left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.backends.local import jobfiles as jf
from activities.backends.local import scratch
from activities.backends.local.store import REF, JobStore
from activities.backends.storage import StorageRefused
from activities.records.retention_plan import JobFolder

# Counting stops past this many entries; a job's own file limit is far below it.
MAX_COUNTED_ENTRIES = 10_000_000
# A job's key is its job workflow's id (workflows/ids.py: `episode-<episode_id>/job/<n>`).
_JOB_KEY = re.compile(r"episode-(?P<episode>[A-Za-z0-9_-]{1,100})/job/[0-9]{1,9}")
# Bytes of a job's own metadata file read at most (they are a few KB).
_METADATA_BYTES = 1 << 20


class LocalJobStorage:
    name = "local"

    def __init__(self, store: JobStore, retention: scratch.Retention | None = None) -> None:
        self._store = store
        self._root = store.jobs_dir
        self._retention = retention

    async def artifact_bytes(self, ref: str) -> int | None:
        return await asyncio.to_thread(self._artifact_bytes, ref)

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        return await asyncio.to_thread(self._delete, ref, keep_artifact)

    async def held_bytes(self) -> dict[str, int] | None:
        def count() -> dict[str, int]:
            held = scratch.holders(self._root, self._retention)
            return {
                "running": held.promised_bytes,
                "live": held.live_bytes,
                "retained": held.kept_bytes,
            }

        return await asyncio.to_thread(count)

    async def job_folders(self) -> list[JobFolder]:
        return await asyncio.to_thread(self._job_folders)

    def _job_folders(self) -> list[JobFolder]:
        try:
            names = sorted(os.listdir(self._root))
        except FileNotFoundError:
            return []
        found = []
        for ref in names:
            folder = self._root / ref
            if not REF.fullmatch(ref) or not _is_real_dir(folder):
                continue
            spec = _read_metadata(folder / jf.JOB)
            key = _JOB_KEY.fullmatch(str(spec.get("key", ""))) if spec else None
            if spec is None or key is None:
                continue
            result = _read_metadata(folder / jf.RESULT)
            finished = result.get("finished_at") if result else None
            found.append(
                JobFolder(
                    ref=ref,
                    episode_id=key["episode"],
                    job_id=str(spec.get("job_id") or ref),
                    role=str(spec.get("role", "")),
                    ended_at=(
                        datetime.fromtimestamp(finished, UTC)
                        if isinstance(finished, int | float)
                        else None
                    ),
                )
            )
        return found

    def artifact_folder(self, ref: str) -> Path | None:
        """The job's outputs folder (a real folder in the job's own), None when it is not
        there; StorageRefused as `_folder`."""
        folder = self._folder(ref)
        if folder is None or not _is_real_dir(folder / jf.ARTIFACT):
            return None
        return folder / jf.ARTIFACT

    def _artifact_bytes(self, ref: str) -> int | None:
        try:
            folder = self._folder(ref)
        except StorageRefused:
            return None
        if folder is None or not _is_real_dir(folder / jf.ARTIFACT):
            return None
        return jf.usage(folder / jf.ARTIFACT, MAX_COUNTED_ENTRIES)[0]

    def _delete(self, ref: str, keep_artifact: bool) -> int:
        folder = self._folder(ref)
        if folder is None:
            return 0  # gone already: deleting again is a no-op
        if (folder / jf.JOB).exists():
            # The store's own view: it also records the end of a job whose supervisor died.
            view = self._store.view(ref)
            if view is not None and not view.state.terminal:
                raise StorageRefused(f"local job {ref} has not ended", lasting=False)
        if not keep_artifact:
            size = jf.usage(folder, MAX_COUNTED_ENTRIES)[0]
            scratch.remove_tree(folder)
            return size
        deleted = 0
        with os.scandir(folder) as entries:
            names = [entry.name for entry in entries if entry.name != jf.ARTIFACT]
        for name in names:
            path = folder / name
            deleted += jf.usage(path, MAX_COUNTED_ENTRIES)[0] if _is_real_dir(path) else _size(path)
            scratch.remove_tree(path)  # a file or a link is unlinked, never followed
        return deleted

    def _folder(self, ref: str) -> Path | None:
        """The job's folder, None when it is gone; StorageRefused for anything that is not a
        real folder directly under this backend's job root."""
        if not REF.fullmatch(ref):
            raise StorageRefused(f"{ref!r} is not a local job's ref")
        folder = self._root / ref
        try:
            mode = os.lstat(folder).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(mode):
            raise StorageRefused(f"{folder} is not a folder (a link is never followed)")
        if os.path.realpath(folder) != os.path.join(os.path.realpath(self._root), ref):
            raise StorageRefused(f"{folder} is outside the local job root")
        return folder


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _read_metadata(path: Path) -> dict[str, Any] | None:
    """A job's own JSON file, never through a link; None when it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as source:
        data = source.read(_METADATA_BYTES)
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _size(path: Path) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
