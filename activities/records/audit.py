"""The audit record's activity: when an episode ends, read what it did (its history, through
`EpisodeTrail`) and what its jobs installed (the launcher's own lines, from the backend), and
write the record to a folder of its own, where it outlives Temporal's retention."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from pathlib import Path

from temporalio import activity

from activities.backends.interface import JobsBackend, TransientBackendError
from activities.backends.storage import JobStorage
from activities.jobs.launcher_report import read_launcher_lines
from activities.ports import EpisodeTrail
from posttrain_common.contracts.activities import AuditApi
from posttrain_common.contracts.audit import AuditRecord, WriteAudit
from posttrain_common.keys import ServerKey
from posttrain_env.errors import ToolError

# The launcher's `installed` line comes before the script's output: read from the start of a
# log, this many lines back from the end at most.
INSTALLED_LOG_TAIL = 10_000


class AuditActivities(AuditApi):
    def __init__(
        self,
        trail: EpisodeTrail,
        backend: JobsBackend,
        key: ServerKey,
        folder: Path,
        storage: JobStorage | None = None,
    ) -> None:
        """`storage`: where the backend keeps job folders (each job's artifact size is read
        from it); None: sizes are not measured."""
        self._trail = trail
        self._backend = backend
        self._key = key
        self._folder = folder
        self._storage = storage

    @activity.defn
    async def write_audit(self, request: WriteAudit) -> str:
        record = await self._trail.read(request.episode_id)
        if record.end is None:
            record.end = request.end
            record.ended_at = request.now
        record.contamination = request.contamination
        record.operator_actions = request.operator_actions
        for job in record.jobs:
            if request.settled_micro_usd and job.job_id in request.settled_micro_usd:
                job.settled_micro_usd = request.settled_micro_usd[job.job_id]
            if request.final_states and job.job_id in request.final_states:
                job.final_state = request.final_states[job.job_id]
            if request.stored_bytes and job.job_id in request.stored_bytes:
                job.stored_bytes = request.stored_bytes[job.job_id]
            if request.outputs_refused and job.job_id in request.outputs_refused:
                job.outputs_refused = request.outputs_refused[job.job_id]
        record.storage = request.storage
        if request.final_spend_micro_usd is not None:
            record.final_spend_micro_usd = request.final_spend_micro_usd
        await self._add_installed(record, request.now)
        await self._add_artifact_sizes(record)
        return await asyncio.to_thread(write_record, self._folder, record)

    async def _add_installed(self, record: AuditRecord, now: datetime) -> None:
        for job in record.jobs:
            if job.backend_job_id is None or job.role != "agent":
                continue
            try:
                lines = await self._backend.logs(job.backend_job_id, INSTALLED_LOG_TAIL, now)
            except (ToolError, TransientBackendError):
                continue  # the logs are gone (or not reachable now): the record says nothing
            report = read_launcher_lines(lines, self._key.job_nonce(job.workflow_id))
            job.installed, job.installer = report.installed, report.installer
            job.loopback_tcp = report.loopback_tcp

    async def _add_artifact_sizes(self, record: AuditRecord) -> None:
        if self._storage is None:
            return
        for job in record.jobs:
            if job.backend_job_id is None:
                continue
            try:
                job.artifact_bytes = await self._storage.artifact_bytes(job.backend_job_id)
            except (ToolError, TransientBackendError):
                continue  # not reachable now: the record says "not measured"


def record_path(folder: Path, episode_id: str) -> Path:
    return folder / f"{episode_id}.json"


def write_record(folder: Path, record: AuditRecord) -> str:
    """Write atomically (a reader never sees half a record); the file's name."""
    folder.mkdir(parents=True, exist_ok=True)
    path = record_path(folder, record.episode_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=2))
    os.replace(tmp, path)
    return path.name
