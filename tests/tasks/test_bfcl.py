"""The real tool-calling member on BFCL's published data (issue 44): the `bfcl-eval` wheel from
the package index (pinned by version and SHA-256; fetched once per machine into the fetch
command's cache), what `posttrain-env tasks fetch t1_tool_call` writes from it, the splits the
evaluator reads from the one file a grader runs, and its scoring compared with BFCL's own
`simple_function_checker`, run from the wheel's source, reply for reply."""

from __future__ import annotations

import argparse
import copy
import enum
import json
import random
import shutil
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from posttrain_env.limits import MAX_SCRIPT_BYTES
from posttrain_server.commands.tasks import catalogue
from posttrain_server.commands.tasks_fetch import CommandSource, default_cache, run_fetch
from tasks.registry import TASKS_DIR, embedded_files, evaluator_script, load_task

from .conftest import load_module

FAMILY = TASKS_DIR / "t1_tool_call"
FETCH = load_module(FAMILY / "fetch.py", "tool_call_fetch")
EVALUATOR = load_module(FAMILY / "evaluator.py", "tool_call_evaluator_bfcl")
REAL = load_task("t1_tool_call")


@pytest.fixture(scope="module")
def wheel() -> Path:
    """bfcl-eval's wheel, from the package index the first time on a machine."""
    return CommandSource(default_cache()).pypi_file(FETCH.PACKAGE, FETCH.WHEEL, FETCH.WHEEL_SHA256)


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A copy of the shipped tasks after `posttrain-env tasks fetch t1_tool_call`."""
    tasks_dir = tmp_path_factory.mktemp("fetched") / "tasks"
    shutil.copytree(TASKS_DIR, tasks_dir, ignore=shutil.ignore_patterns("__pycache__", "bfcl*"))
    args = argparse.Namespace(tasks_command="fetch", task="t1_tool_call", cache=default_cache())
    assert run_fetch(args, tasks_dir) == 0
    return tasks_dir


def test_the_fetch_writes_the_wheels_files_unchanged_and_the_member_becomes_ready(
    fetched: Path, wheel: Path, tmp_path: Path
) -> None:
    unfetched = tmp_path / "tasks"
    shutil.copytree(TASKS_DIR, unfetched, ignore=shutil.ignore_patterns("__pycache__", "bfcl*"))
    before = {m["id"]: m for f in catalogue(unfetched)[0] for m in f["members"]}["t1_tool_call"]
    assert before["contamination_check"] == "not_ready" and before["evaluable"] is False

    with zipfile.ZipFile(wheel) as archive:
        for name in FETCH.data_files():
            shipped = archive.read(f"bfcl_eval/data/{name}")
            assert (fetched / "t1_tool_call" / "bfcl" / name).read_bytes() == shipped
    members = {m["id"]: m for f in catalogue(fetched)[0] for m in f["members"]}
    assert members["t1_tool_call"]["contamination_check"] == "ready"
    assert members["t1_tool_call"]["evaluable"] is True


def test_a_wheel_whose_bytes_are_not_the_pinned_ones_is_refused(tmp_path: Path) -> None:
    source = CommandSource(tmp_path / "cache")
    with pytest.raises(FETCH.FetchError, match="SHA-256"):
        source.pypi_file(FETCH.PACKAGE, FETCH.WHEEL, "0" * 64)
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_the_hidden_split_is_simple_python_and_the_test_items_are_its_requests(
    fetched: Path,
) -> None:
    spec = load_task("t1_tool_call", fetched)
    script = evaluator_script(spec, fetched)
    assert len(script.encode()) <= MAX_SCRIPT_BYTES
    evaluator = load_module(FAMILY / "evaluator.py", "tool_call_evaluator_embedded")
    evaluator.EMBEDDED_FILES.update(embedded_files(spec, fetched))
    params = evaluator.task_params(json.dumps(spec.evaluation))
    hidden = evaluator.split_items(params, hidden=True)
    assert len(hidden) == 400 and hidden[0]["id"] == "simple_python_0"
    assert all(len(item["tools"]) == 1 for item in hidden)
    dev = evaluator.split_items(params, hidden=False)
    assert len(dev) == 100 and all(item["id"].startswith("live_simple_") for item in dev)
    assert evaluator.split_items(params, hidden=False) == dev  # the seed's draw, every time
    rows = [json.loads(line) for line in (fetched / "t1_tool_call" / FETCH.TEST_ITEMS_FILE).open()]
    assert [row["id"] for row in rows] == [item["id"] for item in hidden]
    assert rows[0]["text"] == hidden[0]["messages"][0]["content"]
    assert spec.contamination is not None and spec.contamination.test_items == FETCH.TEST_ITEMS_FILE


# -- BFCL's own checker, from the wheel's source ------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_checker(wheel: Path) -> types.ModuleType:
    """`bfcl_eval/eval_checker/ast_eval/ast_checker.py` as the wheel ships it, its imports of
    the package's constants answered by stand-ins (the rest of the package, and its many
    dependencies, are never needed for the Python checker)."""

    class Language(enum.Enum):
        PYTHON = "python"
        JAVA = "java"
        JAVASCRIPT = "javascript"

    class Config:
        underscore_to_dot = False  # as for a model whose calls keep BFCL's dotted names

    stubs = {
        "bfcl_eval.constants.enums": {"Language": Language},
        "bfcl_eval.constants.model_config": {"MODEL_CONFIG_MAPPING": {"test/model": Config()}},
        "bfcl_eval.constants.type_mappings": {"JAVA_TYPE_CONVERSION": {}, "JS_TYPE_CONVERSION": {}},
        "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter": {
            "java_type_converter": None
        },
        "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter": {
            "js_type_converter": None
        },
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    try:
        for name, names in stubs.items():
            module = types.ModuleType(name)
            module.__dict__.update(names)
            sys.modules[name] = module
        with zipfile.ZipFile(wheel) as archive:
            source = archive.read("bfcl_eval/eval_checker/ast_eval/ast_checker.py").decode()
        checker = types.ModuleType("bfcl_ast_checker")
        exec(compile(source, "ast_checker.py", "exec"), checker.__dict__)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    checker.Language = Language  # type: ignore[attr-defined]
    return checker


def variants(item: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """Calls an agent's model might make for `item`: the expected one in each accepted form,
    and the mistakes BFCL's rules tell apart."""
    name = item["expected"]["name"]
    accepted: dict[str, list[Any]] = item["expected"]["arguments"]
    properties = item["function"]["parameters"]["properties"]
    given = {k: [v for v in vs if v != ""] for k, vs in accepted.items()}
    right = {k: vs[0] for k, vs in given.items() if vs}
    calls = [{"name": name, "arguments": right}]
    for key, values in accepted.items():
        for value in values:
            if value == "":
                left_out = {k: v for k, v in right.items() if k != key}
                calls.append({"name": name, "arguments": left_out})
            else:
                calls.append({"name": name, "arguments": {**right, key: value}})
    for key, value in right.items():
        changed: list[Any] = []
        if isinstance(value, str):
            changed = [value.upper(), f" {value}.", value + "x", value.replace(" ", "_"), 3]
            changed += [value.replace("'", '"'), value.replace('"', "'"), f"'{value}'"]
        elif isinstance(value, bool):
            changed = [not value, int(value), str(value).lower()]
        elif isinstance(value, int):
            changed = [value + 1, float(value), str(value), True]
        elif isinstance(value, float):
            changed = [int(value) if value == int(value) else value + 0.5, str(value)]
        elif isinstance(value, list):
            changed = [value[::-1], [*value, value[0]] if value else [1], [], {"a": 1}]
            changed += [[str(v).upper() if isinstance(v, str) else v for v in value]]
        elif isinstance(value, dict):
            changed = [{}, {**value, "extra": 1}, [value]]
            changed += [{k: (v.upper() if isinstance(v, str) else v) for k, v in value.items()}]
        for other in changed:
            calls.append({"name": name, "arguments": {**right, key: other}})
        calls.append({"name": name, "arguments": {k: v for k, v in right.items() if k != key}})
    extra = next((p for p in properties if p not in accepted), "unexpected_parameter")
    calls.append({"name": name, "arguments": {**right, extra: "x"}})
    calls.append({"name": name + "_v2", "arguments": right})
    rng.shuffle(calls)
    return [copy.deepcopy(c) for c in calls]


def bfcl_valid(checker: types.ModuleType, item: dict[str, Any], call: dict[str, Any]) -> bool:
    answer = {item["expected"]["name"]: item["expected"]["arguments"]}
    result = checker.simple_function_checker(
        copy.deepcopy(item["function"]),
        {call["name"]: copy.deepcopy(call["arguments"])},
        copy.deepcopy(answer),
        checker.Language.PYTHON,
        "test_model",
    )
    return bool(result["valid"])


@pytest.mark.parametrize("split", ["hidden", "dev"])
def test_the_scoring_agrees_with_bfcls_own_checker_on_every_item(
    fetched: Path, bfcl_checker: types.ModuleType, split: str
) -> None:
    """The evaluator's `call_matches` against BFCL's `simple_function_checker` (Python), on
    every item of the split and about twenty calls per item: the expected call in each form
    BFCL accepts, and wrong values, types, names, missing and unexpected parameters."""
    spec = load_task("t1_tool_call", fetched)
    evaluator = load_module(FAMILY / "evaluator.py", f"tool_call_evaluator_{split}")
    evaluator.EMBEDDED_FILES.update(embedded_files(spec, fetched))
    params = evaluator.task_params(json.dumps({**spec.evaluation, "dev_items": 1000}))
    items = evaluator.split_items(params, hidden=split == "hidden")
    rng = random.Random(44)
    compared = accepted = 0
    disagreements = []
    for item in items:
        for call in variants(item, rng):
            ours = evaluator.call_matches(call, item)
            try:
                theirs = bfcl_valid(bfcl_checker, item, call)
            except (KeyError, TypeError, AttributeError):
                continue  # BFCL's checker itself fails on this call: nothing to compare
            compared += 1
            accepted += theirs
            if ours != theirs:
                disagreements.append((item["id"], call, theirs))
    assert not disagreements, disagreements[:5]
    assert compared > 15 * len(items) and 0.1 < accepted / compared < 0.9, (compared, accepted)
