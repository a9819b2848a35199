"""The items of `t1_tool_call`: BFCL's public data, converted to the family's item format.

    uv run python tasks/t1_tool_call/bfcl_items.py      (needs the Hub: not run by the tests)

downloads four files of the Berkeley Function Calling Leaderboard dataset
(`gorilla-llm/Berkeley-Function-Calling-Leaderboard`, Apache-2.0) at the pinned revision below,
with huggingface_hub, and writes beside this file:

    bfcl_hidden.jsonl      the hidden split: BFCL v3 "simple" (400 items: one Python function
                           offered, one call expected), BFCL's AST category that every
                           leaderboard entry reports
    bfcl_dev.jsonl         the dev split: 100 items of BFCL v3 "live_simple" (258 user-contributed
                           single-call items), drawn with a fixed seed
    bfcl_test_items.jsonl  the contamination check's items: each hidden item's request

The repository does not ship them (nothing here reaches the Hub but an operator); until they are
written, `t1_tool_call` is listed and its episodes start, but its evaluations answer
`not_allowed` (tasks.registry.evaluator_script names the missing file). The files are BFCL's
text, unchanged but for the conversion below; their licence is BFCL's (Apache-2.0).

BFCL's format: a question file holds one JSON object per line, `{"id", "question": [[message,
...]], "function": [{"name", "description", "parameters": {"type": "dict", "properties",
"required"}}]}`, and its `possible_answer/` twin `{"id", "ground_truth": [{name: {param:
[accepted values]}}]}`, "" among a parameter's values meaning that it may be left out. The
conversion (`convert`) keeps the first turn's messages, wraps each function as an OpenAI-style
tool (`{"type": "function", "function": ...}`, which chat templates expect) with BFCL's Python
type names made JSON Schema's (`dict` -> `object`, `float` -> `number`, `tuple` -> `array`,
`any` -> no type), and the single expected call as `{"name", "arguments"}`. An item whose
answer holds more than one call is left out (none in these two categories).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DATASET = "gorilla-llm/Berkeley-Function-Calling-Leaderboard"
# The dataset's revision: the commit its Hub page's viewer reported reading (a47290e), holding
# BFCL v3's files. Not downloaded from here; `main` moves (BFCL v4 renamed its files).
REVISION = "a47290ec96c5533102ee526548807024b1dda53b"
HIDDEN_SOURCE, DEV_SOURCE = "BFCL_v3_simple.json", "BFCL_v3_live_simple.json"
ANSWERS = "possible_answer/"
DEV_ITEMS, DEV_SEED = 100, "t1_tool_call/dev/1"
DEV_FILE, HIDDEN_FILE, TEST_ITEMS_FILE = (
    "bfcl_dev.jsonl",
    "bfcl_hidden.jsonl",
    "bfcl_test_items.jsonl",
)
TYPE_NAMES = {"dict": "object", "float": "number", "tuple": "array"}


def json_schema(schema: Any) -> Any:
    """A BFCL parameter schema with JSON Schema's type names, recursively."""
    if isinstance(schema, list):
        return [json_schema(entry) for entry in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            converted[key] = TYPE_NAMES.get(value, value)
        elif key in ("properties",) and isinstance(value, dict):
            converted[key] = {name: json_schema(entry) for name, entry in value.items()}
        elif key in ("items", "additionalProperties"):
            converted[key] = json_schema(value)
        else:
            converted[key] = value
    return converted


def convert(question: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | None:
    """One BFCL item and its answer in the family's format (None: more than one call)."""
    if question["id"] != answer["id"]:
        raise ValueError(f"question {question['id']!r} is paired with answer {answer['id']!r}")
    calls = answer["ground_truth"]
    if len(calls) != 1 or len(calls[0]) != 1:
        return None
    ((name, arguments),) = calls[0].items()
    tools = [
        {
            "type": "function",
            "function": {**function, "parameters": json_schema(function["parameters"])},
        }
        for function in question["function"]
    ]
    return {
        "id": question["id"],
        "messages": list(question["question"][0]),
        "tools": tools,
        "expected": {"name": name, "arguments": arguments},
    }


def request_text(item: dict[str, Any]) -> str:
    """What the contamination check looks for: the item's user messages."""
    return "\n".join(m["content"] for m in item["messages"] if m.get("role") == "user")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n" for row in rows)


def converted(questions: Path, answers: Path) -> list[dict[str, Any]]:
    items = [convert(q, a) for q, a in zip(read_jsonl(questions), read_jsonl(answers), strict=True)]
    return [item for item in items if item is not None]


def files(sources: dict[str, Path]) -> dict[str, str]:
    """The three files' contents by name, from the four downloaded files (by their paths in the
    dataset)."""
    hidden = converted(sources[HIDDEN_SOURCE], sources[ANSWERS + HIDDEN_SOURCE])
    live = converted(sources[DEV_SOURCE], sources[ANSWERS + DEV_SOURCE])
    dev = sorted(random.Random(DEV_SEED).sample(live, min(DEV_ITEMS, len(live))), key=_order)
    test_items = [{"id": item["id"], "text": request_text(item)} for item in hidden]
    return {DEV_FILE: jsonl(dev), HIDDEN_FILE: jsonl(hidden), TEST_ITEMS_FILE: jsonl(test_items)}


def _order(item: dict[str, Any]) -> tuple[str, int]:
    prefix, _, number = item["id"].rpartition("_")
    return (prefix, int(number)) if number.isdigit() else (item["id"], 0)


def download() -> dict[str, Path]:
    from huggingface_hub import hf_hub_download

    names = [HIDDEN_SOURCE, DEV_SOURCE, ANSWERS + HIDDEN_SOURCE, ANSWERS + DEV_SOURCE]
    return {
        name: Path(hf_hub_download(DATASET, name, repo_type="dataset", revision=REVISION))
        for name in names
    }


if __name__ == "__main__":
    for file_name, text in files(download()).items():
        (HERE / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {file_name}: {text.count(chr(10))} items", file=sys.stderr)
