#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "pyarrow==26.0.1",
# ]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
# pyarrow lives in this script's own environment (uv run --script), not the server's.
# pyright: reportMissingImports=false
"""One Parquet file of GSM8K as JSON Lines: its `question` and `answer` columns, one object per
row, in the file's order (tasks/math_word_problems/fetch.py runs it).

    uv run --script gsm8k_rows.py <in.parquet> <out.jsonl>
"""

import json
import sys


def main(source: str, target: str) -> int:
    import pyarrow.parquet as parquet

    rows = parquet.read_table(source, columns=["question", "answer"]).to_pylist()
    with open(target, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
