"""Reading the first bytes of a dataset as the contamination check scans them, bounded.

Every backend reads the same way: the dataset's files in path order, each as far as the cap
allows, stopping at the cap or after MAX_DATASET_FILES files; `DatasetBytes.cut` says whether
anything was left unread. Only regular files are read, never by following a link (a local
hub's revisions hold regular files only; this keeps it so for whatever folder is passed).

A file that starts with a gzip, bzip2, xz or zstd header is decompressed (one layer: a
`.jsonl.gz` is read as its JSON lines, a `.tar.gz` as its tar stream) and what is returned for
it is the decompressed bytes. The cap counts what the scan is given: a decompressed file costs
the larger of its compressed and decompressed sizes, and decompression stops at the cap, so a
small file that expands without end (a decompression bomb) costs at most the cap in memory and
time. A file that claims to be compressed but whose stream breaks off (a damaged file, or plain
text behind a compression header) is scanned as what decompressed followed by its raw bytes,
so nothing an agent writes hides behind a header alone.

A job's outputs (`/data/outputs/`, the artifact) are read the same way (`outputs_order`), with
one difference: the weights. A `*.safetensors` file is read only as far as its JSON header (at
most SAFETENSORS_HEADER_BYTES), never its tensor data (numbers, not training text: a 1 GB
checkpoint would otherwise use up the cap before the training data beside it), and after every
other file, so the training inputs and outputs an agent keeps there are read first.

Not decompressed (scanned as raw bytes, so text inside compressed pages or members is not
seen): Parquet (its pages are usually snappy-, gzip- or zstd-compressed), zip, and a second
layer of compression; `opaque_format` names the formats the evidence counts.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import struct
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path
from typing import BinaryIO, Protocol

import zstandard

from activities.backends.interface import DatasetBytes

# (path in the repo, a function that reads at most n bytes of it)
FileReader = tuple[str, Callable[[int], bytes]]

# Files of one dataset read at most (each is a request on Hugging Face): a dataset of many tiny
# files cannot make the check outlast its activity's timeout.
MAX_DATASET_FILES = 1000
# Decompressed bytes asked of a decompressor at a time (its output is bounded by it).
DECOMPRESS_CHUNK = 1 << 20


class Decompressing(Protocol):
    """What `gzip.GzipFile`, `bz2.BZ2File`, `lzma.LZMAFile` and zstandard's stream reader share."""

    def read1(self, size: int = -1, /) -> bytes: ...
    def close(self) -> None: ...


_COMPRESSED: list[tuple[str, bytes, Callable[[BinaryIO], Decompressing]]] = [
    ("gzip", b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")),
    ("bzip2", b"BZh", lambda raw: bz2.BZ2File(raw)),
    ("xz", b"\xfd7zXZ\x00", lambda raw: lzma.LZMAFile(raw)),
    (
        "zstd",
        b"\x28\xb5\x2f\xfd",
        lambda raw: zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True),
    ),
]
_OPAQUE = [("parquet", b"PAR1"), ("zip", b"PK\x03\x04")]


def compression_of(head: bytes) -> str | None:
    """The compression format whose header `head` starts with, or None."""
    return next((name for name, magic, _ in _COMPRESSED if head.startswith(magic)), None)


def opaque_format(head: bytes) -> str | None:
    """A format the scan reads only as raw bytes although it usually hides its text
    (compressed pages or members): `parquet`, `zip`, or a compression layer left; or None."""
    found = next((name for name, magic in _OPAQUE if head.startswith(magic)), None)
    return found or compression_of(head)


def as_text(raw: bytes, room: int, *, raw_cut: bool) -> tuple[bytes, bool]:
    """What the scan gets of a file whose first bytes are `raw` (`raw_cut`: the file goes on
    past them), at most `room` bytes; and whether the file was cut there."""
    name = compression_of(raw)
    if name is None:
        return raw[:room], raw_cut or len(raw) > room
    opener = next(open_ for n, _, open_ in _COMPRESSED if n == name)
    out = bytearray()
    try:
        with closing(opener(io.BytesIO(raw))) as stream:
            while len(out) <= room:
                # read1: one step of the decompressor, so that what decompressed before a
                # break in the stream is kept (`read` would lose it with the exception).
                chunk = stream.read1(min(DECOMPRESS_CHUNK, room + 1 - len(out)))
                if not chunk:
                    break
                out += chunk
    except (OSError, EOFError, ValueError, lzma.LZMAError, zstandard.ZstdError):
        if not raw_cut:  # the stream itself is broken: its raw bytes are scanned too
            whole = bytes(out) + b"\n" + raw
            return whole[:room], len(whole) > room
    return bytes(out[:room]), raw_cut or len(out) > room


def read_until(files: Iterable[FileReader], max_bytes: int) -> DatasetBytes:
    """Read `files` in the order given until `max_bytes` in all (counted as `as_text` returns
    them) or MAX_DATASET_FILES files. A file is read with the room left plus one byte, so that a
    file cut at the cap is known to be cut."""
    read: list[tuple[str, bytes]] = []
    left = max_bytes
    for path, read_at_most in files:
        if left <= 0 or len(read) >= MAX_DATASET_FILES:
            return DatasetBytes(files=read, cut=True)
        raw = read_at_most(left + 1)
        raw_cut = len(raw) > left
        text, cut = as_text(raw[:left], left, raw_cut=raw_cut)
        read.append((path, text))
        if cut:
            return DatasetBytes(files=read, cut=True)
        left -= max(len(raw), len(text))
    return DatasetBytes(files=read, cut=False)


def read_folder(folder: Path, max_bytes: int, *, outputs: bool = False) -> DatasetBytes:
    """The regular files under `folder` (links and special files skipped), in path order (as a
    job's outputs with `outputs`: see outputs_order)."""
    files = [(rel, _reader(folder / rel)) for rel in _regular_files(folder)]
    return read_until(outputs_order(files) if outputs else files, max_bytes)


# What is read of a weights file in a job's outputs: its header (names, shapes, metadata).
WEIGHTS_SUFFIX = ".safetensors"
SAFETENSORS_HEADER_BYTES = 1 << 20


def outputs_order(files: Iterable[FileReader]) -> list[FileReader]:
    """A job's output files in the order and extent the check reads them: every file but the
    weights in the order given, then each `*.safetensors` file's header only."""
    listed = list(files)
    others = [(path, read) for path, read in listed if not path.endswith(WEIGHTS_SUFFIX)]
    weights = [(path, _header_only(read)) for path, read in listed if path.endswith(WEIGHTS_SUFFIX)]
    return others + weights


def _header_only(read: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """A reader of a safetensors file's first 8 bytes and JSON header, at most
    SAFETENSORS_HEADER_BYTES of it (a file that is no safetensors file: its first 8 bytes)."""

    def read_at_most(n: int) -> bytes:
        head = read(min(n, 8))
        if len(head) < 8 or n <= 8:
            return head
        (length,) = struct.unpack("<Q", head)
        return read(min(n, 8 + min(length, SAFETENSORS_HEADER_BYTES)))

    return read_at_most


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
