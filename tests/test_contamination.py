"""The contamination check's parts without Temporal: the task spec's `[contamination]` table,
the normalized n-gram scan and its threshold, bounded dataset reads, the test items file, the
policy, and the bound on what crosses Temporal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.contamination import ItemsFileError, load_test_items
from activities.contamination_scan import CHUNK_BYTES, ItemText, Scan, cap_matches, words
from activities.dataset_bytes import read_folder
from posttrain_env.contracts.contamination import (
    MAX_LISTED_SOURCES,
    ContaminationEvidence,
    ContaminationMatch,
    ContaminationReport,
    ContaminationSource,
    reward_under_policy,
)
from posttrain_env.limits import (
    MAX_CONTAMINATION_EVIDENCE,
    MAX_CONTAMINATION_PLACES,
    MAX_CONTAMINATION_SNIPPET_CHARS,
    MAX_MESSAGE_CHARS,
    MIB,
    json_size,
)
from posttrain_env.models import ContaminationSpec, ContaminationSummary
from tasks.registry import TaskSpecError, load_task
from tests.workflows.harness import TEST_TASK

# 20 words: 8 distinct 13-grams.
LONG = (
    "the committee agreed that every delegate would receive a printed copy of the final "
    "report before the vote on friday"
)


def scan_of(*texts: str, ngram: int = 13, threshold: float = 0.5) -> list[str]:
    scan = Scan([ItemText("long", LONG), ItemText("short", "What is (17 + 5)?")], ngram, threshold)
    for n, text in enumerate(texts):
        scan.feed_text(f"source-{n}", text)
    return [match.item_id for match in scan.matches()]


# -- the spec --------------------------------------------------------------------------------


def test_a_spec_names_test_items_or_a_generated_hidden_split_never_both_or_neither() -> None:
    assert ContaminationSpec(hidden_split="generated").test_items is None
    spec = ContaminationSpec(test_items="items.jsonl")
    assert (spec.policy, spec.ngram, spec.threshold) == ("report", 13, 0.5)
    with pytest.raises(ValidationError, match="not both"):
        ContaminationSpec(hidden_split="generated", test_items="items.jsonl")
    with pytest.raises(ValidationError, match="test_items is required"):
        ContaminationSpec()
    for bad in ({"policy": "warn"}, {"threshold": 0.0}, {"threshold": 1.5}, {"ngram": 0}):
        with pytest.raises(ValidationError):
            ContaminationSpec(test_items="items.jsonl", **bad)  # type: ignore[arg-type]


def write_task(tmp_path: Path, table: str) -> Path:
    folder = tmp_path / "t_spec"
    folder.mkdir(parents=True)
    spec = TEST_TASK.format(
        task_id="t_spec",
        budget_usd=1.0,
        max_steps=10,
        time_limit_s=60,
        max_timeout_minutes=5,
        max_dev_evaluations=1,
    )
    (folder / "task.toml").write_text(spec + "\n[contamination]\n" + table)
    return tmp_path


def test_a_task_spec_loads_its_contamination_table_strictly_from_toml(tmp_path: Path) -> None:
    tasks = write_task(tmp_path, 'test_items = "items.jsonl"\npolicy = "zero_reward"\nngram = 8\n')
    spec = load_task("t_spec", tasks).contamination
    assert spec is not None and spec.policy == "zero_reward" and spec.ngram == 8


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('test_items = "../elsewhere.jsonl"\n', "contamination.test_items"),
        ('test_items = "/etc/passwd"\n', "contamination.test_items"),
        ('test_items = "items.jsonl"\npolicy = "warn"\n', "contamination.policy"),
        ('test_items = "items.jsonl"\nthreshold = "0.5"\n', "contamination.threshold"),
        ('hidden_split = "generated"\ntest_items = "items.jsonl"\n', "not both"),
        ('hidden_split = "somewhere"\n', "contamination.hidden_split"),
        ('test_items = "items.jsonl"\nseed = 1\n', "contamination.seed': unknown key"),
    ],
)
def test_a_malformed_contamination_table_fails_at_load_naming_the_field(
    tmp_path: Path, table: str, problem: str
) -> None:
    with pytest.raises(TaskSpecError, match=problem.replace(".", r"\.")):
        load_task("t_spec", write_task(tmp_path, table))


def test_the_shipped_tasks_declare_their_hidden_splits_generated() -> None:
    for task_id in ("t0_artifact", "t0_arithmetic_format", "t0_arithmetic_format_tiny"):
        spec = load_task(task_id).contamination
        assert spec is not None and spec.hidden_split == "generated" and spec.test_items is None


# -- the scan --------------------------------------------------------------------------------


def test_normalization_ignores_case_punctuation_and_whitespace() -> None:
    assert words("What is (17 + 5)?\n\tÉTÉ, don't") == ["what", "is", "17", "5", "été", "don", "t"]
    shouted = LONG.upper().replace(" ", " ,\n  ")
    assert scan_of(f"DATA = {shouted!r}") == ["long"]


def test_an_item_is_matched_at_the_threshold_and_not_below_it() -> None:
    item_words = LONG.split()
    # Words 0..16 hold 13-grams 0..4: 5 of 8 (>= 0.5); words 0..14 hold 0..2: 3 of 8.
    assert scan_of(" ".join(item_words[:17])) == ["long"]
    assert scan_of(" ".join(item_words[:15])) == []
    assert scan_of(" ".join(item_words[:15]), threshold=0.375) == ["long"]
    # The n-grams found may come from different sources.
    assert scan_of(" ".join(item_words[:15]), " ".join(item_words[5:])) == ["long"]


def test_an_item_shorter_than_n_is_found_only_whole() -> None:
    assert scan_of("q = 'what is 17 + 5'") == ["short"]
    assert scan_of("what is 17 + 6; is 17 + 5") == []


def test_an_ngram_across_a_chunk_boundary_is_found() -> None:
    scan = Scan([ItemText("long", LONG)], 13, 1.0)
    padding = "x" * (CHUNK_BYTES - 40) + " "
    data = (padding + LONG + " " + padding).encode()
    assert len(data) > 2 * CHUNK_BYTES
    scan.feed_bytes("dataset", data)
    (match,) = scan.matches()
    assert match.found_ngrams == match.item_ngrams == 8 and match.places == ["dataset"]


def test_evidence_is_capped_in_matches_places_and_snippet() -> None:
    items = [ItemText(f"q{n}", f"item number {n} " + "word " * 400) for n in range(80)]
    scan = Scan(items, 13, 0.5)
    for n in range(MAX_CONTAMINATION_PLACES + 3):
        scan.feed_text(f"source-{n}", " ".join(item.text for item in items))
    kept, unlisted = cap_matches(scan.matches())
    assert len(kept) == MAX_CONTAMINATION_EVIDENCE and unlisted == 80 - len(kept)
    assert all(len(m.places) == MAX_CONTAMINATION_PLACES for m in kept)
    assert all(len(m.snippet) <= MAX_CONTAMINATION_SNIPPET_CHARS for m in kept)


def test_the_largest_report_stays_far_below_temporals_payload_limit() -> None:
    big = "x" * MAX_MESSAGE_CHARS
    report = ContaminationReport(
        summary=ContaminationSummary(checked=True, flagged=True, policy="report"),
        evidence=ContaminationEvidence(
            test_items=big,
            items=10**6,
            ngram=13,
            threshold=0.5,
            sources=[ContaminationSource(where=big, error=big)] * MAX_LISTED_SOURCES,
            matches=[
                ContaminationMatch(
                    item_id="i" * 200,
                    found_ngrams=1,
                    item_ngrams=1,
                    places=[big] * MAX_CONTAMINATION_PLACES,
                    snippet="s" * MAX_CONTAMINATION_SNIPPET_CHARS,
                )
            ]
            * MAX_CONTAMINATION_EVIDENCE,
        ),
    )
    assert json_size(report.model_dump_json()) < MIB // 2


# -- reading datasets and test items -----------------------------------------------------------


def test_a_dataset_folder_is_read_in_path_order_up_to_the_cap_without_following_links(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "revision"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"A" * 10)
    (folder / "b" / "c.txt").write_bytes(b"C" * 10)
    (tmp_path / "secret").write_text("outside")
    os.symlink(tmp_path / "secret", folder / "link.txt")
    whole = read_folder(folder, 100)
    assert whole.files == [("a.txt", b"A" * 10), ("b/c.txt", b"C" * 10)] and not whole.cut
    exact = read_folder(folder, 20)
    assert [len(d) for _, d in exact.files] == [10, 10] and not exact.cut
    cut = read_folder(folder, 15)
    assert cut.files == [("a.txt", b"A" * 10), ("b/c.txt", b"C" * 5)] and cut.cut


def test_test_items_are_read_with_ids_and_a_bad_line_is_named_never_quoted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text('{"id": "a", "text": "one"}\n\n{"text": "two"}\n{"id": 7, "text": "3"}\n')
    assert [(i.item_id, i.text) for i in load_test_items(path)] == [
        ("a", "one"),
        ("line-3", "two"),
        ("7", "3"),
    ]
    path.write_text('{"id": "a", "text": "one"}\n{"question": "the secret item"}\n')
    with pytest.raises(ItemsFileError, match="line 2") as err:
        load_test_items(path)
    assert "secret" not in str(err.value)
    path.write_text('{"text": "one"}\nthe secret item\n')
    with pytest.raises(ItemsFileError, match="line 2: not JSON") as err:
        load_test_items(path)
    assert "secret" not in str(err.value)
    with pytest.raises(ItemsFileError, match="cannot be read"):
        load_test_items(tmp_path / "missing.jsonl")


# -- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "flagged", "reward"),
    [("report", True, 0.8), ("zero_reward", True, 0.0), ("zero_reward", False, 0.8)],
)
def test_the_policy_decides_the_reward(policy: str, flagged: bool, reward: float) -> None:
    summary = ContaminationSummary(checked=True, flagged=flagged, policy=policy)  # type: ignore[arg-type]
    assert reward_under_policy(0.8, summary) == reward
    assert json.loads(summary.model_dump_json())["policy"] == policy
