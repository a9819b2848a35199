"""The retention sweep's activity (`workflows/operations/retention.py`; docs/operations.md):
delete the
job folders of episodes that ended longer ago than the policy says, keeping submitted artifacts
until their own, longer time.

Folders are found through the audit records, which exist only for episodes that ended, hold the
end time and every job's ref, and outlive Temporal's retention (a Hugging Face bucket folder
does not name its episode; a record names every folder). An episode whose workflow still runs
(its record is written while it ends) is left alone until it has closed. What was deleted is
written to the record's sidecar, `<audit dir>/retention/<episode_id>.json`, which later sweeps
read instead of the record. Idempotent: a folder already gone deletes nothing; a sweep that
stops halfway is finished by the next.

Folders whose episode left no record (it ended before records existed, or its record failed
to write) are found, on a storage whose folders name their episode (`FolderLister`: the local
backend's `job.json`), after the records, with what is left of the run's cap: one is deleted,
whole, once the job ended longer ago than the retention (`retention_plan.unrecorded_due`), no
record of its episode exists and the episode's workflow is not open; with the same guards
as any other (the storage refuses a running job, anything outside its root, a link). What was
deleted goes to a sidecar marked `unrecorded`.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import ValidationError
from temporalio import activity

from activities.backends.interface import TransientBackendError
from activities.backends.storage import JobStorage, StorageRefused
from activities.ports import EpisodeLiveness
from activities.records.retention_plan import Due, JobFolder, due, entry_of, unrecorded_due
from posttrain_common.contracts.activities import RetentionApi
from posttrain_common.contracts.audit import AuditRecord
from posttrain_common.contracts.retention import (
    RetainedFolder,
    RetentionDeletion,
    RetentionEntry,
    RetentionPolicy,
    RetentionReport,
    SweepRetention,
    cut,
)
from posttrain_env.errors import ToolError

SIDECARS = "retention"


@runtime_checkable
class FolderLister(Protocol):
    """A storage whose job folders name their own episode (the local backend's)."""

    async def job_folders(self) -> list[JobFolder]: ...


class RetentionActivities(RetentionApi):
    def __init__(
        self,
        storage: JobStorage,
        episodes: EpisodeLiveness,
        audit_dir: Path,
        policy: RetentionPolicy,
    ) -> None:
        self._storage = storage
        self._episodes = episodes
        self._audit_dir = audit_dir
        self._policy = policy

    @activity.defn
    async def sweep_retention(self, request: SweepRetention) -> RetentionReport:
        report = RetentionReport()
        budget = self._policy.max_folders
        if not self._policy.deletes_anything:
            report.done = True
            return report
        for episode_id in await asyncio.to_thread(record_ids, self._audit_dir):
            if budget <= 0:
                report.more = True
                break
            _heartbeat(episode_id)
            entry = await asyncio.to_thread(self._entry, episode_id, request.dry_run, report)
            if entry is None or entry.finished or entry.backend != self._storage.name:
                continue
            report.examined += 1
            todo = due(entry, request.now, self._policy)[:budget]
            if not todo:
                continue
            if await self._episodes.is_running(episode_id):
                report.running.append(episode_id)  # ending now: its jobs may still be live
                continue
            budget -= len(todo)
            for item in todo:
                _heartbeat(episode_id, item.folder.ref)
                await self._delete(entry, item, request, report)
            if not request.dry_run:
                entry.updated_at = request.now
                await asyncio.to_thread(write_entry, self._audit_dir, entry)
        if not report.more and isinstance(self._storage, FolderLister):
            await self._sweep_unrecorded(self._storage, request, report, budget)
        report.done = True
        return report

    async def _sweep_unrecorded(
        self,
        lister: FolderLister,
        request: SweepRetention,
        report: RetentionReport,
        budget: int,
    ) -> None:
        """The due folders of episodes that have no audit record (module docstring)."""
        by_episode: dict[str, list[JobFolder]] = defaultdict(list)
        for folder in await lister.job_folders():
            if unrecorded_due(folder, request.now, self._policy):
                by_episode[folder.episode_id].append(folder)
        for episode_id, folders in sorted(by_episode.items()):
            if (self._audit_dir / f"{episode_id}.json").exists():
                continue  # the records' pass decides for it
            if budget <= 0:
                report.more = True
                return
            _heartbeat(episode_id)
            if await self._episodes.is_running(episode_id):
                report.running.append(episode_id)
                continue
            entry = await asyncio.to_thread(read_entry, self._audit_dir, episode_id)
            if entry is None or not entry.unrecorded:
                entry = RetentionEntry(
                    episode_id=episode_id, backend=self._storage.name, unrecorded=True
                )
            known = {f.ref: f for f in entry.folders}
            for found in folders[:budget]:
                folder = known.get(found.ref)
                if folder is None:
                    folder = RetainedFolder(job_id=found.job_id, role=found.role, ref=found.ref)
                    entry.folders.append(folder)
                    known[found.ref] = folder
                if folder.refused is not None:
                    continue
                budget -= 1
                _heartbeat(episode_id, found.ref)
                await self._delete(
                    entry, Due(folder, keep_artifact=False), request, report, unrecorded=True
                )
            # The latest end of its jobs seen: what the episode's end would be in a record.
            ended = [f.ended_at for f in folders if f.ended_at is not None]
            if entry.ended_at is not None:
                ended.append(entry.ended_at)
            entry.ended_at = max(ended, default=None)
            if not request.dry_run:
                entry.updated_at = request.now
                await asyncio.to_thread(write_entry, self._audit_dir, entry)

    async def _delete(
        self,
        entry: RetentionEntry,
        item: Due,
        request: SweepRetention,
        report: RetentionReport,
        *,
        unrecorded: bool = False,
    ) -> None:
        folder = item.folder
        deletion = RetentionDeletion(
            episode_id=entry.episode_id,
            job_id=folder.job_id,
            ref=folder.ref,
            artifact_kept=item.keep_artifact,
            unrecorded=unrecorded,
        )
        if request.dry_run:
            report.deleted.append(deletion)
            return
        try:
            deletion.bytes = await self._storage.delete(
                folder.ref, keep_artifact=item.keep_artifact
            )
        except StorageRefused as err:
            if err.lasting:
                folder.refused = cut(str(err))
                report.refused[folder.ref] = folder.refused
            else:
                report.failed[folder.ref] = cut(str(err))
            activity.logger.warning("retention left %s alone: %s", folder.ref, err)
            return
        except (ToolError, TransientBackendError) as err:
            report.failed[folder.ref] = cut(str(err))
            activity.logger.warning("retention could not delete %s yet: %s", folder.ref, err)
            return
        folder.bytes_deleted += deletion.bytes
        if item.keep_artifact:
            folder.rest_deleted_at = request.now
        else:
            folder.deleted_at = request.now
        report.deleted.append(deletion)
        report.bytes_deleted += deletion.bytes
        activity.logger.info(
            "retention deleted %s of episode %s (%d bytes%s)",
            folder.ref,
            entry.episode_id,
            deletion.bytes,
            ", submitted artifact kept" if item.keep_artifact else "",
        )

    def _entry(
        self, episode_id: str, dry_run: bool, report: RetentionReport
    ) -> RetentionEntry | None:
        """The record's sidecar; made from the record the first time (and written, so later
        sweeps read only the small sidecar)."""
        entry = read_entry(self._audit_dir, episode_id)
        if entry is not None and not entry.unrecorded:
            return entry
        entry_before = entry
        try:
            record = AuditRecord.model_validate_json(
                (self._audit_dir / f"{episode_id}.json").read_bytes()
            )
        except (OSError, ValidationError):
            report.unreadable.append(episode_id)
            return None
        entry = entry_of(record)
        if entry_before is not None:  # swept as unrecorded before its record was there
            _carry_over(entry_before, entry)
        if not dry_run:
            write_entry(self._audit_dir, entry)
        return entry


def _carry_over(before: RetentionEntry, entry: RetentionEntry) -> None:
    """What a sweep did to folders, kept when their episode's record turns up later."""
    done = {f.ref: f for f in before.folders}
    for folder in entry.folders:
        old = done.get(folder.ref)
        if old is not None:
            folder.deleted_at, folder.refused = old.deleted_at, old.refused
            folder.bytes_deleted = old.bytes_deleted


def record_ids(audit_dir: Path) -> list[str]:
    """Episode ids of the records in `audit_dir`, in a fixed order (a sweep that stops at its cap
    is resumed by the next in the same order; finished episodes cost one small read)."""
    try:
        names = os.listdir(audit_dir)
    except FileNotFoundError:
        return []
    return sorted(name.removesuffix(".json") for name in names if name.endswith(".json"))


def entry_path(audit_dir: Path, episode_id: str) -> Path:
    return audit_dir / SIDECARS / f"{episode_id}.json"


def read_entry(audit_dir: Path, episode_id: str) -> RetentionEntry | None:
    try:
        return RetentionEntry.model_validate_json(entry_path(audit_dir, episode_id).read_bytes())
    except (FileNotFoundError, ValidationError):
        return None  # a torn or foreign sidecar is made again from the record


def write_entry(audit_dir: Path, entry: RetentionEntry) -> None:
    """Atomically (a reader never sees half a sidecar)."""
    path = entry_path(audit_dir, entry.episode_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(entry.model_dump_json(indent=2))
    os.replace(tmp, path)


def _heartbeat(*details: str) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)
