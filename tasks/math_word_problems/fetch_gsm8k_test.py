#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "huggingface_hub==2.4.0",
#     "pyarrow==26.0.1",
# ]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
# pyarrow lives in this script's own venv (uv run), not the server's.
# pyright: reportMissingImports=false
"""Write `gsm8k_test.jsonl` beside this file: GSM8K's test problems, the contamination check's
items for `math_word_problems` (one `{"id", "text", "answer"}` per line).

    uv run tasks/math_word_problems/fetch_gsm8k_test.py

It downloads `main/test-00000-of-00001.parquet` of openai/gsm8k at the revision the task pins
(from the Hub, without a token: the dataset is public), so it needs the Hub; it cannot run on a
machine without it (this project's CI has only the package indexes). Ids are `gsm8k-test-<n>`,
the evaluator's own (tasks/math_word_problems/evaluator.py, `gsm8k_rows`).
"""

import json
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    import pyarrow.parquet as parquet
    from huggingface_hub import hf_hub_download

    spec = tomllib.loads((HERE / "task.toml").read_text(encoding="utf-8"))
    (dataset,) = spec["evaluation_datasets"]
    path = hf_hub_download(
        dataset["repo_id"],
        "main/test-00000-of-00001.parquet",
        repo_type="dataset",
        revision=dataset["revision"],
    )
    rows = parquet.read_table(path, columns=["question", "answer"]).to_pylist()
    target = HERE / spec["contamination"]["test_items"]
    with target.open("w", encoding="utf-8") as out:
        for n, row in enumerate(rows):
            final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
            item = {"id": f"gsm8k-test-{n:04d}", "text": row["question"], "answer": final}
            out.write(json.dumps(item) + "\n")
    print(f"wrote {len(rows)} problems to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
