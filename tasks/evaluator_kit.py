"""Shared helpers for task evaluators: standard library only, Python >= 3.10.

`tasks.registry.evaluator_script` embeds this file verbatim into an evaluator that imports it with
one `from tasks.evaluator_kit import ...` statement, so a grader job uploads a single file
(DESIGN §9, "Evaluators"). Hence: no `from __future__` import (it would not be the first statement
of the assembled file), no PEP 723 block, no `if __name__ == "__main__"`, and no import of the
project.

Everything read from an artifact is hostile (DESIGN §6 item 5, §9 "Grader faults"): the readers
validate each file like the reference `safetensors` implementation does and raise ArtifactError
for anything malformed, before reading any tensor data. Nothing from an artifact is executed.

    ArtifactError                       the artifact (not the grader) is at fault: score 0, invalid
    TensorInfo                          one tensor of a file: name, dtype, shape, absolute offsets
    read_header(path) -> dict           validated header of one .safetensors file
    safetensors_files(folder) -> list   the regular *.safetensors files directly in a folder
    read_tensor_set(folder) -> dict     every tensor of every such file, names unique (optionally
                                        within a budget of header bytes for all files together)
    header_budget(base) -> int          the header bytes an artifact standing in for `base` may have
    structure_problem(base, got) -> str why names, dtypes or shapes differ ("" if they match)
    read_bytes(info, fd) / iter_chunks  tensor data
    write_safetensors(path, tensors)    a canonical file (sorted names, aligned header)
    double_exactly(dtype, data)         every element × 2, exactly, in its own dtype
    is_doubled(dtype, base, got)        `got` == double_exactly(base), any NaN matching a NaN
    choose_subset(names, k, seed)       k names chosen by a seed (splits)
    score_line(nonce, payload)          the one trusted `POSTTRAIN_SCORE <nonce> {json}` line
    run_isolated(fn, *args)             fn in a forked child with memory and CPU caps; with
                                        stages=True the child reports how far it got
    cap_address_space(extra)            cap this process's address space at its size now + extra

The grader job around the checks (its inputs, and whose fault a failure is, DESIGN §9):

    GraderFault                         not the artifact's fault: no score line, exit status 2
    grader_inputs(environ) -> GraderInputs   nonce, split seed, folders, base model's tensors
    read_error(exc) -> dict             an OSError on the artifact: its fault or the mount's
    verdict(outcome, what) -> dict      an isolated check's answer, or whose fault its failure is
    final_line(inputs, payload, started)     the score line, with the split and elapsed time
    run_grader(evaluate, name) -> int   an evaluator's `__main__`: the line, or a grader fault
"""

import errno
import hashlib
import json
import os
import resource
import signal
import stat
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

# The reference implementation's limit on the JSON header (safetensors' MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
# More files than any real checkpoint is split into; a folder of thousands is an attack.
MAX_SAFETENSORS_FILES = 256
# Every bound below keeps the work done on an artifact's bytes independent of what they say, so
# a crafted file scores 0 quickly and a grader's timeout can only be the infrastructure's.
# No tensor of a language model has more dimensions than this.
MAX_TENSOR_DIMS = 16
# No dimension, offset or length fits in more digits than a 64-bit integer has (20); parsing a
# longer decimal costs quadratic time in the digits, which a header must not be able to buy.
MAX_INT_DIGITS = 20
# CPU seconds an isolated child may spend (`run_isolated`): far above any legitimate reading of
# a checkpoint, far below a grader's timeout.
ISOLATED_CPU_SECONDS = 300
# The header bytes an artifact that stands in for a base model may hold in all its files
# (`header_budget`): its tensors' entries take as many bytes as the base model's, so twice
# those plus this much (a little metadata, the same tensors split over more files) is room for
# any real checkpoint, and keeps the work of reading the headers the base model's size.
HEADER_SLACK_BYTES = 1 << 20
# Bytes per element of every dtype the reference implementation knows and that is byte-sized.
# Sub-byte dtypes (F4, F6_*) are refused as unknown: no task here uses them.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# IEEE-style float dtypes that `double_exactly` handles: (bytes, exponent bits, mantissa bits).
FLOAT_LAYOUTS = {"F16": (2, 5, 10), "BF16": (2, 8, 7), "F32": (4, 8, 23), "F64": (8, 11, 52)}
_STRUCT_CODES = {2: "H", 4: "I", 8: "Q"}
CHUNK_BYTES = 4 << 20
# Trusted lines longer than this are ignored by the broker (job_launcher.trusted_lines).
MAX_SCORE_LINE_CHARS = 16_384
SCORE_TAG = "POSTTRAIN_SCORE"
# errno values that an artifact can cause by itself (a file it made unreadable, a symlink loop);
# any other OSError while reading it (EIO, ESTALE, ENOTCONN...) is the mount's fault.
ARTIFACT_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.ELOOP,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENXIO,
        errno.EFBIG,
        errno.EOVERFLOW,
    }
)


class ArtifactError(Exception):
    """The artifact is not a valid checkpoint; the message says why (shown to the agent)."""


class TensorInfo(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offset in the file
    end: int
    path: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters: artifact-chosen names are echoed only this short."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _open_regular(path: Path) -> int:
    """An fd on a regular file, never following a symlink, never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArtifactError(f"{shorten(path.name)} is not a regular file")
    return fd


def _read_exactly(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, min(size, CHUNK_BYTES), offset)
        if not chunk:
            raise ArtifactError("the file ended before the data its header promises")
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ArtifactError(f"the header names {shorten(key)!r} twice")
        result[key] = value
    return result


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded_int(text: str) -> int:
    """json's integer parser, refusing integers longer than any real header needs."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ArtifactError(f"the header holds a {len(text)}-digit integer")
    return int(text)


def _tensor_bytes(item_bytes: int, shape: list[int], limit: int) -> int:
    """The bytes a tensor of `shape` needs, or `limit + 1` as soon as it would exceed `limit`
    (a zero dimension makes it empty whatever follows)."""
    if 0 in shape:
        return 0
    size = item_bytes
    for dim in shape:
        size *= dim
        if size > limit:
            return limit + 1
    return size


def read_header(path: Path, *, max_header_bytes: int = MAX_HEADER_BYTES) -> dict[str, TensorInfo]:
    """The tensors of one .safetensors file, validated; raises ArtifactError if malformed.

    Checks what the reference implementation checks: a header length within the file and the
    cap, a UTF-8 JSON object (no duplicate keys), `__metadata__` a string map, every entry a
    known dtype, a shape of non-negative integers, data_offsets inside the data section whose
    length equals the shape's size, and tensors that tile the data section exactly (no overlap,
    no hole, nothing after the last). No tensor data is read.
    """
    return _read_header(path, max_header_bytes, f"the {max_header_bytes}-byte cap")[0]


def _read_header(path: Path, cap: int, cap_name: str) -> tuple[dict[str, TensorInfo], int]:
    """read_header's work: the tensors and the header's length, refused past `cap` bytes."""
    name = shorten(path.name)
    fd = _open_regular(path)
    try:
        file_size = os.fstat(fd).st_size
        if file_size < 8:
            raise ArtifactError(f"{name}: {file_size} bytes is too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", _read_exactly(fd, 8, 0))
        if header_len > cap:
            raise ArtifactError(f"{name}: header length {header_len} exceeds {cap_name}")
        if header_len > file_size - 8:
            raise ArtifactError(
                f"{name}: header length {header_len} is beyond the end of the {file_size}-byte file"
            )
        raw = _read_exactly(fd, header_len, 8)
    finally:
        os.close(fd)
    try:
        header = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys, parse_int=_bounded_int
        )
    except ArtifactError as exc:
        raise ArtifactError(f"{name}: {exc}") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ArtifactError(f"{name}: the header is not valid UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{name}: the header is not a JSON object")
    data_start = 8 + header_len
    data_len = file_size - data_start
    tensors: dict[str, TensorInfo] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise ArtifactError(f"{name}: __metadata__ must map strings to strings")
            continue
        shown = shorten(key)
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ArtifactError(
                f"{name}: tensor {shown!r} must have exactly dtype, shape and data_offsets"
            )
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise ArtifactError(f"{name}: tensor {shown!r} has an unknown dtype {dtype!r:.40}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ArtifactError(f"{name}: tensor {shown!r} has an invalid shape")
        if len(shape) > MAX_TENSOR_DIMS:
            raise ArtifactError(
                f"{name}: tensor {shown!r} has {len(shape)} dimensions; at most "
                f"{MAX_TENSOR_DIMS} are allowed"
            )
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_len
        ):
            raise ArtifactError(
                f"{name}: tensor {shown!r} has data_offsets outside the "
                f"{data_len}-byte data section"
            )
        size = _tensor_bytes(DTYPE_SIZES[dtype], shape, limit=data_len)
        if size > data_len:
            raise ArtifactError(
                f"{name}: tensor {shown!r}'s dtype and shape need more than the whole "
                f"{data_len}-byte data section"
            )
        if size != offsets[1] - offsets[0]:
            raise ArtifactError(
                f"{name}: tensor {shown!r} holds {offsets[1] - offsets[0]} bytes but its dtype "
                f"and shape need {size}"
            )
        tensors[key] = TensorInfo(
            key, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1], str(path)
        )
    position = data_start
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            problem = "overlaps another" if info.begin < position else "leaves a gap before it"
            raise ArtifactError(f"{name}: tensor {shorten(info.name)!r} {problem}")
        position = info.end
    if position != file_size:
        raise ArtifactError(f"{name}: {file_size - position} bytes after the last tensor")
    return tensors, header_len


def safetensors_files(folder: Path) -> list[Path]:
    """The regular `*.safetensors` files directly in `folder`, sorted by name.

    Symlinks, folders and other files are ignored (never followed). Raises ArtifactError for more
    than MAX_SAFETENSORS_FILES, and OSError if the folder cannot be listed.
    """
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(".safetensors") and entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
                if len(found) > MAX_SAFETENSORS_FILES:
                    raise ArtifactError(
                        f"more than {MAX_SAFETENSORS_FILES} .safetensors files in {folder}"
                    )
    return sorted(found)


def read_tensor_set(folder: Path, *, max_header_total: int | None = None) -> dict[str, TensorInfo]:
    """Every tensor of every `*.safetensors` file in `folder` (see safetensors_files).

    Raises ArtifactError when there is no such file, a file is malformed, two files hold a
    tensor of the same name, or (with `max_header_total`) the files' headers hold more bytes
    than that in all: a file is refused before its header is read.
    """
    files = safetensors_files(folder)
    if not files:
        raise ArtifactError(f"no .safetensors file directly in {folder}")
    merged: dict[str, TensorInfo] = {}
    used = 0
    for path in files:
        if max_header_total is None:
            cap, cap_name = MAX_HEADER_BYTES, f"the {MAX_HEADER_BYTES}-byte cap"
        else:
            cap = min(MAX_HEADER_BYTES, max_header_total - used)
            cap_name = (
                f"the {cap} bytes left of the {max_header_total} that all files' headers may "
                "hold (twice the base model's and 1 MiB)"
            )
        tensors, length = _read_header(path, cap, cap_name)
        used += length
        for key, info in tensors.items():
            if key in merged:
                raise ArtifactError(
                    f"tensor {shorten(key)!r} is in both {shorten(Path(merged[key].path).name)} "
                    f"and {shorten(path.name)}"
                )
            merged[key] = info
    return merged


def header_budget(base: dict[str, TensorInfo]) -> int:
    """The header bytes (all files together) that an artifact standing in for the checkpoint
    `base` may hold: twice `base`'s own headers plus HEADER_SLACK_BYTES. A file's header ends
    where its data begins, which its first tensor marks (the tensors tile the data section)."""
    starts: dict[str, int] = {}
    for info in base.values():
        starts[info.path] = min(info.begin, starts.get(info.path, info.begin))
    return 2 * sum(start - 8 for start in starts.values()) + HEADER_SLACK_BYTES


def structure_problem(
    base: dict[str, TensorInfo], got: dict[str, TensorInfo], listed: int = 8
) -> str:
    """Why `got`'s tensor names, dtypes or shapes differ from `base`'s ("" when they match)."""
    missing = sorted(set(base) - set(got))
    extra = sorted(set(got) - set(base))
    differing = sorted(
        name
        for name in set(base) & set(got)
        if (base[name].dtype, base[name].shape) != (got[name].dtype, got[name].shape)
    )
    parts = []
    for label, names in (
        ("missing", missing),
        ("extra", extra),
        ("with another dtype or shape", differing),
    ):
        if names:
            shown = ", ".join(repr(shorten(name)) for name in names[:listed])
            more = f" and {len(names) - listed} more" if len(names) > listed else ""
            parts.append(f"{len(names)} tensors {label}: {shown}{more}")
    if not parts:
        return ""
    return "the checkpoint's tensors differ from the base model's: " + "; ".join(parts)


def open_files(tensors: dict[str, TensorInfo]) -> dict[str, int]:
    """One read-only fd per file of `tensors` (close them with close_files)."""
    fds: dict[str, int] = {}
    try:
        for info in tensors.values():
            if info.path not in fds:
                fds[info.path] = _open_regular(Path(info.path))
    except BaseException:
        close_files(fds)
        raise
    return fds


def close_files(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def read_bytes(info: TensorInfo, fd: int) -> bytes:
    return _read_exactly(fd, info.nbytes, info.begin)


def iter_chunks(info: TensorInfo, fd: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    offset, left = info.begin, info.nbytes
    while left > 0:
        size = min(left, chunk_bytes)
        yield _read_exactly(fd, size, offset)
        offset += size
        left -= size


def write_safetensors(
    path: Path,
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write `{name: (dtype, shape, raw little-endian bytes)}` as one canonical file.

    Tensors in name order, the header padded with spaces to a multiple of 8 bytes (as the
    reference implementation does), so equal inputs give byte-identical files.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        size = DTYPE_SIZES[dtype]
        for dim in shape:
            size *= dim
        if size != len(data):
            raise ValueError(f"{name}: {len(data)} bytes for dtype {dtype} and shape {shape}")
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for name in sorted(tensors):
            out.write(tensors[name][2])


def _float_words(dtype: str, data: bytes) -> tuple[str, list[int], int, int]:
    width, exp_bits, mant_bits = FLOAT_LAYOUTS[dtype]
    if len(data) % width:
        raise ValueError(f"{len(data)} bytes is not a whole number of {dtype} elements")
    fmt = f"<{len(data) // width}{_STRUCT_CODES[width]}"
    return fmt, list(struct.unpack(fmt, data)), exp_bits, mant_bits


def _double_word(word: int, exp_bits: int, mant_bits: int) -> int:
    sign = word & (1 << (exp_bits + mant_bits))
    magnitude = word ^ sign
    exp_max = (1 << exp_bits) - 1
    exponent = magnitude >> mant_bits
    if exponent == exp_max:  # inf stays inf; NaN is compared as "any NaN" by is_doubled
        return word
    if exponent == 0:  # zero or subnormal: the mantissa shifts, carrying into the exponent
        return sign | (magnitude << 1)
    if exponent + 1 == exp_max:  # 2x overflows: round-to-nearest gives infinity
        return sign | (exp_max << mant_bits)
    return sign | (magnitude + (1 << mant_bits))


def double_exactly(dtype: str, data: bytes) -> bytes:
    """Every element of `data` (raw little-endian `dtype`) multiplied by 2, exactly.

    IEEE semantics in the element's own dtype: the exponent goes up by one, subnormals shift,
    a result beyond the largest finite value is infinity, ±0 and ±inf stay. NaNs are kept as they
    are (libraries differ on NaN payloads; is_doubled accepts any NaN). Raises ValueError for a
    dtype other than F16, BF16, F32, F64.
    """
    if dtype not in FLOAT_LAYOUTS:
        raise ValueError(f"cannot double dtype {dtype}")
    fmt, words, exp_bits, mant_bits = _float_words(dtype, data)
    return struct.pack(fmt, *(_double_word(w, exp_bits, mant_bits) for w in words))


def is_doubled(dtype: str, base: bytes, got: bytes) -> bool:
    """True if `got` is `base` × 2 exactly (see double_exactly); a NaN matches any NaN."""
    if len(base) != len(got):
        return False
    expected = double_exactly(dtype, base)
    if expected == got:
        return True
    _, want, exp_bits, mant_bits = _float_words(dtype, expected)
    _, have, _, _ = _float_words(dtype, got)
    nan_floor = ((1 << exp_bits) - 1) << mant_bits
    magnitude = (1 << (exp_bits + mant_bits)) - 1
    return all(
        w == h or ((w & magnitude) > nan_floor and (h & magnitude) > nan_floor)
        for w, h in zip(want, have, strict=True)
    )


def choose_subset(names: list[str], k: int, seed: str) -> list[str]:
    """`k` of `names` chosen by `seed` (sorted): the same seed always picks the same ones."""
    ranked = sorted(set(names), key=lambda n: hashlib.sha256(f"{seed}\0{n}".encode()).digest())
    return sorted(ranked[: max(0, k)])


def score_line(nonce: str, payload: dict[str, Any]) -> str:
    """The trusted score line: one line of ASCII JSON, under the broker's length cap.

    json.dumps escapes every control character and non-ASCII character, so no artifact-chosen
    string can end the line early or start another. If the details make the line too long, they
    are dropped (the score and split stay).
    """
    line = f"{SCORE_TAG} {nonce} {json.dumps(payload, separators=(',', ':'), sort_keys=True)}"
    if len(line) <= MAX_SCORE_LINE_CHARS:
        return line
    kept = {k: payload[k] for k in ("score", "split", "artifact_valid") if k in payload}
    kept["reason"] = shorten(str(payload.get("reason", "")), 500)
    return f"{SCORE_TAG} {nonce} {json.dumps(kept, separators=(',', ':'), sort_keys=True)}"


class Isolated(NamedTuple):
    """What a run_isolated child produced: `value` (JSON) when ok, else a description; `stage`,
    the last stage the child reported (with stages=True; "" before the first)."""

    ok: bool
    value: Any
    problem: str = ""
    stage: str = ""


def run_isolated(
    fn: Callable[..., Any],
    *args: Any,
    memory_bytes: int | None = 4 << 30,
    cpu_seconds: int | None = ISOLATED_CPU_SECONDS,
    stages: bool = False,
) -> Isolated:
    """Run `fn(*args)` in a forked child whose address space is capped at `memory_bytes` and
    whose CPU time at `cpu_seconds` (None: no cap, e.g. on a GPU, where CUDA reserves far more
    address space than any cap would allow; a child can cap itself later with
    cap_address_space).

    With `stages=True`, fn is called as `fn(report, *args)`: `report(name)` tells the parent
    that the child reached the stage `name` (e.g. "the artifact is being read"), so that a
    child that fails can be told apart by how far it got (whose fault it was).

    The child sends its stages and fn's JSON-serialisable result back through a pipe, one JSON
    line each. A child that raises, runs out of memory or CPU time, is killed by a signal or
    exits without a result gives ok=False and a description: the caller decides whose fault
    that is. A child that cannot be started at all gives ok=False, stage "". Linux/POSIX only.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        return Isolated(False, None, f"the evaluation could not start: {exc}")
    if pid == 0:  # the child: never returns into the caller's code
        status = 70
        try:
            os.close(read_end)

            def send(message: dict[str, Any]) -> None:
                view = memoryview(json.dumps(message).encode() + b"\n")  # one line: no raw \n
                while view:
                    view = view[os.write(write_end, view) :]

            if memory_bytes is not None:
                _cap(resource.RLIMIT_AS, memory_bytes)
            if cpu_seconds is not None:
                _cap(resource.RLIMIT_CPU, cpu_seconds)  # the soft limit: SIGXCPU ends the child
            try:
                value = fn(lambda name: send({"stage": str(name)}), *args) if stages else fn(*args)
                message = {"ok": True, "value": value}
            except MemoryError:
                message = {"ok": False, "problem": "the evaluation ran out of memory"}
            except Exception as exc:
                message = {
                    "ok": False,
                    "problem": f"{type(exc).__name__}: {shorten(str(exc), 500)}",
                    "traceback": traceback.format_exc(limit=8),
                }
            send(message)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as reader:
        while chunk := reader.read(1 << 16):
            chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    stage, message = "", None
    for line in b"".join(chunks).split(b"\n"):
        try:
            decoded = json.loads(line)
        except ValueError:
            continue  # the empty tail, or a line cut short by the child's end
        if isinstance(decoded, dict) and "stage" in decoded:
            stage = str(decoded["stage"])
        elif isinstance(decoded, dict):
            message = decoded
    if os.WIFSIGNALED(wait_status):
        signal_number = os.WTERMSIG(wait_status)
        if signal_number == signal.SIGXCPU:  # the soft CPU limit's signal, whose default kills
            problem = f"the evaluation used up its {cpu_seconds} s of CPU time"
            return Isolated(False, None, problem, stage)
        return Isolated(False, None, f"the evaluation was killed by signal {signal_number}", stage)
    if message is None:
        code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else wait_status
        problem = f"the evaluation ended (status {code}) without a result"
        return Isolated(False, None, problem, stage)
    if message.get("ok"):
        return Isolated(True, message.get("value"), "", stage)
    if message.get("traceback"):
        print(message["traceback"], file=sys.stderr)
    return Isolated(False, None, str(message.get("problem", "the evaluation failed")), stage)


def address_space_bytes() -> int:
    """This process's address space now (VmSize), from /proc/self/statm (Linux)."""
    with open("/proc/self/statm", "rb") as statm:
        pages = int(statm.read().split()[0])
    return pages * resource.getpagesize()


def cap_address_space(extra_bytes: int) -> int:
    """Cap this process's address space at its size now plus `extra_bytes`; returns the cap.

    For a child that has just imported large libraries (torch maps gigabytes of address space
    for its CPU or CUDA build, more than any cap sized for the work would allow): the cap then
    bounds the work, whatever the libraries took."""
    cap = address_space_bytes() + extra_bytes
    _cap(resource.RLIMIT_AS, cap)
    return cap


def _cap(limit: int, value: int) -> None:
    """Lower a resource limit of this process (never raise it above the hard limit)."""
    _soft, hard = resource.getrlimit(limit)
    cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (cap, hard))


# -- the grader job: its inputs, whose fault a failure is, its one line ---------------------------

NONCE_ENV = "POSTTRAIN_NONCE"
HIDDEN_SEED_ENV = "POSTTRAIN_HIDDEN_SPLIT_SEED"
# Set by tests and backends, never by an agent.
MODEL_DIR_ENV = "POSTTRAIN_MODEL_DIR"
BASE_DIR_ENV = "POSTTRAIN_BASE_MODEL_DIR"
# A grader fault's exit status: no score line, which the broker reports as score_failed.
GRADER_FAULT_EXIT = 2
# The stage (run_isolated's stages=True) from which a child works on the artifact: a failure
# from there on is the artifact's, before it the grader's.
ON_ARTIFACT = "artifact"


class GraderFault(Exception):
    """Not the artifact's fault: no score line, exit status 2 (score_failed)."""


class GraderInputs(NamedTuple):
    nonce: str
    hidden_seed: str | None  # None: the dev split
    base_dir: Path  # absolute, as is model_dir
    model_dir: Path
    base: dict[str, TensorInfo]  # the base model's tensors

    @property
    def split(self) -> str:
        return "dev" if self.hidden_seed is None else "hidden"


def grader_inputs(environ: dict[str, str]) -> GraderInputs:
    """The job's nonce, hidden split seed, folders (/base_model and /model unless overridden)
    and the base model's tensors. Raises GraderFault for a missing or malformed nonce, an empty
    seed, an unreadable base model or an artifact folder that is not mounted."""
    nonce = environ.get(NONCE_ENV, "")
    if not nonce or any(c.isspace() for c in nonce):
        raise GraderFault(f"{NONCE_ENV} is missing or malformed")
    hidden_seed = environ.get(HIDDEN_SEED_ENV)
    if hidden_seed is not None and not hidden_seed:
        raise GraderFault(f"{HIDDEN_SEED_ENV} is set but empty")
    # Absolute: a tensor's file may be opened or linked from another folder.
    base_dir = Path(os.path.abspath(environ.get(BASE_DIR_ENV) or "/base_model"))
    model_dir = Path(os.path.abspath(environ.get(MODEL_DIR_ENV) or "/model"))
    try:
        base = read_tensor_set(base_dir)
    except (ArtifactError, OSError) as exc:
        raise GraderFault(f"the base model in {base_dir} is unreadable: {exc}") from None
    if not model_dir.is_dir():
        raise GraderFault(f"the artifact folder {model_dir} is not mounted")
    return GraderInputs(nonce, hidden_seed, base_dir, model_dir, base)


def read_error(exc: OSError) -> dict[str, Any]:
    """An OSError while reading the artifact, as a check's answer: the artifact's doing (one of
    ARTIFACT_ERRNOS) makes it invalid, anything else is the mount's ({"grader_fault": why})."""
    if exc.errno in ARTIFACT_ERRNOS:
        return {
            "artifact_valid": False,
            "reason": f"cannot read the artifact: {exc.strerror or exc}",
        }
    return {"grader_fault": f"I/O error reading the artifact: {exc}"}


def verdict(outcome: Isolated, what: str) -> dict[str, Any]:
    """An isolated check's answer (a dict): its own, or, when the child failed, whose fault that
    was: the artifact's once the child had reached ON_ARTIFACT ({"artifact_valid": False,
    "reason"}), else the grader's. Raises GraderFault for that, and for an answer that is
    {"grader_fault": why}."""
    if outcome.ok:
        if "grader_fault" in outcome.value:
            raise GraderFault(outcome.value["grader_fault"])
        return outcome.value
    if outcome.stage == ON_ARTIFACT:
        return {"artifact_valid": False, "reason": outcome.problem}
    reached = f"after stage {outcome.stage!r}" if outcome.stage else "at its start"
    raise GraderFault(f"{what} failed before reading the artifact ({reached}): {outcome.problem}")


def final_line(inputs: GraderInputs, payload: dict[str, Any], started: float) -> str:
    """The score line of `payload` with the split and the seconds since `started` (monotonic)."""
    elapsed = round(time.monotonic() - started, 3)
    return score_line(inputs.nonce, {**payload, "split": inputs.split, "elapsed_s": elapsed})


def run_grader(evaluate: Callable[[dict[str, str]], str], name: str) -> int:
    """An evaluator's `__main__`: print `evaluate(os.environ)`'s score line and return 0, or, on a
    GraderFault, only its message on stderr (after `name`) and GRADER_FAULT_EXIT."""
    try:
        line = evaluate(dict(os.environ))
    except GraderFault as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return GRADER_FAULT_EXIT
    print(line, flush=True)
    return 0
