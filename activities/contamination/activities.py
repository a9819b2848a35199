"""The contamination check's activity: look for a task's test items in what the agent
controlled, grader-side, before the reward is final (docs/tasks.md, "Contamination check").

It runs on the main worker, never in a job and never in agent code, and costs the agent
nothing. What it reads: the text of every script the episode's agent jobs ran (from the
episode's own history, through `EpisodeTrail`, so no script crosses Temporal again) and the
first bytes of every dataset those jobs mounted, at the revision they mounted, read through the
backend as a job would see it (`activities/contamination/dataset_bytes.py`: compressed files
decompressed), and what those jobs wrote under `/data/outputs/` (the submitted job's first):
the training inputs and outputs an agent keeps beside its weights, every file but the weights
read first, each weights file's header only.
Each dataset gets at most CONTAMINATION_DATASET_BYTES, and its fair share of what is left of
CONTAMINATION_TOTAL_BYTES (what is left divided by the datasets still to read), so datasets
mounted first cannot use up the total before a later one is read; each job's outputs likewise
get at most CONTAMINATION_OUTPUTS_BYTES and their fair share of
CONTAMINATION_OUTPUTS_TOTAL_BYTES. What was not read (cut at a cap, not read at all,
unreadable), dataset or outputs, is recorded in the evidence and counted, with no name, in the
agent's `unread_datasets`. The scan itself is `activities/contamination/scan.py`.

A task whose declaration cannot be read (its test items file missing or malformed) or a dataset
that cannot be read is not retried forever: the check reports `check_failed` (or the source as
not scanned) and the reward stands; a transient backend error is retried by Temporal.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from temporalio import activity

from activities.backends.interface import JobsBackend
from activities.contamination.dataset_bytes import opaque_format
from activities.contamination.scan import ItemText, Scan, cap_matches
from activities.ports import EpisodeTrail
from posttrain_common.contracts.activities import ContaminationApi
from posttrain_common.contracts.audit import AuditJob, AuditRecord
from posttrain_common.contracts.contamination import (
    MAX_LISTED_SOURCES,
    CheckContamination,
    ContaminationEvidence,
    ContaminationMatch,
    ContaminationReport,
    ContaminationSource,
    check_failed,
    skipped_generated,
    unchecked,
)
from posttrain_env.errors import ToolError
from posttrain_env.limits import (
    CONTAMINATION_DATASET_BYTES,
    CONTAMINATION_ITEMS_BYTES,
    CONTAMINATION_OUTPUTS_BYTES,
    CONTAMINATION_OUTPUTS_TOTAL_BYTES,
    CONTAMINATION_TOTAL_BYTES,
    cut_text,
)
from posttrain_env.models import ContaminationSummary
from tasks.registry import TaskSpecError, test_items_path

# An item's id as the evidence names it (ids come from the task's own file).
MAX_ITEM_ID_CHARS = 200
# Datasets are read only while this much of the activity's time has passed (its timeout is
# CONTAMINATION_TIMEOUT, 15 minutes): the rest are reported unread, so a check that meets slow
# or endless datasets still completes, with `unread_datasets` saying what it missed, instead
# of timing out into `check_failed`.
CONTAMINATION_READ_S = 10 * 60.0


class ItemsFileError(ValueError):
    """The task's test items cannot be read; the message says why (it quotes no item)."""


class ContaminationActivities(ContaminationApi):
    def __init__(
        self,
        trail: EpisodeTrail,
        backend: JobsBackend,
        tasks_dir: Path,
        *,
        dataset_bytes: int = CONTAMINATION_DATASET_BYTES,
        total_bytes: int = CONTAMINATION_TOTAL_BYTES,
        read_seconds: float = CONTAMINATION_READ_S,
        outputs_bytes: int = CONTAMINATION_OUTPUTS_BYTES,
        outputs_total_bytes: int = CONTAMINATION_OUTPUTS_TOTAL_BYTES,
        accept_unchecked: bool = False,
    ) -> None:
        self._trail = trail
        self._backend = backend
        self._tasks_dir = tasks_dir
        self._dataset_bytes = dataset_bytes
        self._total_bytes = total_bytes
        self._read_seconds = read_seconds
        self._outputs_bytes = outputs_bytes
        self._outputs_total_bytes = outputs_total_bytes
        self._accept_unchecked = accept_unchecked

    @activity.defn
    async def check_contamination(self, check: CheckContamination) -> ContaminationReport:
        spec = check.spec
        if spec.test_items is None:
            return skipped_generated()
        if self._accept_unchecked:
            # Reset let the episode start without its items (the operator's setting): if they
            # are still missing, say so apart from a check that failed.
            missing = await asyncio.to_thread(self._missing_items, check)
            if missing is not None:
                return unchecked(spec, f"{missing} (accepted unchecked by the operator)")
        try:
            items = await asyncio.to_thread(self._test_items, check)
        except ItemsFileError as err:
            return check_failed(spec, str(err))
        record = await self._trail.read(check.episode_id)
        scan = Scan(items, spec.ngram, spec.threshold)
        sources = await self._scan(scan, record)
        matches, unlisted = cap_matches(scan.matches())
        evidence = ContaminationEvidence(
            test_items=spec.test_items,
            items=scan.items,
            ngram=spec.ngram,
            threshold=spec.threshold,
            sources=[
                source.model_copy(update={"where": cut_text(source.where)})
                for source in sources[:MAX_LISTED_SOURCES]
            ],
            sources_unlisted=max(0, len(sources) - MAX_LISTED_SOURCES),
            matches=[
                ContaminationMatch(
                    item_id=cut_text(match.item_id, MAX_ITEM_ID_CHARS),
                    found_ngrams=match.found_ngrams,
                    item_ngrams=match.item_ngrams,
                    places=[cut_text(place) for place in match.places],
                    snippet=match.snippet,
                )
                for match in matches
            ],
            matches_unlisted=unlisted,
        )
        matched = len(matches) + unlisted
        summary = ContaminationSummary(
            checked=True,
            flagged=matched > 0,
            policy=spec.policy,
            matched_items=matched,
            unread_datasets=sum(1 for source in sources if source.unread),
        )
        return ContaminationReport(summary=summary, evidence=evidence)

    def _missing_items(self, check: CheckContamination) -> str | None:
        try:
            path = test_items_path(check.task_id, check.family, check.spec, self._tasks_dir)
        except TaskSpecError as err:
            return str(err)
        return None if path.is_file() else f"{path.name} is missing"

    def _test_items(self, check: CheckContamination) -> list[ItemText]:
        try:
            path = test_items_path(check.task_id, check.family, check.spec, self._tasks_dir)
        except TaskSpecError as err:
            raise ItemsFileError(str(err)) from None
        return load_test_items(path)

    async def _scan(self, scan: Scan, record: AuditRecord) -> list[ContaminationSource]:
        """Feed every agent script, then every mounted dataset, to `scan`; what was read."""
        agent_jobs = [job for job in record.jobs if job.role == "agent"]
        sources: list[ContaminationSource] = []
        for digest in dict.fromkeys(job.script_sha256 for job in agent_jobs if job.script_sha256):
            text = record.scripts.get(digest, "")
            where = f"script:{digest}"
            await asyncio.to_thread(scan.feed_text, where, text)
            sources.append(ContaminationSource(where=where, bytes_read=len(text.encode())))
        datasets = list(
            dict.fromkeys(
                (repo_id, revision)
                for job in agent_jobs
                for repo_id, revision in job.datasets.items()
            )
        )
        deadline = time.monotonic() + self._read_seconds
        left = self._total_bytes
        for n, (repo_id, revision) in enumerate(datasets):
            where = f"dataset:{repo_id}@{revision}"
            # Each dataset's fair share of what is left: the datasets mounted first cannot
            # use up the total before a later one is read (what one leaves goes to the rest).
            share = min(self._dataset_bytes, left // (len(datasets) - n))
            if share <= 0:
                sources.append(ContaminationSource(where=where, cut=True, error="not read: cap"))
                continue
            if time.monotonic() >= deadline:
                sources.append(ContaminationSource(where=where, cut=True, error="not read: time"))
                continue
            try:
                read = await self._backend.read_dataset(repo_id, revision, share)
            except ToolError as err:  # gone, or never readable: not scanned, said so
                sources.append(ContaminationSource(where=where, error=cut_text(err.message)))
                continue
            size = 0
            opaque: Counter[str] = Counter()
            for path, data in read.files:
                await asyncio.to_thread(scan.feed_bytes, f"{where}/{path}", data)
                size += len(data)
                kind = opaque_format(data[:8])
                if kind is not None:
                    opaque[kind] += 1
            left -= size
            sources.append(
                ContaminationSource(
                    where=where, bytes_read=size, cut=read.cut, opaque_files=dict(opaque)
                )
            )
        sources += await self._scan_outputs(scan, record, agent_jobs, deadline)
        return sources

    async def _scan_outputs(
        self, scan: Scan, record: AuditRecord, agent_jobs: list[AuditJob], deadline: float
    ) -> list[ContaminationSource]:
        """Feed what each agent job left under /data/outputs/ to `scan`, the submitted job's
        first, each within its fair share of the outputs' total; what was read."""
        submitted = {e.evaluated_job_id for e in record.evaluations if e.role == "grader"}
        jobs = sorted(
            (job for job in agent_jobs if job.backend_job_id),
            key=lambda job: job.job_id not in submitted,  # stable: the rest keep their order
        )
        sources: list[ContaminationSource] = []
        left = self._outputs_total_bytes
        for n, job in enumerate(jobs):
            where = f"outputs:{job.job_id}"
            share = min(self._outputs_bytes, left // (len(jobs) - n))
            if share <= 0:
                sources.append(ContaminationSource(where=where, cut=True, error="not read: cap"))
                continue
            if time.monotonic() >= deadline:
                sources.append(ContaminationSource(where=where, cut=True, error="not read: time"))
                continue
            try:
                read = await self._backend.read_outputs(str(job.backend_job_id), share)
            except ToolError as err:  # gone (retention), or never written
                sources.append(ContaminationSource(where=where, error=cut_text(err.message)))
                continue
            size = 0
            opaque: Counter[str] = Counter()
            for path, data in read.files:
                await asyncio.to_thread(scan.feed_bytes, f"{where}/{path}", data)
                size += len(data)
                kind = opaque_format(data[:8])
                if kind is not None:
                    opaque[kind] += 1
            left -= size
            sources.append(
                ContaminationSource(
                    where=where, bytes_read=size, cut=read.cut, opaque_files=dict(opaque)
                )
            )
        return sources


def load_test_items(path: Path) -> list[ItemText]:
    """The items of a JSON Lines file: one object per line with a string `text` and an
    optional `id` (a string or an integer; default `line-<n>`); blank lines are skipped.
    Raises ItemsFileError naming the line, never quoting it."""
    try:
        if path.stat().st_size > CONTAMINATION_ITEMS_BYTES:
            raise ItemsFileError(
                f"{path.name} is over {CONTAMINATION_ITEMS_BYTES} bytes (the test items' cap)"
            )
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ItemsFileError(f"{path.name} cannot be read: {type(err).__name__}") from None
    items: list[ItemText] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise ItemsFileError(f"{path.name} line {n}: not JSON") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            raise ItemsFileError(f"{path.name} line {n}: an object with a string `text`")
        item_id = entry.get("id", f"line-{n}")
        if not isinstance(item_id, str | int) or isinstance(item_id, bool):
            raise ItemsFileError(f"{path.name} line {n}: `id` is a string or an integer")
        items.append(ItemText(item_id=str(item_id), text=entry["text"]))
    return items
