"""`posttrain-env tasks fetch t1_tool_call`: BFCL's published test data for the real member.

The Berkeley Function Calling Leaderboard's own package, `bfcl-eval` 2026.3.23 on PyPI
(Apache-2.0, "License: Apache 2.0" in its metadata), ships BFCL v4's data in its wheel under
`bfcl_eval/data/`. From that wheel, pinned by version and SHA-256 (its dependencies are never
installed: only the file is downloaded and read as a zip), this writes into the family's folder:

- `bfcl/` the four files the evaluator embeds (`[evaluation] files` of t1_tool_call): the
  hidden split, category "simple_python" (`BFCL_v4_simple_python.json`, 400 items, one Python
  function offered and one call expected, with its `possible_answer/` twin), and the dev
  split's category, "live_simple" (`BFCL_v4_live_simple.json`, 258 user-contributed single
  calls, and its answers), byte for byte as the wheel holds them;
- `bfcl_test_items.jsonl` the contamination check's items: each hidden item's user messages
  (`{"id", "text"}`), converted by the evaluator's own `bfcl_items` (the same ids).

Why the wheel: it is the benchmark's published release, versioned and hashed by the package
index, reachable wherever packages are installed (no Hub needed), and holds the accepted
answers beside the questions. Why extracted at fetch time rather than installed in the grader:
the grader job is one uploaded file (the data travels inside it, as the tiny member's does), so
neither a Hugging Face job nor a local one reaches any index or mount for it, and the wheel's
many dependencies are never installed anywhere.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from tasks.fetching import FetchError, FetchSource, write_file

PACKAGE = "bfcl-eval"
VERSION = "2026.3.23"
WHEEL = f"bfcl_eval-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
# Where the wheel keeps BFCL's data, and where this family's folder keeps what it uses of it.
WHEEL_DATA = "bfcl_eval/data/"
DATA_FOLDER = "bfcl"
CATEGORY_FILES = ("BFCL_v4_simple_python.json", "BFCL_v4_live_simple.json")
HIDDEN_FILE = f"{DATA_FOLDER}/BFCL_v4_simple_python.json"
TEST_ITEMS_FILE = "bfcl_test_items.jsonl"
HERE = Path(__file__).resolve().parent


def data_files() -> list[str]:
    """The wheel's files this family uses, by their names under `bfcl_eval/data/`."""
    return [name for file in CATEGORY_FILES for name in (file, f"possible_answer/{file}")]


def evaluator(folder: Path = HERE) -> ModuleType:
    """The family's evaluator as a module (its BFCL conversion)."""
    spec = importlib.util.spec_from_file_location("tool_call_evaluator", folder / "evaluator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def request_text(item: dict[str, Any]) -> str:
    """What the contamination check looks for: the item's user messages."""
    return "\n".join(m["content"] for m in item["messages"] if m.get("role") == "user")


def read_data(wheel: Path) -> dict[str, bytes]:
    """The family's files from the wheel, by their names in the family's folder."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return {f"{DATA_FOLDER}/{n}": archive.read(WHEEL_DATA + n) for n in data_files()}
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel.name} does not hold BFCL's data as expected: {exc}") from None


def test_items(files: dict[str, bytes], folder: Path = HERE) -> str:
    """The contamination check's items: the hidden split's requests, one JSON line each."""
    module = evaluator(folder)
    answers = module.answers_file(HIDDEN_FILE)
    items = module.bfcl_items(
        files[HIDDEN_FILE].decode("utf-8"), files[answers].decode("utf-8"), HIDDEN_FILE
    )
    rows = [{"id": item["id"], "text": request_text(item)} for item in items]
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def fetch(source: FetchSource, folder: Path) -> list[str]:
    """Download the pinned wheel and write the family's BFCL files and test items."""
    files = read_data(source.pypi_file(PACKAGE, WHEEL, WHEEL_SHA256))
    items = test_items(files, folder).encode("utf-8")  # before any write: all or nothing
    written = [write_file(folder, name, data) for name, data in files.items()]
    return [*written, write_file(folder, TEST_ITEMS_FILE, items)]


if __name__ == "__main__":
    sys.exit("run `posttrain-env tasks fetch t1_tool_call`")
