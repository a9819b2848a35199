"""The tool-calling family's evaluator without a model run: its items (the tiny member's shipped
files, BFCL's conversion), the scoring rules, how the items travel inside the one-file grader,
and the artifacts it refuses before any model code runs (the job interpreter alone, no torch).
The model runs are in tests/local/test_tool_call.py (slow)."""

from __future__ import annotations

import base64
import json
import lzma
import random
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from job_launcher.trusted_lines import SCORE_TAG, read_score
from posttrain_env.limits import MAX_SCRIPT_BYTES
from tasks.evaluator_kit import GraderFault
from tasks.generation_kit import Generation
from tasks.registry import TASKS_DIR, TaskSpecError, embedded_files, evaluator_script, load_task

from .conftest import JOB_PYTHON, NONCE, grader_file, load_module, local_base_model

FAMILY = TASKS_DIR / "t1_tool_call"
EVALUATOR = load_module(FAMILY / "evaluator.py", "tool_call_evaluator")
REFERENCE = load_module(FAMILY / "reference_solution.py", "tool_call_reference")
TINY_ITEMS = load_module(FAMILY / "tiny_items.py", "tool_call_tiny_items")
FETCH = load_module(FAMILY / "fetch.py", "tool_call_fetch_items")
TINY = load_task("t1_tool_call_tiny")
FULL = load_task("t1_tool_call")


def tiny_split(name: str) -> list[dict]:
    return EVALUATOR.load_items((FAMILY / TINY.evaluation[name]).read_text())  # pyright: ignore[reportArgumentType]


# -- the tiny member's items ----------------------------------------------------------------------


def test_the_shipped_tiny_files_are_what_the_generator_writes() -> None:
    for name, text in TINY_ITEMS.files().items():
        assert (FAMILY / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale: run `uv run python tasks/t1_tool_call/tiny_items.py`"
        )


def test_the_tiny_splits_are_disjoint_and_the_test_items_are_the_hidden_requests() -> None:
    dev, hidden = tiny_split("dev_file"), tiny_split("hidden_file")
    assert (len(dev), len(hidden)) == (100, 200)
    requests = [item["messages"][0]["content"] for item in hidden]
    assert len(set(requests)) == 200
    assert not {item["messages"][0]["content"] for item in dev} & set(requests)
    test_items = [json.loads(line) for line in (FAMILY / "tiny_test_items.jsonl").open()]
    assert [row["text"] for row in test_items] == requests
    assert TINY.contamination is not None and TINY.contamination.test_items == (
        "tiny_test_items.jsonl"
    )
    # Every function appears in both splits, offered among three.
    for split in (dev, hidden):
        assert {item["expected"]["name"] for item in split} == set(TINY_ITEMS.FUNCTIONS)
        assert all(len(item["tools"]) == TINY_ITEMS.TOOLS_PER_ITEM for item in split)


def test_the_reference_solution_draws_from_the_tiny_distribution() -> None:
    for seed in range(5):
        a, b = random.Random(seed), random.Random(seed)
        assert [TINY_ITEMS.draw_item(a) for _ in range(200)] == [
            REFERENCE.draw_item(b) for _ in range(200)
        ]


def test_the_expected_call_of_every_tiny_item_scores_as_correct_and_others_do_not() -> None:
    items = tiny_split("hidden_file")
    right = [
        json.dumps(
            {
                "name": item["expected"]["name"],
                "arguments": {
                    k: v[0] for k, v in item["expected"]["arguments"].items() if v != [""]
                },
            }
        )
        for item in items
    ]
    assert EVALUATOR.score_replies(items, right) == {"parsed": 200, "name_ok": 200, "correct": 200}
    shifted = right[1:] + right[:1]  # every reply answers another request
    counts = EVALUATOR.score_replies(items, shifted)
    assert counts["parsed"] == 200 and counts["correct"] == 0


# -- the scoring rules (the evaluator's docstring) -----------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "ratio": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean"},
            },
            "required": ["city", "days"],
        },
    },
}
OTHER = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ITEM = {
    "id": "x",
    "messages": [{"role": "user", "content": "weather"}],
    "tools": [OTHER, WEATHER],
    "expected": {
        "name": "get_weather",
        "arguments": {
            "city": ["New York", "NYC"],
            "unit": ["celsius", ""],
            "days": [3],
            "ratio": [0.5, ""],
            "tags": [["a", "b"], ""],
            "exact": [True, ""],
        },
    },
}


def correct(reply: str) -> bool:
    return EVALUATOR.score_replies([ITEM], [reply])["correct"] == 1


def call(**arguments: Any) -> str:
    return json.dumps({"name": "get_weather", "arguments": arguments})


@pytest.mark.parametrize(
    "reply",
    [
        call(city="New York", days=3),
        call(city="new york", days=3),  # strings lowercased
        call(city="New-York", days=3),  # spaces and ,./-_*^ ignored
        call(city="NYC", days=3, unit="celsius"),  # any accepted value; an optional one given
        call(city="NYC", days=3, ratio=0.5, tags=["A", "b"], exact=True),
        call(city="NYC", days=3, ratio=0.50),
        '  {"name": "get_weather", "arguments": {"city": "NYC", "days": 3}}\n',
        "<tool_call>\n" + call(city="NYC", days=3) + "\n</tool_call>",
    ],
)
def test_a_right_call_counts(reply: str) -> None:
    assert correct(reply)


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (call(city="NYC"), "a required parameter is missing"),
        (call(city="Boston", days=3), "a value that is not accepted"),
        (call(city="NYC", days=3.0), "an integer given as a float"),
        (call(city="NYC", days=True), "a boolean is not an integer"),
        (call(city="NYC", days="3"), "a number given as a string"),
        (call(city="NYC", days=3, unit="kelvin"), "a value outside the enum"),
        (call(city="NYC", days=3, color="red"), "a parameter the schema does not have"),
        (call(city="NYC", days=3, tags=["b", "a"]), "a list in another order"),
        (call(city="NYC", days=3, exact=1), "an integer is not a boolean"),
        (json.dumps({"name": "get_time", "arguments": {}}), "another function"),
        ('{"name": "get_weather", "arguments": {"city": "NYC", "days": 3}} done', "text after"),
        ('Sure: {"name": "get_weather", "arguments": {"city": "NYC", "days": 3}}', "before"),
        ('{"name": "get_weather", "arguments": {"city": "NYC", "days": NaN}}', "NaN"),
        ('{"name": "get_weather", "parameters": {"city": "NYC", "days": 3}}', "another key"),
        ('{"name": "get_weather", "arguments": "city=NYC"}', "arguments not an object"),
        ('[{"name": "get_weather", "arguments": {"city": "NYC", "days": 3}}]', "a list"),
        ("<tool_call>\n" + call(city="NYC", days=3), "an unclosed tag"),
        ("", "nothing"),
    ],
)
def test_a_wrong_call_does_not_count(reply: str, why: str) -> None:
    assert not correct(reply), why


def test_an_optional_parameter_bfcl_requires_must_be_given() -> None:
    """A parameter the schema calls optional but whose accepted values lack "" must be given."""
    item = json.loads(json.dumps(ITEM))
    item["expected"]["arguments"]["unit"] = ["celsius"]
    replies = [call(city="NYC", days=3), call(city="NYC", days=3, unit="celsius")]
    assert EVALUATOR.score_replies([item, item], replies)["correct"] == 1


def test_the_counts_tell_parsing_naming_and_correctness_apart() -> None:
    replies = [
        "not json",
        json.dumps({"name": "get_time", "arguments": {}}),
        call(city="x", days=3),
    ]
    counts = EVALUATOR.score_replies([ITEM] * 3, replies)
    assert counts == {"parsed": 2, "name_ok": 1, "correct": 0}


# -- parameters and items: the task's own faults are the grader's ----------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        '{"unknown": 1}',
        '{"files": ["a.jsonl"], "dev_file": "b.jsonl", "hidden_file": "a.jsonl"}',
        '{"files": ["a.jsonl"], "dev_file": "a.jsonl", "hidden_file": "a.jsonl", "engine": "x"}',
        '{"source": "web"}',
        '{"source": "bfcl", "files": ["d/a", "d/possible_answer/a"], "dev_file": "d/a", '
        '"hidden_file": "d/a", "dev_seed": "s", "dev_items": 0}',
        '{"source": "bfcl", "files": ["d/a", "d/possible_answer/a"], "dev_file": "d/a", '
        '"hidden_file": "d/a", "dev_items": 10}',
        '{"source": "bfcl", "files": ["d/a"], "dev_file": "d/a", "hidden_file": "d/a", '
        '"dev_seed": "s", "dev_items": 10}',
    ],
)
def test_malformed_parameters_are_the_graders_fault(raw: str) -> None:
    with pytest.raises(GraderFault):
        EVALUATOR.task_params(raw)


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "{}",
        json.dumps({**ITEM, "tools": [{"name": 3}]}),
        json.dumps({**ITEM, "expected": {"name": "absent", "arguments": {}}}),
        json.dumps({**ITEM, "expected": {"name": "get_weather", "arguments": {"city": "NYC"}}}),
    ],
)
def test_malformed_items_are_the_graders_fault(line: str) -> None:
    with pytest.raises(GraderFault):
        EVALUATOR.load_items(line + "\n")


def test_the_items_reach_the_chat_template_with_their_tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`evaluate` hands each item's messages and its own tools to the generation kit (which
    passes them to the base model's chat template), and scores what comes back."""
    seen: dict[str, Any] = {}
    hidden = tiny_split("hidden_file")

    last = hidden[-1]["expected"]
    arguments = {k: v[0] for k, v in last["arguments"].items() if v != [""]}
    answer = json.dumps({"name": last["name"], "arguments": arguments})

    def fake_generate(job, conversations, settings, tools=None):
        seen.update(conversations=conversations, tools=tools, settings=settings)
        return Generation(True, ["nothing"] * (len(conversations) - 1) + [answer], "", "t", "cpu")

    monkeypatch.setattr(EVALUATOR, "generate", fake_generate)
    monkeypatch.setattr(EVALUATOR, "grader_inputs", lambda environ: _job(tmp_path, "seed"))
    line = EVALUATOR.evaluate({"POSTTRAIN_TASK_PARAMS": json.dumps(TINY.evaluation)})
    assert seen["conversations"] == [item["messages"] for item in hidden]
    assert seen["tools"] == [item["tools"] for item in hidden]
    assert seen["settings"].max_new_tokens == 96 and seen["settings"].engine == "transformers"
    reading = read_score([line], NONCE)
    assert reading.score == 1 / 200 and reading.details["correct"] == 1
    assert reading.details["split"] == "hidden" and reading.details["n"] == 200


def _job(tmp_path: Path, seed: str | None):
    from tasks.evaluator_kit import GraderInputs

    (tmp_path / "config.json").write_text("{}")
    return GraderInputs(NONCE, seed, tmp_path, tmp_path, {})


# -- the items inside the one-file grader ---------------------------------------------------


def test_the_assembled_evaluator_holds_the_tiny_splits_and_fits_a_jobs_script() -> None:
    script = evaluator_script(TINY)
    assert len(script.encode()) <= MAX_SCRIPT_BYTES
    match = re.search(r"^EMBEDDED_FILES: dict\[str, str\] = (.+)$", script, re.MULTILINE)
    assert match is not None
    files = json.loads(match.group(1))
    assert set(files) == {"tiny_dev.jsonl", "tiny_hidden.jsonl"}
    for name, blob in files.items():
        assert lzma.decompress(base64.b85decode(blob)) == (FAMILY / name).read_bytes()
    assert files == embedded_files(TINY)


def family_copy(tmp_path: Path, evaluation: str) -> tuple[Path, Any]:
    """A tasks folder with this family's evaluator and one member using `evaluation`."""
    tasks_dir = tmp_path / "tasks"
    (tasks_dir / "t1_tool_call").mkdir(parents=True)
    shutil.copy(FAMILY / "evaluator.py", tasks_dir / "t1_tool_call")
    spec_text = (TASKS_DIR / "t1_tool_call_tiny" / "task.toml").read_text()
    # The member's own tables but its evaluation (and no contamination items) are kept.
    head, _, rest = spec_text.partition("[evaluation]")
    spec_text = head + evaluation + "\n\n[base_model]" + rest.partition("[base_model]")[2]
    (tasks_dir / "t1_tool_call_tiny").mkdir()
    (tasks_dir / "t1_tool_call_tiny" / "task.toml").write_text(spec_text)
    return tasks_dir, load_task("t1_tool_call_tiny", tasks_dir)


@pytest.mark.parametrize(
    ("files", "problem"),
    [('["../t0_artifact/task.toml"]', "must be a relative path inside"), ('"a.jsonl"', "list")],
)
def test_files_to_embed_must_be_a_list_of_paths_in_the_family(
    tmp_path: Path, files: str, problem: str
) -> None:
    evaluation = f'[evaluation]\nfiles = {files}\ndev_file = "a.jsonl"\nhidden_file = "a.jsonl"'
    tasks_dir, spec = family_copy(tmp_path, evaluation)
    with pytest.raises(TaskSpecError, match=problem):
        evaluator_script(spec, tasks_dir)


def test_an_evaluator_over_a_jobs_script_limit_is_refused(tmp_path: Path) -> None:
    evaluation = (
        '[evaluation]\nfiles = ["big.jsonl"]\ndev_file = "big.jsonl"\nhidden_file = "big.jsonl"'
    )
    tasks_dir, spec = family_copy(tmp_path, evaluation)
    # Random bytes do not compress: the embedded file alone is over the limit.
    (tasks_dir / "t1_tool_call" / "big.jsonl").write_bytes(random.Random(0).randbytes(300_000))
    with pytest.raises(TaskSpecError, match=f"at most {MAX_SCRIPT_BYTES}"):
        evaluator_script(spec, tasks_dir)


# -- BFCL's data, read from the mounted dataset (items written here in BFCL's format) ----------

BFCL_QUESTION = {
    "id": "simple_7",
    "question": [[{"role": "user", "content": "Find the area of a circle of radius 4 in m."}]],
    "function": [
        {
            "name": "geometry.circle_area",
            "description": "The area of a circle.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "radius": {"type": "float", "description": "radius"},
                    "unit": {"type": "string", "description": "unit", "enum": ["m", "cm"]},
                    "shape": {"type": "tuple", "items": {"type": "float"}},
                    "extra": {"type": "any"},
                    "nested": {"type": "dict", "properties": {"a": {"type": "float"}}},
                },
                "required": ["radius"],
            },
        }
    ],
}
BFCL_ANSWER = {
    "id": "simple_7",
    "ground_truth": [{"geometry.circle_area": {"radius": [4.0, 4], "unit": ["m", ""]}}],
}


def test_a_bfcl_item_becomes_the_familys_item_with_json_schema_types() -> None:
    item = EVALUATOR.bfcl_item(BFCL_QUESTION, BFCL_ANSWER)
    assert EVALUATOR.item_problem(item) == ""
    (tool,) = item["tools"]
    assert tool["type"] == "function"
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object"
    properties = parameters["properties"]
    assert properties["radius"]["type"] == "number" and properties["unit"]["enum"] == ["m", "cm"]
    assert properties["shape"] == {"type": "array", "items": {"type": "number"}}
    assert "type" not in properties["extra"]
    assert properties["nested"]["type"] == "object"
    assert properties["nested"]["properties"]["a"]["type"] == "number"
    assert item["expected"] == {
        "name": "geometry.circle_area",
        "arguments": {"radius": [4.0, 4], "unit": ["m", ""]},
    }
    reply = json.dumps({"name": "geometry.circle_area", "arguments": {"radius": 4}})
    assert EVALUATOR.score_replies([item], [reply])["correct"] == 1
    assert FETCH.request_text(item) == "Find the area of a circle of radius 4 in m."
    two_calls = {**BFCL_ANSWER, "ground_truth": [{"a": {}}, {"b": {}}]}
    assert EVALUATOR.bfcl_item(BFCL_QUESTION, two_calls) is None


def bfcl_files(hidden: int = 5, live: int = 150) -> dict[str, str]:
    """The real member's four files, in BFCL's format, by their names in the family's folder."""
    files = {}
    for name, prefix, count in (
        (FULL.evaluation["hidden_file"], "simple_python", hidden),
        (FULL.evaluation["dev_file"], "live_simple", live),
    ):
        questions = [{**BFCL_QUESTION, "id": f"{prefix}_{n}"} for n in range(count)]
        answers = [{**BFCL_ANSWER, "id": f"{prefix}_{n}"} for n in range(count)]
        # A two-call item is left out.
        questions.append({**BFCL_QUESTION, "id": f"{prefix}_{count}"})
        answers.append({"id": f"{prefix}_{count}", "ground_truth": [{"a": {}}, {"b": {}}]})
        files[name] = "".join(json.dumps(q) + "\n" for q in questions)
        files[EVALUATOR.answers_file(name)] = "".join(json.dumps(a) + "\n" for a in answers)
    return files


def embed(evaluator: Any, files: dict[str, str]) -> None:
    """`files` as tasks.registry.evaluator_script embeds them into the grader's one file."""
    evaluator.EMBEDDED_FILES.clear()
    for name, text in files.items():
        encoded = base64.b85encode(lzma.compress(text.encode())).decode("ascii")
        evaluator.EMBEDDED_FILES[name] = encoded


def test_the_bfcl_member_reads_its_splits_from_the_files_embedded_in_its_grader() -> None:
    evaluator = load_module(FAMILY / "evaluator.py", "tool_call_evaluator_splits")
    embed(evaluator, bfcl_files())
    params = evaluator.task_params(json.dumps(FULL.evaluation))
    hidden = evaluator.split_items(params, hidden=True)
    assert [item["id"] for item in hidden] == [f"simple_python_{n}" for n in range(5)]
    dev = evaluator.split_items(params, hidden=False)
    assert len(dev) == 100 and len({item["id"] for item in dev}) == 100
    assert all(item["id"].startswith("live_simple_") for item in dev)
    assert evaluator.split_items(params, hidden=False) == dev  # the seed's slice, every time
    other = evaluator.task_params(json.dumps({**params, "dev_seed": "another"}))
    assert evaluator.split_items(other, hidden=False) != dev
    assert FULL.evaluation_datasets == []  # nothing mounted: the data is in the grader's file


def test_the_bfcl_test_items_are_the_hidden_splits_requests() -> None:
    files = {name: text.encode() for name, text in bfcl_files().items()}
    rows = [json.loads(line) for line in FETCH.test_items(files).splitlines()]
    assert [row["id"] for row in rows] == [f"simple_python_{n}" for n in range(5)]
    assert {row["text"] for row in rows} == {"Find the area of a circle of radius 4 in m."}
    assert FULL.contamination is not None
    assert FULL.contamination.test_items == FETCH.TEST_ITEMS_FILE


@pytest.mark.parametrize("broken", ["missing", "unpaired", "not json"])
def test_missing_or_malformed_bfcl_files_are_the_graders_fault(broken: str) -> None:
    evaluator = load_module(FAMILY / "evaluator.py", f"tool_call_evaluator_{broken}")
    files = bfcl_files()
    answers = evaluator.answers_file(FULL.evaluation["hidden_file"])
    if broken == "missing":
        del files[answers]
    else:
        lines = files[answers].splitlines()
        files[answers] = "\n".join(lines[1:] if broken == "unpaired" else ["{", *lines])
    embed(evaluator, files)
    params = evaluator.task_params(json.dumps(FULL.evaluation))
    with pytest.raises(GraderFault, match=r"BFCL|not embedded"):
        evaluator.split_items(params, hidden=True)


# -- the evaluator as a job runs it, on artifacts it refuses before any model code --------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return local_base_model("t1_tool_call_tiny", tmp_path_factory)


@pytest.fixture(scope="module")
def evaluator_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return grader_file("t1_tool_call_tiny", tmp_path_factory)


def run_evaluator(evaluator_file: Path, base: Path, model: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "POSTTRAIN_NONCE": NONCE,
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps(TINY.evaluation),
        "POSTTRAIN_HIDDEN_SPLIT_SEED": "grader-seed",
    }
    return subprocess.run(
        [JOB_PYTHON, "-I", str(evaluator_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(run: subprocess.CompletedProcess) -> dict:
    """The score line's payload, which must say: score 0, artifact invalid, on all 200 items."""
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith(SCORE_TAG)]
    assert len(lines) == 1, run.stdout
    reading = read_score(run.stdout.splitlines(), NONCE)
    assert reading.valid and reading.score == 0.0
    assert reading.details["artifact_valid"] is False
    assert reading.details["n"] == 200 and reading.details["correct"] == 0
    assert reading.details["split"] == "hidden"
    return reading.details


def test_pickle_only_weights_are_never_opened_and_score_0(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "pickled"
    artifact.mkdir()
    (artifact / "pytorch_model.bin").write_bytes(b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "no .safetensors file" in details["reason"]


def test_wrong_shapes_score_0_before_any_model_code(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    from tasks.evaluator_kit import read_tensor_set, write_safetensors

    tensors = {}
    for name, info in read_tensor_set(base_model).items():
        shape = (info.shape[0] + 1, *info.shape[1:]) if name == "lm_head.weight" else info.shape
        tensors[name] = ("F32", shape, b"\0" * 4 * _count(shape))
    artifact = tmp_path / "reshaped"
    artifact.mkdir()
    write_safetensors(artifact / "model.safetensors", tensors)
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "lm_head.weight" in details["reason"]


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def test_a_header_that_claims_huge_tensors_scores_0_within_seconds(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "crafted"
    artifact.mkdir()
    entry = '"lm_head.weight": {"dtype": "F32", "shape": %s, "data_offsets": [0, 4]}'
    raw = ("{" + entry % json.dumps([10**19] * 16) + "}").encode()
    (artifact / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    started = time.monotonic()
    details = refused(run_evaluator(evaluator_file, base_model, artifact))
    assert "need more than" in details["reason"]
    assert time.monotonic() - started < 30  # not the grader's timeout


def test_without_torch_the_grader_fails_unscored_never_the_artifact(
    evaluator_file: Path, base_model: Path, tmp_path: Path
) -> None:
    missing = subprocess.run([JOB_PYTHON, "-I", "-c", "import torch"], capture_output=True)
    assert missing.returncode != 0, "this test needs an interpreter without torch"
    artifact = tmp_path / "copy"
    artifact.mkdir()
    shutil.copy(base_model / "model.safetensors", artifact)
    run = run_evaluator(evaluator_file, base_model, artifact)
    assert run.returncode == 2 and SCORE_TAG not in run.stdout
    assert "the grader cannot import torch" in run.stderr
