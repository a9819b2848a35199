"""A finished local job's outputs become its artifact whole, or not at all (DESIGN §12).

Standard library only (and the stdlib-only `posttrain_env.limits`): the job's supervisor
(`activities/backends/local/job_runner.py`) runs this after every process of the job is gone, so
nothing changes under it.

An artifact holds what the Hub's bucket would hold of `/data/outputs`: folders and regular
files, at paths that are UTF-8 without control characters, at most MAX_ARTIFACT_DEPTH folders
deep and MAX_ARTIFACT_PATH_BYTES long. `survey` walks the whole tree first and either accepts it
or names the first thing it cannot hold (escaped: a name may be any bytes but `/` and NUL), and
checks its size against the job's caps: the task's artifact cap and what the episode may still
keep (its storage cap less its other jobs' artifacts and reservations). Only an accepted tree is
copied (`collect`), into a folder of its own that is renamed into place at the end: a reader
never sees a partial artifact, and a copy that fails leaves none.

Sizes are apparent sizes (`st_size`): what uploading, downloading or mounting the artifact costs,
and what the episode is charged for. Holes of sparse files stay holes in the copy, so the host
holds at most what is counted. A file with several names (hard links) is a file per name.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain_env.limits import MAX_ARTIFACT_DEPTH, MAX_ARTIFACT_PATH_BYTES, artifact_over_cap

PARTIAL_SUFFIX = ".partial"
COPY_CHUNK = 8 << 20
# At most this many characters of a path in a message.
MAX_NAME_CHARS = 200
_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a named pipe (fifo)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass(frozen=True)
class Refusal:
    """Why a job's outputs are not kept. `type` is the error type the agent gets for them
    (`posttrain_env.errors.ErrorType`): `not_allowed` for what an artifact cannot hold,
    `limit_reached` for a cap (`cap` names which: "artifact" is the job's own, "storage" what
    the episode may still keep, "entries" the number of files and folders)."""

    type: str
    message: str
    cap: str | None = None
    cap_bytes: int | None = None
    over_by_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Caps:
    """What one job's artifact may hold. `storage_bytes`: what its episode may still keep
    (None: no episode cap is known here); `storage_cap_bytes`: the episode's whole cap."""

    artifact_bytes: int
    entries: int
    storage_bytes: int | None = None
    storage_cap_bytes: int | None = None


@dataclass
class Survey:
    """What `survey` found: every entry (relative path, is a folder), the apparent bytes of the
    files, and the refusal when the tree cannot be kept."""

    entries: list[tuple[str, bool]] = field(default_factory=list)
    bytes: int = 0
    files: int = 0
    refusal: Refusal | None = None


@dataclass(frozen=True)
class Collected:
    """The artifact: its files and apparent bytes (0 when refused), and the refusal if any."""

    files: int
    bytes: int
    refusal: Refusal | None = None


def escaped(path: str) -> str:
    """A path as a message may quote it: bytes that are not UTF-8 as \\xNN, control characters
    as \\n, \\t or \\xNN, cut to MAX_NAME_CHARS."""
    text = os.fsencode(path).decode("utf-8", errors="backslashreplace")
    out = []
    for char in text:
        code = ord(char)
        if char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif code < 0x20 or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    text = "".join(out)
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "…"


def name_problem(name: str) -> str | None:
    """Why an artifact cannot hold a file or folder named `name` (one path component, as the
    file system gave it), or None."""
    raw = os.fsencode(name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "its name is not UTF-8"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        return "its name holds a control character"
    return None


def survey(outputs: Path, caps: Caps) -> Survey:
    """Walk `outputs` (never following a link, no recursion on the job's depth) and decide
    whether it can be kept whole. An `outputs` that is missing is an empty artifact; one that
    is not a real folder is refused."""
    found = Survey()
    try:
        st = os.lstat(outputs)
    except FileNotFoundError:
        return found
    if not stat.S_ISDIR(st.st_mode):
        found.refusal = _not_allowed("", f"it is {_kind(st.st_mode)}")
        return found
    todo: list[tuple[str, int]] = [("", 0)]  # (path relative to outputs, depth)
    while todo:
        relative, depth = todo.pop()
        folder = os.path.join(outputs, relative) if relative else str(outputs)
        _open_folder_for_us(folder)
        names = sorted(os.listdir(folder))
        for name in names:
            child = os.path.join(relative, name) if relative else name
            st = os.lstat(os.path.join(folder, name))
            problem = _problem(name, child, depth + 1, st.st_mode)
            if problem is not None:
                found.refusal = _not_allowed(child, problem)
                return found
            is_dir = stat.S_ISDIR(st.st_mode)
            found.entries.append((child, is_dir))
            if len(found.entries) > caps.entries:
                found.refusal = Refusal(
                    "limit_reached",
                    f"its outputs hold more than {caps.entries} files and folders, this job's "
                    "cap; nothing was kept",
                    cap="entries",
                )
                return found
            if is_dir:
                todo.append((child, depth + 1))
            else:
                found.files += 1
                found.bytes += st.st_size
    found.refusal = over_a_cap(found.bytes, caps)
    return found


def collect(outputs: Path, artifact: Path, caps: Caps) -> Collected:
    """Make `artifact` (which must not exist) the whole of `outputs`, or an empty folder when
    the outputs are refused. Raises OSError when the copy fails (nothing partial is left:
    `artifact` is then absent); the caller fails the job with that one reason."""
    partial = artifact.with_name(artifact.name + PARTIAL_SUFFIX)
    found = survey(outputs, caps)
    if found.refusal is not None:
        _make_folder(artifact)
        return Collected(files=0, bytes=0, refusal=found.refusal)
    _make_folder(partial)
    copied = 0
    for relative, is_dir in found.entries:  # parents before children: the walk's order
        target = os.path.join(partial, relative)
        if is_dir:
            _make_folder(Path(target))
        else:
            copied += copy_sparse(os.path.join(outputs, relative), target)
    os.rename(partial, artifact)
    return Collected(files=found.files, bytes=copied)


def copy_sparse(source: str, target: str) -> int:
    """Copy one regular file (opened without following links, created anew, 0644), its holes
    kept as holes. Returns its apparent size."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        src = os.open(source, flags)
    except PermissionError:
        os.chmod(source, 0o600)  # ours (no root): made unreadable by the job
        src = os.open(source, flags)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{escaped(source)} is no longer a regular file")
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            for start, end in _data_ranges(src, st.st_size):
                _copy_range(src, dst, start, end)
            os.ftruncate(dst, st.st_size)  # a trailing hole, and the file's exact size
            os.fchmod(dst, 0o644)
        finally:
            os.close(dst)
        return st.st_size
    finally:
        os.close(src)


# -- helpers -------------------------------------------------------------------------------------


def _problem(name: str, relative: str, depth: int, mode: int) -> str | None:
    kind = _kind(mode)
    if kind is not None:
        return f"it is {kind}"
    problem = name_problem(name)
    if problem is not None:
        return problem
    if depth > MAX_ARTIFACT_DEPTH:
        return f"it is more than {MAX_ARTIFACT_DEPTH} folders deep"
    if len(os.fsencode(relative)) > MAX_ARTIFACT_PATH_BYTES:
        return f"its path is longer than {MAX_ARTIFACT_PATH_BYTES} bytes"
    return None


def _kind(mode: int) -> str | None:
    """What an entry is when an artifact cannot hold it (None: a folder or a regular file)."""
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return None
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file or folder")


def _not_allowed(relative: str, problem: str) -> Refusal:
    where = "/data/outputs" + ("/" + escaped(relative) if relative else "")
    return Refusal(
        "not_allowed",
        f"its outputs were refused, nothing was kept: {where}: {problem} (an artifact holds "
        "only folders and regular files, at UTF-8 paths without control characters, at most "
        f"{MAX_ARTIFACT_DEPTH} folders deep and {MAX_ARTIFACT_PATH_BYTES} bytes long)",
    )


def over_a_cap(size: int, caps: Caps) -> Refusal | None:
    """The refusal of `size` apparent bytes by the job's or the episode's cap, or None."""
    over = artifact_over_cap(size, caps.artifact_bytes, caps.storage_bytes, caps.storage_cap_bytes)
    return None if over is None else Refusal("limit_reached", **over)


def _make_folder(path: Path) -> None:
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)


def _open_folder_for_us(folder: str) -> None:
    """A job sharing our uid (no root) may have made a folder unreadable to hide it."""
    st = os.lstat(folder)
    if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o500 != 0o500:
        os.chmod(folder, stat.S_IMODE(st.st_mode) | 0o500)


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) ranges of `fd` that hold data (SEEK_DATA/SEEK_HOLE; the whole file
    where the file system cannot tell)."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return [(0, size)]
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        ranges.append((start, end))
        offset = end
    return ranges


def _copy_range(src: int, dst: int, start: int, end: int) -> None:
    offset = start
    while offset < end:
        count = min(COPY_CHUNK, end - offset)
        try:
            done = os.copy_file_range(src, dst, count, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            done = _copy_by_reading(src, dst, offset, count)
        if done == 0:
            raise OSError(errno.EIO, "the file got shorter while it was copied")
        offset += done


def _copy_by_reading(src: int, dst: int, offset: int, count: int) -> int:
    data = os.pread(src, count, offset)
    view = memoryview(data)
    written = 0
    while written < len(data):
        written += os.pwrite(dst, view[written:], offset + written)
    return len(data)
