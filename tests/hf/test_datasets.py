"""Reading a mounted dataset for the contamination check on the hf backend: the real `HfApi`
and the backend's own HTTP client over the HTTP-level fake Hub (tests/hf/http_hub.py), which
serves a dataset's tree listing page by page and its files, LFS ones through a redirect to its
storage host, honouring `Range` as the Hub does. What is asserted: the commit the job mounted
is read even after the dataset moved on; no request carries the token; only file entries
inside the dataset are fetched; each file is asked for no more than fits under the cap;
32 MiB per dataset, 256 MiB over all of them, shared fairly; compressed files are read as
their text, a decompression bomb stopping at the cap."""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
import zstandard
from temporalio.testing import WorkflowEnvironment

from activities.backends.hf.inputs import MAX_LISTED_ENTRIES
from activities.contamination.activities import ContaminationActivities
from job_launcher.trusted_lines import SCORE_TAG, format_trusted_line
from posttrain_common.contracts.audit import AuditJob, AuditRecord
from posttrain_common.contracts.contamination import CheckContamination
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import CONTAMINATION_DATASET_BYTES, CONTAMINATION_TOTAL_BYTES, MIB
from posttrain_env.models import ContaminationSpec
from tests.hf.conftest import FAST_HTTP, TOKEN, http_backend
from tests.hf.fake_hub import JobPlan
from tests.hf.http_hub import CDN_HOST, HubHttp
from tests.hf.temporal import hf_worker
from tests.test_contamination import OneRecord
from tests.workflows.test_contamination import ITEMS, write_contamination_task

OLD, NEW = "a1" * 20, "b2" * 20
# Reads of tens of MiB through the fake take a while on a loaded machine: the call's budget
# (1.5 s in FAST_HTTP, what is left of the activity's 15 minutes in production) and the wait
# between two bytes (0.3 s there, 10 s in production) are raised. These tests are about what is
# read, not how fast; tests/hf/test_faults.py is where the bounds are the subject.
BIG_READS = dataclasses.replace(FAST_HTTP, call_s=120.0, read_s=10.0)
DATASET_ROUTES = ("dataset_tree", "dataset_file", "lfs_file")


def leaky_lines() -> bytes:
    return "\n".join(json.dumps({"prompt": item["text"]}) for item in ITEMS).encode()


def dataset_requests(http: HubHttp, route: str) -> list[str]:
    return [seen.path for seen in http.requests_to(route)]


async def test_a_dataset_is_read_at_the_commit_the_job_mounted_without_the_token(
    http_hub: HubHttp,
) -> None:
    files = {
        "README.md": b"# trivia\n",
        "data/part-0.jsonl": b'{"q": "first"}\n',
        "data/part-1.jsonl": b'{"q": "second"}\n',
        "data/train.jsonl": b"stored in LFS " * 10,
        "empty.txt": b"",
    }
    http_hub.add_dataset("org/trivia", OLD, files, lfs={"data/train.jsonl"})
    http_hub.add_dataset("org/trivia", NEW, {"README.md": b"# moved on\n"})
    http_hub.tree_page_size = 2  # a listing of several pages, followed by its Link header
    backend = http_backend(http_hub)

    read = await backend.read_dataset("org/trivia", OLD, 10_000)

    assert read.files == sorted(files.items()) and not read.cut
    tree = http_hub.requests_to("dataset_tree")
    assert len(tree) == 3 and all(OLD in seen.path for seen in tree)  # 6 entries, pages of 2
    assert ("recursive", "true") in tree[0].params and ("cursor", "2") in tree[1].params
    # Each file at the commit, by the Hub's resolve URL; the LFS one redirected to its storage.
    assert dataset_requests(http_hub, "dataset_file") == [
        f"/datasets/org/trivia/resolve/{OLD}/{path}"
        for path in ("README.md", "data/part-0.jsonl", "data/part-1.jsonl", "data/train.jsonl")
    ]  # the empty file costs no request; folders are never fetched
    (stored,) = http_hub.requests_to("lfs_file")
    assert stored.host == CDN_HOST
    for seen in http_hub.seen:
        assert seen.route in DATASET_ROUTES and seen.token is None, seen
        if seen.route != "dataset_tree":
            assert seen.range is not None and seen.range.startswith("bytes=0-"), seen
    assert (await backend.read_dataset("org/trivia", NEW, 10_000)).files == [
        ("README.md", b"# moved on\n")
    ]


async def test_nothing_but_the_datasets_own_files_is_fetched(http_hub: HubHttp) -> None:
    """A listed path that would name something else once in a URL (an empty, `.` or `..`
    segment) is never requested, nor is a folder; a branch name is refused before any request
    (what a job mounted is a commit)."""
    http_hub.add_dataset(
        "org/odd",
        OLD,
        {
            "ok.txt": b"fine",
            "../models/org/secret/resolve/main/weights": b"never",
            "a/./b.txt": b"never",
            "a//c.txt": b"never",
        },
    )
    backend = http_backend(http_hub)
    read = await backend.read_dataset("org/odd", OLD, 10_000)
    assert read.files == [("ok.txt", b"fine")]
    assert dataset_requests(http_hub, "dataset_file") == [f"/datasets/org/odd/resolve/{OLD}/ok.txt"]
    with pytest.raises(ToolError, match="no commit") as refused:
        await backend.read_dataset("org/odd", "main", 10_000)
    assert refused.value.type is ErrorType.not_allowed
    assert len(http_hub.requests_to("dataset_tree")) == 1


async def test_a_commit_the_hub_no_longer_has_is_reported_unreadable(http_hub: HubHttp) -> None:
    http_hub.add_dataset("org/trivia", NEW, {"README.md": b"x"})
    backend = http_backend(http_hub)
    with pytest.raises(ToolError) as gone:
        await backend.read_dataset("org/trivia", OLD, 10_000)
    assert gone.value.type is ErrorType.hf_error and "404" in gone.value.message
    with pytest.raises(ToolError):
        await backend.read_dataset("org/none", OLD, 10_000)


async def test_a_dataset_is_read_up_to_32_mib_and_each_file_is_asked_only_for_what_fits(
    http_hub: HubHttp,
) -> None:
    big = b"w" * (CONTAMINATION_DATASET_BYTES + MIB)
    http_hub.add_dataset(
        "org/big",
        OLD,
        {"a.txt": b"a" * 1000, "b.bin": big, "c.txt": b"never read"},
        lfs={"b.bin"},
    )
    backend = http_backend(http_hub, limits=BIG_READS)
    read = await backend.read_dataset("org/big", OLD, CONTAMINATION_DATASET_BYTES)
    assert read.cut
    assert [(path, len(data)) for path, data in read.files] == [
        ("a.txt", 1000),
        ("b.bin", CONTAMINATION_DATASET_BYTES - 1000),
    ]
    asked = [seen.range for seen in http_hub.seen if seen.route in ("dataset_file", "lfs_file")]
    room = CONTAMINATION_DATASET_BYTES - 1000
    # One byte past the room left, to know the file is cut there; c.txt is never asked for.
    assert asked == [
        f"bytes=0-{CONTAMINATION_DATASET_BYTES}",
        f"bytes=0-{room}",
        f"bytes=0-{room}",
    ]


async def test_the_listing_is_read_up_to_its_cap_and_a_longer_one_counts_as_cut(
    http_hub: HubHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.backends.hf.inputs.MAX_LISTED_ENTRIES", 3)
    http_hub.add_dataset("org/many", OLD, {f"f{n}.txt": b"x" for n in range(5)})
    read = await http_backend(http_hub).read_dataset("org/many", OLD, 10_000)
    assert [path for path, _ in read.files] == ["f0.txt", "f1.txt", "f2.txt"] and read.cut
    assert MAX_LISTED_ENTRIES == 10_000


async def test_compressed_files_are_read_as_their_text_and_a_bomb_stops_at_the_cap(
    http_hub: HubHttp,
) -> None:
    text = leaky_lines()
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * MIB
    packed = b"".join(bomb.compress(zeros) for _ in range(64)) + bomb.flush()  # 64 MiB
    assert len(packed) < MIB // 4
    http_hub.add_dataset(
        "org/packed",
        OLD,
        {
            "a.jsonl.gz": gzip.compress(text),
            "b.jsonl.zst": zstandard.ZstdCompressor().compress(text),
            "c.bin.gz": packed,
            "d.txt": b"never read",
        },
        lfs={"c.bin.gz"},
    )
    backend = http_backend(http_hub, limits=BIG_READS)
    read = await backend.read_dataset("org/packed", OLD, CONTAMINATION_DATASET_BYTES)
    files = dict(read.files)
    assert files["a.jsonl.gz"] == text and files["b.jsonl.zst"] == text
    assert len(files["c.bin.gz"]) == CONTAMINATION_DATASET_BYTES - 2 * len(text)
    assert set(files["c.bin.gz"]) == {0} and read.cut and "d.txt" not in files


@pytest.mark.parametrize(
    ("dataset_bytes", "total_bytes"),
    [
        pytest.param(64 * 1024, 512 * 1024, id="small-caps"),
        # The real caps: 256 MiB moved through the fake and scanned, 10 to 30 s on 2 cores.
        pytest.param(
            CONTAMINATION_DATASET_BYTES,
            CONTAMINATION_TOTAL_BYTES,
            id="32-and-256-MiB",
            marks=pytest.mark.slow,
        ),
    ],
)
async def test_a_check_over_the_hf_backend_reads_at_most_the_total_shared_fairly(
    http_hub: HubHttp, tmp_path: Path, dataset_bytes: int, total_bytes: int
) -> None:
    """Nine junk datasets larger than the per-dataset cap are mounted before one that holds
    test items: each gets its fair share of the total, the total is never passed, the items
    are found, and the agent's counts say how many datasets were not read to their end."""
    junk = b"\0" * (dataset_bytes + 1024)  # one object, shared by the nine
    for n in range(9):
        http_hub.add_dataset(f"junk/j{n}", OLD, {"blob.bin": junk}, lfs={"blob.bin"})
    http_hub.add_dataset("org/leaky", OLD, {"train.jsonl": leaky_lines()})
    write_contamination_task(tmp_path, "t_public", 'test_items = "test_items.jsonl"\n')
    mounted = {**{f"junk/j{n}": OLD for n in range(9)}, "org/leaky": OLD}
    trail = OneRecord(
        AuditRecord(
            episode_id="ep-0123456789abcdef",
            task_id="t_public",
            base_model="m",
            base_model_revision="r" * 40,
            jobs=[
                AuditJob(
                    job_id="job-1",
                    workflow_id="w",
                    role="agent",
                    flavor="cpu-basic",
                    timeout_s=600,
                    base_model="m",
                    base_model_revision="r" * 40,
                    datasets=mounted,
                )
            ],
        )
    )
    check = ContaminationActivities(
        trail,
        http_backend(http_hub, limits=BIG_READS),
        tmp_path,
        dataset_bytes=dataset_bytes,
        total_bytes=total_bytes,
    )
    report = await check.check_contamination(
        CheckContamination(
            episode_id="ep-0123456789abcdef",
            task_id="t_public",
            spec=ContaminationSpec(test_items="test_items.jsonl"),
        )
    )

    summary = report.summary
    assert summary.flagged and summary.matched_items == len(ITEMS)
    assert summary.unread_datasets == 9
    assert report.evidence is not None
    sources = {s.where.split("@")[0]: s for s in report.evidence.sources}
    junk_read = [sources[f"dataset:junk/j{n}"].bytes_read for n in range(9)]
    fair = total_bytes // 10
    assert fair < dataset_bytes
    assert all(fair <= size <= fair + 9 for size in junk_read)
    assert sum(s.bytes_read for s in report.evidence.sources) <= total_bytes
    assert not sources["dataset:org/leaky"].cut
    # Asked of the Hub: never more than each dataset's share (plus the byte that shows a cut).
    asked = [int(seen.range.split("-")[1]) for seen in http_hub.requests_to("lfs_file")]  # type: ignore[union-attr]
    assert len(asked) == 9 and max(asked) <= fair + 9
    assert all(seen.token != TOKEN for seen in http_hub.seen)


async def test_an_hf_episode_that_mounted_a_dataset_holding_test_items_is_flagged(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path, http_hub: HubHttp
) -> None:
    """A whole episode on the hf backend over the HTTP fake Hub: the agent's job mounts a
    dataset whose gzipped JSON lines (stored in LFS) hold test items; the dataset then moves on
    to a clean commit before `submit`. The check reads the commit the job mounted, finds the
    items, and the task's `zero_reward` policy gives 0; the agent sees counts only, the audit
    record the evidence."""
    hub = http_hub.hub
    score = format_trusted_line(SCORE_TAG, "{nonce}", {"score": 0.75, "split": "hidden"})
    agent = JobPlan(scheduling_s=5, running_s=30)
    grader = JobPlan(scheduling_s=5, running_s=30, logs=["evaluating", score])
    hub.plan_for = lambda labels: agent if labels["posttrain-role"] == "agent" else grader
    packed = gzip.compress(leaky_lines())
    http_hub.add_dataset("org/leaky", OLD, {"train.jsonl.gz": packed}, lfs={"train.jsonl.gz"})
    async with hf_worker(time_skipping_env, tmp_path, hub, http_backend(http_hub)) as h:
        write_contamination_task(
            tmp_path / "tasks",
            "t_strict",
            'test_items = "test_items.jsonl"\npolicy = "zero_reward"\n',
        )
        ep = await h.episode("t_strict")
        job_id = await ep.submit_job(datasets=["org/leaky"])
        assert (await ep.wait_job(job_id)).data["state"] == "succeeded"
        http_hub.add_dataset("org/leaky", NEW, {"train.jsonl": b'{"prompt": "clean"}'})
        final = await ep.call_over(timedelta(minutes=5), "submit", job_id=job_id)
        assert final.done, final.data
        await ep.handle.result()
        record = json.loads((h.settings.state_dir / "audit" / f"{ep.episode_id}.json").read_text())

    assert final.reward == 0.0
    assert final.metadata["episode_end"]["contamination"] == {
        "checked": True,
        "flagged": True,
        "policy": "zero_reward",
        "matched_items": len(ITEMS),
        "unread_datasets": 0,
    }
    evidence = record["contamination"]["evidence"]
    places = {place for match in evidence["matches"] for place in match["places"]}
    assert places == {f"dataset:org/leaky@{OLD}/train.jsonl.gz"}
    assert [seen.path for seen in http_hub.requests_to("dataset_file")] == [
        f"/datasets/org/leaky/resolve/{OLD}/train.jsonl.gz"
    ]
    assert all(seen.token is None for seen in http_hub.seen if seen.route in DATASET_ROUTES)
