"""The shared evaluator kit: exact doubling, hostile files, splits, score lines, isolation."""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from job_launcher.trusted_lines import MAX_TRUSTED_LINE_CHARS, read_score
from tasks.evaluator_kit import (
    HEADER_SLACK_BYTES,
    MAX_TENSOR_DIMS,
    ArtifactError,
    address_space_bytes,
    cap_address_space,
    choose_subset,
    double_exactly,
    header_budget,
    is_doubled,
    read_header,
    read_tensor_set,
    run_isolated,
    safetensors_files,
    score_line,
    write_safetensors,
)

from .conftest import REFERENCE_SOLUTION, load_module

ALL_16_BIT = np.arange(1 << 16, dtype=np.uint32).astype("<u2")


def not_nan(bits: np.ndarray, exp_bits: int, mant_bits: int) -> np.ndarray:
    magnitude = bits & ((1 << (exp_bits + mant_bits)) - 1)
    return magnitude <= (((1 << exp_bits) - 1) << mant_bits)


# -- doubling ----------------------------------------------------------------------------------


def test_f16_doubling_is_exact_for_every_value() -> None:
    bits = ALL_16_BIT[not_nan(ALL_16_BIT, 5, 10)]
    with np.errstate(over="ignore"):
        want = (bits.view("<f2") * np.float16(2)).astype("<f2")
    assert double_exactly("F16", bits.tobytes()) == want.tobytes()


def test_bf16_doubling_is_exact_for_every_value() -> None:
    bits = ALL_16_BIT[not_nan(ALL_16_BIT, 8, 7)]
    # A BF16 value is the top half of a float32; ×2 in float32 is exact (same exponent range,
    # overflow to inf included) and keeps the low half zero, so truncating back is exact too.
    as_f32 = (bits.astype(np.uint32) << 16).view("<f4")
    with np.errstate(over="ignore"):
        doubled = (as_f32 * np.float32(2)).view("<u4")
    assert np.all(doubled & 0xFFFF == 0)
    assert double_exactly("BF16", bits.tobytes()) == (doubled >> 16).astype("<u2").tobytes()


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("F32", "<f4"), ("F64", "<f8")])
def test_f32_and_f64_doubling_is_exact_at_the_edges(dtype: str, numpy_dtype: str) -> None:
    info = np.finfo(numpy_dtype)
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            np.array(
                [0.0, -0.0, 1.0, -1.5, info.max, -info.max, info.max / 2, info.smallest_subnormal],
                dtype=numpy_dtype,
            ),
            np.array([np.inf, -np.inf, info.smallest_normal / 3, info.smallest_normal * 0.75]),
            rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 38, 1000),
        ]
    ).astype(numpy_dtype)
    with np.errstate(over="ignore"):
        want = (values * values.dtype.type(2)).astype(numpy_dtype)
    assert double_exactly(dtype, values.tobytes()) == want.tobytes()


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_the_reference_solution_doubles_exactly_like_the_evaluator(dtype: str) -> None:
    reference = load_module(REFERENCE_SOLUTION, "reference_solution")
    data = ALL_16_BIT.tobytes()
    assert reference.double(dtype, data) == double_exactly(dtype, data)


def test_is_doubled_accepts_any_nan_for_a_nan_and_refuses_one_ulp_off() -> None:
    base = np.array([1.0, np.nan, -3.0], dtype="<f4")
    got = np.array([2.0, np.nan, -6.0], dtype="<f4").view("<u4").copy()
    got[1] = 0x7FC00123  # another quiet NaN payload
    assert is_doubled("F32", base.tobytes(), got.tobytes())
    got[2] += 1
    assert not is_doubled("F32", base.tobytes(), got.tobytes())
    assert not is_doubled("F32", base.tobytes(), got.tobytes()[:-4])
    with pytest.raises(ValueError, match="cannot double dtype I32"):
        double_exactly("I32", b"\0" * 4)


# -- reading and writing safetensors -------------------------------------------------------------


def test_a_file_written_by_the_safetensors_library_reads_with_the_same_layout(
    tmp_path: Path,
) -> None:
    arrays = {
        "b": np.arange(6, dtype="<f4").reshape(2, 3),
        "a": np.arange(5, dtype="<i8"),
        "scalar": np.array(3.0, dtype="<f2"),
        "empty": np.zeros((0, 4), dtype="<f4"),
    }
    path = tmp_path / "x.safetensors"
    save_file(arrays, str(path), metadata={"format": "np"})
    tensors = read_header(path)
    data = path.read_bytes()
    assert set(tensors) == set(arrays)
    for name, array in arrays.items():
        info = tensors[name]
        assert info.shape == array.shape
        assert data[info.begin : info.end] == array.tobytes()
    assert tensors["a"].dtype == "I64" and tensors["scalar"].dtype == "F16"


def test_the_kit_writer_is_read_back_by_the_safetensors_library_byte_for_byte(
    tmp_path: Path,
) -> None:
    arrays = {"w": np.linspace(-1, 1, 12, dtype="<f4").reshape(3, 4), "n": np.ones(3, "<f2")}
    path = tmp_path / "kit.safetensors"
    write_safetensors(
        path,
        {
            name: (("F32", "F16")[i], a.shape, a.tobytes())
            for i, (name, a) in enumerate(arrays.items())
        },
        {"format": "pt"},
    )
    loaded = load_file(str(path))
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array)
    assert int.from_bytes(path.read_bytes()[:8], "little") % 8 == 0
    with pytest.raises(ValueError, match="bytes for dtype F32"):
        write_safetensors(tmp_path / "bad.safetensors", {"w": ("F32", (2,), b"\0" * 4)})


def raw_file(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("header", "data", "length", "problem"),
    [
        pytest.param(b"{}", b"", 1 << 40, "exceeds the", id="header length above the cap"),
        pytest.param(b"{}", b"", 5000, "beyond the end", id="header length beyond the file"),
        pytest.param(b"not json", b"", None, "not valid UTF-8 JSON", id="not json"),
        pytest.param(b'{"a": \xff}', b"", None, "not valid UTF-8 JSON", id="not utf-8"),
        pytest.param(b"[1, 2]", b"", None, "not a JSON object", id="a list"),
        pytest.param(b"[" * 100_000, b"", None, "not valid UTF-8 JSON", id="deep nesting"),
        pytest.param(
            b'{"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, '
            b'"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}',
            b"",
            None,
            "names 'a' twice",
            id="duplicate name",
        ),
        pytest.param(
            {"a": {**ENTRY, "dtype": "F128"}}, b"\0" * 8, None, "unknown dtype", id="dtype"
        ),
        pytest.param({"a": {**ENTRY, "shape": [-2]}}, b"\0" * 8, None, "invalid shape", id="shape"),
        pytest.param(
            {"a": {**ENTRY, "shape": [True]}}, b"\0" * 8, None, "invalid shape", id="bool"
        ),
        pytest.param({"a": {**ENTRY, "shape": [3]}}, b"\0" * 8, None, "need more", id="size"),
        pytest.param({"a": {**ENTRY, "shape": [1]}}, b"\0" * 8, None, "need 4", id="too small"),
        pytest.param(
            {"a": {**ENTRY, "data_offsets": [0, 1 << 40]}},
            b"\0" * 8,
            None,
            "outside the 8-byte data section",
            id="offsets out of range",
        ),
        pytest.param(
            {"a": {**ENTRY, "shape": [25_000_000_000]}},
            b"\0" * 8,
            None,
            "need more than the whole 8-byte",
            id="100 GB claimed",
        ),
        pytest.param(
            {"a": {**ENTRY, "data_offsets": [8, 0]}}, b"\0" * 8, None, "outside", id="reversed"
        ),
        pytest.param(
            {"a": ENTRY, "b": ENTRY}, b"\0" * 8, None, "overlaps another", id="overlapping"
        ),
        pytest.param(
            {"a": {**ENTRY, "data_offsets": [4, 12]}}, b"\0" * 12, None, "gap", id="a hole"
        ),
        pytest.param({"a": ENTRY}, b"\0" * 12, None, "4 bytes after the last", id="trailing"),
        pytest.param({"a": {**ENTRY, "extra": 1}}, b"\0" * 8, None, "exactly dtype", id="keys"),
        pytest.param({"__metadata__": {"k": 1}}, b"", None, "__metadata__ must map", id="metadata"),
    ],
)
def test_a_malformed_file_is_an_artifact_error_not_a_crash(
    tmp_path: Path, header: object, data: bytes, length: int | None, problem: str
) -> None:
    path = raw_file(tmp_path / "bad.safetensors", header, data, length=length)
    with pytest.raises(ArtifactError, match=problem):
        read_header(path)


def test_a_file_shorter_than_its_length_field_is_an_artifact_error(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ArtifactError, match="too short"):
        read_header(path)


def test_only_regular_safetensors_files_directly_in_the_folder_are_read(tmp_path: Path) -> None:
    good = raw_file(tmp_path / "a.safetensors", {"x": ENTRY}, b"\0" * 8)
    outside = raw_file(
        tmp_path.parent / f"{tmp_path.name}-outside.safetensors", {"y": ENTRY}, b"\0" * 8
    )
    (tmp_path / "link.safetensors").symlink_to(outside)
    (tmp_path / "dir.safetensors").mkdir()
    os.mkfifo(tmp_path / "fifo.safetensors")  # opening it would block a naive reader
    raw_file(tmp_path / "model.bin", {"z": ENTRY}, b"\0" * 8)
    (tmp_path / "sub").mkdir()
    raw_file(tmp_path / "sub" / "deep.safetensors", {"w": ENTRY}, b"\0" * 8)
    assert safetensors_files(tmp_path) == [good]
    assert set(read_tensor_set(tmp_path)) == {"x"}


def test_a_tensor_in_two_files_and_a_folder_without_files_are_artifact_errors(
    tmp_path: Path,
) -> None:
    with pytest.raises(ArtifactError, match=r"no \.safetensors file"):
        read_tensor_set(tmp_path)
    raw_file(tmp_path / "a.safetensors", {"x": ENTRY}, b"\0" * 8)
    raw_file(tmp_path / "b.safetensors", {"x": ENTRY}, b"\0" * 8)
    with pytest.raises(ArtifactError, match=r"'x' is in both a\.safetensors and b\.safetensors"):
        read_tensor_set(tmp_path)


# -- splits and score lines ----------------------------------------------------------------------


def test_a_seed_chooses_the_same_subset_every_time_and_another_seed_another() -> None:
    names = [f"t{i}" for i in range(20)]
    chosen = choose_subset(names, 10, "seed-a")
    assert chosen == choose_subset(list(reversed(names)), 10, "seed-a")
    assert len(chosen) == 10 and set(chosen) <= set(names)
    assert chosen != choose_subset(names, 10, "seed-b")


def test_a_score_line_stays_one_parsable_line_whatever_the_strings_hold() -> None:
    nonce = "abc"
    hostile = 'x"}\nPOSTTRAIN_SCORE abc {"score": 1}\r\u2028\x00'
    line = score_line(nonce, {"score": 0.0, "reason": hostile, "names": [hostile] * 3})
    assert "\n" not in line and "\r" not in line and line.isascii()
    reading = read_score([line], nonce)
    assert reading.valid and reading.score == 0.0 and reading.details["reason"] == hostile


def test_a_score_line_too_long_for_the_broker_keeps_the_score_and_drops_details() -> None:
    line = score_line("abc", {"score": 0.25, "split": "dev", "names": ["n" * 100] * 500})
    assert len(line) <= MAX_TRUSTED_LINE_CHARS
    reading = read_score([line], "abc")
    assert reading.valid and reading.score == 0.25 and reading.details["split"] == "dev"


# -- isolation ------------------------------------------------------------------------------------


def _allocate() -> int:
    return len(bytearray(1 << 31))


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _spin() -> None:
    while True:
        pass


def _fail() -> None:
    raise RuntimeError("boom")


def test_an_isolated_child_returns_its_result() -> None:
    assert run_isolated(sorted, [3, 1, 2]) == (True, [1, 2, 3], "", "")


def _staged(report, then: str) -> str:
    report("started")
    report("artifact")
    if then == "raise":
        raise RuntimeError("boom")
    if then == "spin":
        _spin()
    if then == "kill":
        _kill_self()
    return "done"


@pytest.mark.parametrize(
    ("then", "problem"),
    [
        ("return", ""),
        ("raise", "RuntimeError: boom"),
        ("spin", "the evaluation used up its 1 s of CPU time"),
        ("kill", f"the evaluation was killed by signal {signal.SIGKILL}"),
    ],
)
def test_an_isolated_child_says_how_far_it_got_however_it_ends(then: str, problem: str) -> None:
    outcome = run_isolated(_staged, then, cpu_seconds=1, stages=True)
    assert outcome.stage == "artifact" and outcome.problem == problem
    assert outcome.ok is (then == "return") and outcome.value == ("done" if outcome.ok else None)


def test_an_isolated_child_that_reports_no_stage_says_so() -> None:
    outcome = run_isolated(_fail, stages=False)
    assert not outcome.ok and outcome.stage == ""


def _capped_allocation(extra: int, size: int) -> list[int]:
    cap = cap_address_space(extra)
    used = address_space_bytes()
    try:
        len(bytearray(size))
    except MemoryError:
        return [cap - used, 0]
    return [cap - used, 1]


def test_a_child_caps_its_address_space_at_its_size_now_plus_the_work_it_may_do() -> None:
    # Whatever the child had mapped before (torch maps gigabytes), it gets `extra` more.
    headroom, allocated = run_isolated(_capped_allocation, 256 << 20, 64 << 20, memory_bytes=None)[
        1
    ]
    assert 200 << 20 < headroom <= 256 << 20 and allocated == 1
    _, allocated = run_isolated(_capped_allocation, 64 << 20, 512 << 20, memory_bytes=None)[1]
    assert allocated == 0  # past the cap: a MemoryError, not a crash


def test_an_isolated_child_that_runs_out_of_memory_is_reported_not_fatal() -> None:
    outcome = run_isolated(_allocate, memory_bytes=512 << 20)
    assert not outcome.ok and outcome.problem == "the evaluation ran out of memory"


def test_an_isolated_child_killed_or_raising_is_reported() -> None:
    assert (
        run_isolated(_kill_self).problem == f"the evaluation was killed by signal {signal.SIGKILL}"
    )
    assert run_isolated(_fail).problem == "RuntimeError: boom"


# -- work on artifact bytes is bounded whatever they say ---------------------------------------


def crafted_header(tmp_path: Path, shapes: list[list[int] | str], name: str = "a") -> Path:
    """A file whose header claims tensors of the given shapes (a str: a raw JSON shape)."""
    entries = []
    for n, shape in enumerate(shapes):
        raw_shape = shape if isinstance(shape, str) else json.dumps(shape)
        entries.append(f'"{name}{n}": {{"dtype": "F32", "shape": {raw_shape}, ')
        entries[-1] += '"data_offsets": [0, 8]}'
    header = ("{" + ", ".join(entries) + "}").encode()
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    return path


@pytest.mark.parametrize(
    ("shapes", "problem"),
    [
        # The header found in review: 6,000 dimensions of 4,299 digits (25.8 MB).
        pytest.param(["[" + ", ".join(["9" * 4299] * 6000) + "]"], "digit integer", id="review"),
        pytest.param([[2] * (MAX_TENSOR_DIMS + 1)], "dimensions", id="many dimensions"),
        pytest.param([[10**19] * MAX_TENSOR_DIMS], "need more than", id="huge dimensions"),
        pytest.param([[10**19] * MAX_TENSOR_DIMS] * 50_000, "need more than", id="many tensors"),
    ],
)
def test_a_crafted_header_is_refused_in_bounded_time(
    tmp_path: Path, shapes: list[list[int] | str], problem: str
) -> None:
    path = crafted_header(tmp_path, shapes)
    started = time.process_time()
    with pytest.raises(ArtifactError, match=problem):
        read_header(path)
    # Bounded by the limits, not the header: well under a second of CPU on 2 cores.
    assert time.process_time() - started < 5


def tiny_checkpoint(folder: Path, files: int = 1) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        write_safetensors(folder / f"part-{n}.safetensors", {f"t{n}": ("F32", (2,), b"\0" * 8)})
    return read_tensor_set(folder)


def test_the_header_budget_is_twice_the_base_models_headers_and_some_room(tmp_path: Path) -> None:
    base = tiny_checkpoint(tmp_path / "base", files=2)
    lengths = [
        struct.unpack("<Q", path.read_bytes()[:8])[0]
        for path in sorted((tmp_path / "base").iterdir())
    ]
    assert header_budget(base) == 2 * sum(lengths) + HEADER_SLACK_BYTES


def test_headers_past_the_budget_are_refused_before_they_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "artifact"
    tiny_checkpoint(folder, files=3)
    budget = header_budget(read_tensor_set(folder)) - HEADER_SLACK_BYTES  # twice what they hold
    assert set(read_tensor_set(folder, max_header_total=budget)) == {"t0", "t1", "t2"}
    # 90 MB of metadata in the last file: under the per-file cap, over the budget.
    write_safetensors(
        folder / "part-2.safetensors", {"t2": ("F32", (2,), b"\0" * 8)}, {"m": "x" * 90_000_000}
    )
    started = time.process_time()
    with pytest.raises(ArtifactError, match=r"exceeds the \d+ bytes left of the"):
        read_tensor_set(folder, max_header_total=budget)
    assert time.process_time() - started < 0.5  # the 90 MB were never read
    assert "t2" in read_tensor_set(folder)  # without a budget, the file is valid


def test_an_isolated_child_past_its_cpu_time_is_reported() -> None:
    outcome = run_isolated(_spin, cpu_seconds=1)
    assert not outcome.ok and outcome.problem == "the evaluation used up its 1 s of CPU time"
