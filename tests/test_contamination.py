"""The contamination check's parts without Temporal: the task spec's `[contamination]` table,
the normalized n-gram scan and its threshold, bounded dataset reads (decompressed, a bomb
stopped at the cap, a file cap), the test items file, the policy, the bound on what crosses
Temporal, and the activity over the fake backend: each dataset's fair share of the total, the
time it may read for, and the agent's count of what was not read."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import zlib
from pathlib import Path

import pytest
import zstandard
from pydantic import ValidationError

from activities.backends.fake.backend import FakeBackend, FakeDataset, FakeScenario
from activities.contamination.activities import (
    ContaminationActivities,
    ItemsFileError,
    load_test_items,
)
from activities.contamination.dataset_bytes import (
    MAX_DATASET_FILES,
    as_text,
    opaque_format,
    read_folder,
    read_until,
)
from activities.contamination.scan import CHUNK_BYTES, ItemText, Scan, cap_matches, words
from posttrain_common.contracts.audit import AuditJob, AuditRecord
from posttrain_common.contracts.contamination import (
    MAX_LISTED_SOURCES,
    CheckContamination,
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
    # Each item is longer than a snippet may be, so the snippet cap has something to cut.
    items = [ItemText(f"q{n}", f"item number {n} " + "word " * 80) for n in range(80)]
    assert all(len(item.text) > 1.2 * MAX_CONTAMINATION_SNIPPET_CHARS for item in items)
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


COMPRESSORS = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_a_compressed_file_is_read_as_its_text_and_the_cap_counts_decompressed_bytes(
    name: str,
) -> None:
    text = (LONG + "\n").encode() * 200
    packed = COMPRESSORS[name](text)
    assert len(packed) < len(text) // 10
    assert as_text(packed, 10**6, raw_cut=False) == (text, False)
    # Two members (or frames, or streams) one after the other, as `cat a.gz b.gz` makes.
    assert as_text(packed + packed, 10**6, raw_cut=False) == (text + text, False)
    assert as_text(packed, 100, raw_cut=False) == (text[:100], True)
    # A file cut by the cap before its end: what decompressed so far, and cut.
    head, cut = as_text(packed[: len(packed) // 2], 10**6, raw_cut=True)
    assert cut and text.startswith(head)
    # In a dataset: the decompressed bytes count, and nothing is read past them.
    read = read_until([("a.gz", lambda n: packed[:n]), ("b.txt", lambda n: b"b")], 1000)
    assert read.files == [("a.gz", text[:1000])] and read.cut
    whole = read_until([("a.gz", lambda n: packed[:n]), ("b.txt", lambda n: b"b")], 10**6)
    assert whole.files == [("a.gz", text), ("b.txt", b"b")] and not whole.cut


def test_a_decompression_bomb_stops_at_the_cap() -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * MIB
    packed = b"".join(bomb.compress(zeros) for _ in range(64)) + bomb.flush()  # 64 MiB
    out, cut = as_text(packed, MIB, raw_cut=False)
    assert len(out) == MIB and cut and len(packed) < MIB // 8


def test_text_behind_a_compression_header_is_still_scanned() -> None:
    """A stream that breaks off (plain text after a gzip header, or after a valid member) is
    scanned as what decompressed followed by the file's raw bytes."""
    fake = b"\x1f\x8b" + LONG.encode()
    out, cut = as_text(fake, 10**6, raw_cut=False)
    assert LONG.encode() in out and not cut
    tail = gzip.compress(b"the member") + b" then " + LONG.encode()
    out, _ = as_text(tail, 10**6, raw_cut=False)
    assert out.startswith(b"the member") and LONG.encode() in out
    assert scan_of(out.decode("utf-8", "replace")) == ["long"]


def test_formats_the_scan_cannot_see_into_are_named() -> None:
    assert opaque_format(b"PAR1\x15\x04") == "parquet"
    assert opaque_format(b"PK\x03\x04") == "zip"
    assert opaque_format(gzip.compress(b"x")) == "gzip"  # a second layer, once decompressed
    assert opaque_format(b'{"text": "plain"}') is None


def test_a_dataset_is_read_for_at_most_its_file_cap() -> None:
    files = [(f"f{n:05}", lambda n: b"x") for n in range(MAX_DATASET_FILES + 5)]
    read = read_until(files, 10**6)
    assert len(read.files) == MAX_DATASET_FILES and read.cut


# -- the activity over the fake backend ------------------------------------------------------


class OneRecord:
    """`EpisodeTrail` of one episode (the check reads its scripts and datasets from it)."""

    def __init__(self, record: AuditRecord) -> None:
        self._record = record

    async def read(self, episode_id: str) -> AuditRecord:
        assert episode_id == self._record.episode_id
        return self._record


def mounting(datasets: dict[str, str], episode_id: str = "ep-0123456789abcdef") -> OneRecord:
    """An episode whose one agent job mounted `datasets` (repo id -> commit)."""
    job = AuditJob(
        job_id="job-1",
        workflow_id=f"episode-{episode_id}/job/1",
        role="agent",
        flavor="cpu-basic",
        timeout_s=600,
        base_model="m",
        base_model_revision="r" * 40,
        datasets=datasets,
    )
    return OneRecord(
        AuditRecord(
            episode_id=episode_id,
            task_id="t_public",
            base_model="m",
            base_model_revision="r" * 40,
            jobs=[job],
        )
    )


def items_task(tasks_dir: Path) -> CheckContamination:
    folder = tasks_dir / "t_public"
    folder.mkdir(parents=True)
    (folder / "test_items.jsonl").write_text(json.dumps({"id": "long", "text": LONG}) + "\n")
    return CheckContamination(
        episode_id="ep-0123456789abcdef",
        task_id="t_public",
        spec=ContaminationSpec(test_items="test_items.jsonl"),
    )


def junk_then_leaky(junk: int) -> tuple[FakeScenario, dict[str, str]]:
    datasets = {f"junk/j{n}": FakeDataset(files={"blob.txt": "x " * junk}) for n in range(3)}
    datasets["org/leaky"] = FakeDataset(files={"train.txt": LONG})
    return FakeScenario(datasets=datasets), {repo: "0" * 40 for repo in datasets}


async def test_datasets_mounted_first_cannot_use_up_the_total_before_a_later_one(
    tmp_path: Path,
) -> None:
    """Three junk datasets larger than the total are mounted before one holding an item: each
    gets its fair share (what is left over the datasets still to read), so the item is found,
    and the agent's counts say that three datasets were not read to their end."""
    scenario, mounted = junk_then_leaky(junk=2000)  # 4000 bytes each
    check = ContaminationActivities(
        mounting(mounted),
        FakeBackend(tmp_path / "fake", scenario),
        tmp_path,
        dataset_bytes=3000,
        total_bytes=4000,
    )
    report = await check.check_contamination(items_task(tmp_path))
    assert report.summary.flagged and report.summary.unread_datasets == 3
    assert report.evidence is not None
    read = {s.where.split("@")[0]: s for s in report.evidence.sources}
    assert [read[f"dataset:junk/j{n}"].bytes_read for n in range(3)] == [1000, 1000, 1000]
    assert read["dataset:org/leaky"].bytes_read == len(LONG) and not read["dataset:org/leaky"].cut


async def test_datasets_not_reached_in_time_are_counted_unread_and_scripts_still_checked(
    tmp_path: Path,
) -> None:
    scenario, mounted = junk_then_leaky(junk=10)
    check = ContaminationActivities(
        mounting(mounted), FakeBackend(tmp_path / "fake", scenario), tmp_path, read_seconds=0
    )
    report = await check.check_contamination(items_task(tmp_path))
    assert report.summary.checked and not report.summary.flagged
    assert report.summary.unread_datasets == 4
    assert report.evidence is not None
    assert {s.error for s in report.evidence.sources} == {"not read: time"}


async def test_an_unreadable_dataset_is_counted_for_the_agent_and_named_in_the_evidence_only(
    tmp_path: Path,
) -> None:
    scenario, mounted = junk_then_leaky(junk=10)
    mounted["org/gone"] = "9" * 40
    check = ContaminationActivities(
        mounting(mounted), FakeBackend(tmp_path / "fake", scenario), tmp_path
    )
    report = await check.check_contamination(items_task(tmp_path))
    assert report.summary.flagged and report.summary.unread_datasets == 1
    assert "org/gone" not in report.summary.model_dump_json()
    assert report.evidence is not None
    (gone,) = [s for s in report.evidence.sources if s.error]
    assert gone.where == f"dataset:org/gone@{'9' * 40}"


async def test_a_parquet_file_is_named_in_the_evidence_as_read_only_as_raw_bytes(
    tmp_path: Path,
) -> None:
    scenario = FakeScenario(
        datasets={"org/columns": FakeDataset(files={"train.parquet": "PAR1 pages PAR1"})}
    )
    check = ContaminationActivities(
        mounting({"org/columns": "0" * 40}), FakeBackend(tmp_path / "fake", scenario), tmp_path
    )
    report = await check.check_contamination(items_task(tmp_path))
    assert report.evidence is not None
    (source,) = [s for s in report.evidence.sources if s.where.startswith("dataset:")]
    assert source.opaque_files == {"parquet": 1}


# -- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "flagged", "reward"),
    [("report", True, 0.8), ("zero_reward", True, 0.0), ("zero_reward", False, 0.8)],
)
def test_the_policy_decides_the_reward(policy: str, flagged: bool, reward: float) -> None:
    summary = ContaminationSummary(checked=True, flagged=flagged, policy=policy)  # type: ignore[arg-type]
    assert reward_under_policy(0.8, summary) == reward
    assert json.loads(summary.model_dump_json())["policy"] == policy


def test_a_jobs_outputs_are_read_training_data_first_and_weights_by_their_header_only(
    tmp_path: Path,
) -> None:
    """A job's outputs: every file but the weights first (in path order), then each
    `*.safetensors` file's header, never its tensor data, so a checkpoint far over the cap
    leaves the training data beside it readable."""
    import struct

    from activities.contamination.dataset_bytes import SAFETENSORS_HEADER_BYTES

    header = b'{"__metadata__":{"note":"' + LONG.encode() + b'"}}'
    weights = struct.pack("<Q", len(header)) + header + b"\x07" * (4 * MIB)
    (tmp_path / "a-model.safetensors").write_bytes(weights)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"q": LONG}) + "\n")
    read = read_folder(tmp_path, 1 * MIB, outputs=True)
    assert [path for path, _ in read.files] == ["data/train.jsonl", "a-model.safetensors"]
    assert read.files[1][1] == weights[: 8 + len(header)] and not read.cut
    # A header that claims more than the cap is read only to the cap.
    huge = struct.pack("<Q", 1 << 40) + b"{" + b" " * (2 * SAFETENSORS_HEADER_BYTES)
    (tmp_path / "a-model.safetensors").write_bytes(huge)
    read = read_folder(tmp_path, 8 * MIB, outputs=True)
    assert len(read.files[1][1]) == 8 + SAFETENSORS_HEADER_BYTES
    # Without `outputs` (a dataset), files are read in path order, whole, up to the cap.
    assert read_folder(tmp_path, 8 * MIB).files[0][0] == "a-model.safetensors"
