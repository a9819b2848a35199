"""`posttrain-env tasks fetch math_word_problems` against the HTTP-level fake Hub (issue 44):
GSM8K's test split read at the commit the task pins (not the dataset's newest), without any
token, checked against the SHA-256 the Hub lists, converted with pyarrow in a `uv run --script`
environment of its own (from the package index, once per machine), and the member then ready:
its items are the evaluator's ids and answers, `tasks list` says ready. A second fetch reads
the cached file again without asking the Hub for it."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from job_launcher.requirements import script_dependencies
from posttrain_server.commands.tasks import catalogue
from posttrain_server.commands.tasks_fetch import run_fetch
from tasks.registry import TASKS_DIR
from tests.hf.http_hub import HubHttp
from tests.tasks.conftest import load_module

FAMILY = TASKS_DIR / "math_word_problems"
FETCH = load_module(FAMILY / "fetch.py", "gsm8k_fetch")
REPO, REVISION = FETCH.pinned_dataset(FAMILY)
NEWER = "f" * 40
ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
    },
    {
        "question": "A shop sells 1,200 pens a week. How many pens does it sell in 2 weeks?",
        "answer": "1,200 * 2 = <<1200*2=2400>>2400\n#### 2,400",
    },
    {"question": "What is 5 - 8?", "answer": "5 - 8 = -3\n#### -3"},
]
PYARROW = script_dependencies((FAMILY / FETCH.CONVERTER).read_text())


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """ROWS as GSM8K's Parquet file, written by the converter's own pinned pyarrow."""
    folder = tmp_path_factory.mktemp("gsm8k")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    write = (
        "import json, sys, pyarrow, pyarrow.parquet as pq; "
        "pq.write_table(pyarrow.Table.from_pylist(json.loads(sys.argv[1])), sys.argv[2])"
    )
    target = folder / "test.parquet"
    subprocess.run(
        [
            *(uv, "run", "--no-config", "--no-project", "--quiet"),
            *(f"--with={d}" for d in PYARROW),
            *("python", "-c", write, json.dumps(ROWS), str(target)),
        ],
        check=True,
        timeout=600,
    )
    return target.read_bytes()


def unfetched(root: Path) -> Path:
    tasks_dir = root / "tasks"
    for task_id in ("math_word_problems", "math_word_problems_tiny"):
        shutil.copytree(
            TASKS_DIR / task_id,
            tasks_dir / task_id,
            ignore=shutil.ignore_patterns("gsm8k_test.jsonl", "__pycache__"),
        )
    return tasks_dir


def fetch(tasks_dir: Path, cache: Path) -> int:
    args = argparse.Namespace(tasks_command="fetch", task="math_word_problems", cache=cache)
    return run_fetch(args, tasks_dir)


def test_the_fetch_reads_the_pinned_commit_without_a_token_and_leaves_the_member_ready(
    http_hub: HubHttp, parquet: bytes, tmp_path: Path
) -> None:
    http_hub.add_dataset(
        REPO,
        REVISION,
        {FETCH.TEST_SPLIT: parquet, "main/train-00000-of-00001.parquet": b"PAR1 train"},
        lfs={FETCH.TEST_SPLIT},
    )
    # The dataset moved on since: the pinned commit is what is read.
    http_hub.add_dataset(REPO, NEWER, {FETCH.TEST_SPLIT: b"PAR1 a newer test split"})
    tasks_dir = unfetched(tmp_path)
    before = {m["id"]: m for f in catalogue(tasks_dir)[0] for m in f["members"]}
    assert before["math_word_problems"]["contamination_check"] == "not_ready"

    assert fetch(tasks_dir, tmp_path / "cache") == 0

    items = [json.loads(line) for line in (tasks_dir / FAMILY.name / FETCH.TEST_ITEMS_FILE).open()]
    assert items == [
        {"id": "gsm8k-test-0000", "text": ROWS[0]["question"], "answer": "72"},
        {"id": "gsm8k-test-0001", "text": ROWS[1]["question"], "answer": "2400"},
        {"id": "gsm8k-test-0002", "text": ROWS[2]["question"], "answer": "-3"},
    ]
    after = {m["id"]: m for f in catalogue(tasks_dir)[0] for m in f["members"]}
    assert after["math_word_problems"]["contamination_check"] == "ready"
    assert http_hub.seen and all(seen.token is None for seen in http_hub.seen)
    files = http_hub.requests_to("dataset_file")
    assert [seen.path for seen in files] == [
        f"/datasets/{REPO}/resolve/{REVISION}/{FETCH.TEST_SPLIT}"
    ]
    assert len(http_hub.requests_to("lfs_file")) == 1  # LFS: redirected to the storage host

    # Again: the listing is asked (the commit's SHA-256), the file is not.
    (tasks_dir / FAMILY.name / FETCH.TEST_ITEMS_FILE).unlink()
    assert fetch(tasks_dir, tmp_path / "cache") == 0
    assert len(http_hub.requests_to("dataset_file")) == 1
    assert (tasks_dir / FAMILY.name / FETCH.TEST_ITEMS_FILE).is_file()


def test_a_commit_without_the_test_split_fails_the_fetch_and_writes_nothing(
    http_hub: HubHttp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    http_hub.add_dataset(REPO, REVISION, {"main/train-00000-of-00001.parquet": b"PAR1"})
    tasks_dir = unfetched(tmp_path)
    assert fetch(tasks_dir, tmp_path / "cache") == 1
    assert f"has no file {FETCH.TEST_SPLIT!r}" in capsys.readouterr().err
    assert not (tasks_dir / FAMILY.name / FETCH.TEST_ITEMS_FILE).exists()
