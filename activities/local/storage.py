"""The local backend's job folders as `activities.storage.JobStorage` sees them: sizes of
artifacts, and deletion for retention.

A folder is `<state>/local/jobs/<ref>/` (activities/local/jobfiles.py) and nothing else: a ref
that is not one of ours (`local-<24 hex>`, so no `/` or `..`) and a folder that is a link are
refused, and deleting never follows a link inside the folder (`scratch.remove_tree`). A job
that has not ended is refused for now (its supervisor still writes there).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from activities.local import jobfiles as jf
from activities.local import scratch
from activities.local.store import REF, JobStore
from activities.storage import StorageRefused

# Counting stops past this many entries; a job's own file limit is far below it.
MAX_COUNTED_ENTRIES = 10_000_000


class LocalJobStorage:
    name = "local"

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._root = store.jobs_dir

    async def artifact_bytes(self, ref: str) -> int | None:
        return await asyncio.to_thread(self._artifact_bytes, ref)

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        return await asyncio.to_thread(self._delete, ref, keep_artifact)

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


def _size(path: Path) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
