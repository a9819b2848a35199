"""Write `bfcl_test_items.jsonl` beside this file: the requests of BFCL's "simple" category, the
contamination check's items for `t1_tool_call` (one `{"id", "text"}` per line).

    uv run python tasks/t1_tool_call/bfcl_items.py

It downloads `BFCL_v3_simple.json` and `possible_answer/BFCL_v3_simple.json` of
`gorilla-llm/Berkeley-Function-Calling-Leaderboard` (Apache-2.0) at the revision the task pins
(`[[evaluation_datasets]]`), with huggingface_hub and no token (the dataset is public), so it
needs the Hub: it cannot run on a machine without it (this project's CI has only the package
indexes). The items are the evaluator's own hidden split (tasks/t1_tool_call/evaluator.py,
`bfcl_items`: the same conversion, the same ids); `text` is each item's user messages. Until
the file exists the check reports `check_failed` and the reward stands; the evaluation itself
reads BFCL from the dataset mounted in evaluation jobs and needs nothing from here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
TEST_ITEMS_FILE = "bfcl_test_items.jsonl"


def evaluator() -> ModuleType:
    """The family's evaluator as a module (its BFCL conversion)."""
    sys.path.insert(0, str(HERE.parents[1]))  # the repository: the evaluator imports the kits
    spec = importlib.util.spec_from_file_location("tool_call_evaluator", HERE / "evaluator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def request_text(item: dict[str, Any]) -> str:
    """What the contamination check looks for: the item's user messages."""
    return "\n".join(m["content"] for m in item["messages"] if m.get("role") == "user")


def test_items(data_dir: Path) -> str:
    """The file's text, from BFCL's files under `data_dir` (laid out as in the dataset)."""
    module = evaluator()
    items = module.bfcl_items(data_dir, module.BFCL_HIDDEN)
    rows = [{"id": item["id"], "text": request_text(item)} for item in items]
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def download() -> Path:
    """BFCL's hidden-split files at the task's pinned revision, in a folder laid out as the
    dataset (the Hub's cache)."""
    from huggingface_hub import hf_hub_download

    spec = tomllib.loads((HERE / "task.toml").read_text(encoding="utf-8"))
    (dataset,) = spec["evaluation_datasets"]
    module = evaluator()
    paths = [
        hf_hub_download(dataset["repo_id"], name, repo_type="dataset", revision=dataset["revision"])
        for name in (module.BFCL_HIDDEN, f"{module.BFCL_ANSWERS}/{module.BFCL_HIDDEN}")
    ]
    return Path(paths[0]).parent


if __name__ == "__main__":
    text = test_items(download())
    (HERE / TEST_ITEMS_FILE).write_text(text, encoding="utf-8")
    print(f"wrote {TEST_ITEMS_FILE}: {text.count(chr(10))} items", file=sys.stderr)
