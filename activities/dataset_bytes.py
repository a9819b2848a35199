"""Reading the first bytes of a dataset, bounded (the contamination check's input).

Every backend reads the same way: the dataset's files in path order, each as far as the cap
allows, stopping at the cap; `DatasetBytes.cut` says whether anything was left unread. Only
regular files are read, never by following a link (a local hub's revisions hold regular files
only; this keeps it so for whatever folder is passed).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from activities.backend import DatasetBytes

# (path in the repo, a function that reads at most n bytes of it)
FileReader = tuple[str, Callable[[int], bytes]]


def read_until(files: Iterable[FileReader], max_bytes: int) -> DatasetBytes:
    """Read `files` in the order given until `max_bytes` in all. A file is read with the room
    left plus one byte, so that a file cut at the cap is known to be cut."""
    read: list[tuple[str, bytes]] = []
    left = max_bytes
    for path, read_at_most in files:
        if left <= 0:
            return DatasetBytes(files=read, cut=True)
        data = read_at_most(left + 1)
        if len(data) > left:
            read.append((path, data[:left]))
            return DatasetBytes(files=read, cut=True)
        read.append((path, data))
        left -= len(data)
    return DatasetBytes(files=read, cut=False)


def read_folder(folder: Path, max_bytes: int) -> DatasetBytes:
    """The regular files under `folder` (links and special files skipped), in path order."""
    return read_until(((rel, _reader(folder / rel)) for rel in _regular_files(folder)), max_bytes)


def _regular_files(folder: Path) -> list[str]:
    found: list[str] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in names:
            path = Path(root, name)
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def _reader(path: Path) -> Callable[[int], bytes]:
    def read_at_most(n: int) -> bytes:
        # O_NOFOLLOW: a file swapped for a link after the walk is not followed either.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            return fh.read(n)

    return read_at_most
