"""`posttrain-env tasks fetch math_word_problems`: GSM8K's test problems, the contamination
check's items for the real member (`gsm8k_test.jsonl`, one `{"id", "text", "answer"}` per line).

GSM8K is `openai/gsm8k` (MIT licence), pinned at the commit its `[[evaluation_datasets]]`
names; its test split is one Parquet file, `main/test-00000-of-00001.parquet` (1,319 problems).
The fetch reads it from the Hub at that commit without any token (the dataset is public),
checked against the SHA-256 the Hub lists for it at that commit, and converts it with
`gsm8k_rows.py` (pyarrow, in a `uv run --script` environment of its own: the server has no
pyarrow). Ids are `gsm8k-test-<n>`, the evaluator's own (evaluator.py, `gsm8k_rows`); `answer`
is the number after the reference's last `####`, commas dropped. The evaluation itself reads
GSM8K from the dataset mounted in evaluation jobs and needs nothing from here.
"""

from __future__ import annotations

import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from tasks.fetching import FetchError, FetchSource, write_file

TEST_SPLIT = "main/test-00000-of-00001.parquet"
TEST_ITEMS_FILE = "gsm8k_test.jsonl"
CONVERTER = "gsm8k_rows.py"


def pinned_dataset(folder: Path) -> tuple[str, str]:
    """The repo and commit of GSM8K that the family's task.toml mounts for evaluations."""
    spec = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    (dataset,) = spec["evaluation_datasets"]
    return dataset["repo_id"], dataset["revision"]


def test_items(rows: list[dict[str, Any]]) -> str:
    """The contamination check's items from GSM8K's rows (`question`, `answer`)."""
    lines = []
    for n, row in enumerate(rows):
        if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
            raise FetchError(f"GSM8K's test row {n} has no question and answer strings")
        final = row["answer"].rsplit("####", 1)[-1].strip().replace(",", "")
        item = {"id": f"gsm8k-test-{n:04d}", "text": row["question"], "answer": final}
        lines.append(json.dumps(item) + "\n")
    if not lines:
        raise FetchError("GSM8K's test split has no rows")
    return "".join(lines)


def fetch(source: FetchSource, folder: Path) -> list[str]:
    """Download the pinned test split and write the test items."""
    repo_id, revision = pinned_dataset(folder)
    parquet = source.hub_dataset_file(repo_id, revision, TEST_SPLIT)
    with tempfile.TemporaryDirectory(prefix="gsm8k-") as scratch:
        converted = Path(scratch) / "rows.jsonl"
        source.run_script(folder / CONVERTER, [str(parquet), str(converted)])
        try:
            rows = [json.loads(line) for line in converted.read_text("utf-8").splitlines()]
        except (OSError, ValueError) as exc:
            raise FetchError(f"{CONVERTER} wrote no JSON Lines: {exc}") from None
    return [write_file(folder, TEST_ITEMS_FILE, test_items(rows).encode("utf-8"))]
