"""The retention sweep's activity (`workflows/retention.py`; README "Operating it"): delete the
job folders of episodes that ended longer ago than the policy says, keeping submitted artifacts
until their own, longer time.

Folders are found through the audit records, which exist only for episodes that ended, hold the
end time and every job's ref, and outlive Temporal's retention (a Hugging Face bucket folder
does not name its episode; a record names every folder). An episode whose workflow still runs
(its record is written while it ends) is left alone until it has closed. What was deleted is
written to the record's sidecar, `<audit dir>/retention/<episode_id>.json`, which later sweeps
read instead of the record. Idempotent: a folder already gone deletes nothing; a sweep that
stops halfway is finished by the next.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity

from activities.backend import TransientBackendError
from activities.ports import EpisodeLiveness
from activities.retention_plan import Due, due, entry_of
from activities.storage import JobStorage, StorageRefused
from posttrain_env.contracts.activities import RetentionApi
from posttrain_env.contracts.audit import AuditRecord
from posttrain_env.contracts.retention import (
    RetentionDeletion,
    RetentionEntry,
    RetentionPolicy,
    RetentionReport,
    SweepRetention,
    cut,
)
from posttrain_env.errors import ToolError

SIDECARS = "retention"


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
        report.done = True
        return report

    async def _delete(
        self, entry: RetentionEntry, item: Due, request: SweepRetention, report: RetentionReport
    ) -> None:
        folder = item.folder
        deletion = RetentionDeletion(
            episode_id=entry.episode_id,
            job_id=folder.job_id,
            ref=folder.ref,
            artifact_kept=item.keep_artifact,
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
        if entry is not None:
            return entry
        try:
            record = AuditRecord.model_validate_json(
                (self._audit_dir / f"{episode_id}.json").read_bytes()
            )
        except (OSError, ValidationError):
            report.unreadable.append(episode_id)
            return None
        entry = entry_of(record)
        if not dry_run:
            write_entry(self._audit_dir, entry)
        return entry


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
