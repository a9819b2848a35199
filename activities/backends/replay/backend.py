"""The replay backend: a stand-in for the jobs service that answers jobs from recorded outcomes
(docs/backends.md, "Replay backend").

A job whose recording key (recording.py: a hash of its script and inputs) has a recording in the
store is *replayed*: it queues and runs for the recorded times multiplied by the time scale,
ends as the recorded run ended, reports the recorded billed running time (so it is charged what
the recorded run cost) and prints the recorded log with its own nonce on the recorded trusted
lines (an evaluation's score line). Every view of it says `replayed: true`. Its progress follows
the `now` each call carries (workflow time), as the fake's does, so time skipping works.

A job without a recording is refused with ToolError(not_recorded) naming the nearest recorded
keys, unless fall-through is on: then it runs on the underlying backend (`inner`) as any job
does, is charged as usual, and its outcome is recorded when it ends (cancelled or lost jobs are
not recorded). Whatever is not a job (models, datasets, prices, job limits, the job Python, the
storage of jobs that really ran) is the underlying backend's.

Each job's state is a small file of its own (`<state>/jobs/<ref>.json`, the ref derived from the
key), so calls about different jobs never wait for one another.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ValidationError

from activities.backends.interface import (
    DatasetBytes,
    JobRequest,
    JobsBackend,
    LiveJob,
    OrphanSource,
)
from activities.backends.replay.recording import (
    NEAREST_KEYS,
    JobInputs,
    Recording,
    bounded_log,
    replayed_lines,
    sha256_text,
)
from activities.backends.replay.store import ReplayStore
from activities.backends.storage import JobStorage
from job_launcher.builder import build_launcher
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.episodes import JobLimits
from posttrain_common.contracts.jobs import BackendJob, JobRole, KeepOutputs, OutputsRefusal
from posttrain_common.contracts.known_runs import KnownRun
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import MAX_LOG_TAIL
from posttrain_env.models import FlavorPrice, JobState

# The task's evaluation parameters as an evaluation receives them (activities/jobs/activities.py).
TASK_PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
REF_PREFIX = "replay-"


class _Job(BaseModel):
    """One job of the replay backend, as its state file holds it."""

    ref: str
    key: str  # the idempotency key (the job's workflow id)
    job_id: str
    role: JobRole
    created_at: datetime
    timeout_s: int
    nonce: str  # the job's own, for its trusted lines (this file is the backend's state)
    recording_key: str
    # Fall-through: the job runs on the underlying backend under this ref; None: replayed.
    inner_ref: str | None = None
    inputs: JobInputs | None = None  # fall-through: what its recording will be made of
    script: str = ""
    recorded: bool = False
    cancel_requested_at: datetime | None = None
    # Test control: a cancellation asked for is not confirmed until released.
    hold_cancel: bool = False
    storage_deleted: bool = False
    # A replayed job whose recorded outputs its caps refused: its artifact keeps nothing.
    outputs_refused: bool = False
    # An agent job's caps on its outputs (None: an evaluation, or storage not counted): a
    # replayed one is judged by them as it ends, in its views, as a local job is.
    caps: KeepOutputs | None = None


@dataclass
class _Admission:
    """A start's job: one started under its key already (`existing`), or a new one with its
    inputs and the recording that replays it (None: none, and `refusal` says why when the
    store holds one that cannot)."""

    job: _Job
    existing: bool = False
    inputs: JobInputs | None = None
    recording: Recording | None = None
    refusal: str | None = None


class ReplayBackend:
    """Implements activities.backends.interface.JobsBackend from a `ReplayStore`."""

    name = "replay"

    def __init__(
        self,
        state_dir: Path,
        store: ReplayStore,
        inner: JobsBackend,
        *,
        time_scale: float = 1.0,
        fall_through: bool = False,
        inner_look_s: float = 0.0,
    ) -> None:
        """`inner_look_s`: a job that fell through is looked at on the underlying backend at
        most this often (workflow time; its last view is answered in between), as that backend
        allows: the watcher looks every second for the replayed jobs, and Hugging Face allows
        one status call per job per 30 s (DESIGN §3)."""
        if not time_scale >= 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.store = store
        self.inner = inner
        self.time_scale = time_scale
        self.fall_through = fall_through
        self.inner_look_s = inner_look_s
        # inner ref -> when it was last looked at there, and what was seen (this process's).
        self._inner_seen: dict[str, tuple[datetime, BackendJob]] = {}
        self.prices_simulated = inner.prices_simulated
        self.uses_local_models = inner.uses_local_models
        self.job_python_version = inner.job_python_version
        self.default_artifact_cap_bytes = inner.default_artifact_cap_bytes
        self.default_storage_cap_bytes = inner.default_storage_cap_bytes
        self._jobs = state_dir / "jobs"
        self._jobs.mkdir(parents=True, exist_ok=True)
        self._storage = ReplayStorage(self)

    # -- JobsBackend: jobs ---------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> BackendJob:
        admitted = await self._admit(request)
        job = admitted.job
        if admitted.existing:  # a second start of the same key: the same job
            return await self._view(job, request.now)
        if admitted.recording is None:
            inputs = admitted.inputs
            assert inputs is not None  # a new job
            if not self.fall_through:
                raise await self._not_recorded(inputs, request, admitted.refusal)
            job.inner_ref = await self._start_inner(request, inputs)
            job.inputs = inputs
            job.script = request.script if request.role is JobRole.agent else ""
        self._save(job)
        return await self._view(job, request.now)

    async def start_known(self, request: JobRequest) -> KnownRun | None:
        """A job with a recording, replayed: its whole run, known now (`KnownOutcomes`). None
        when it has none and would fall through (nothing is started: `submit` starts it).
        Raises ToolError(not_recorded) when it has none and nothing falls through."""
        admitted = await self._admit(request)
        job = admitted.job
        if admitted.existing:  # a retried start: the same job
            return None if job.inner_ref is not None else self._run(job)
        if admitted.recording is None:
            assert admitted.inputs is not None  # a new job
            if not self.fall_through:
                raise await self._not_recorded(admitted.inputs, request, admitted.refusal)
            return None
        self._save(job)
        return self._run(job, admitted.recording)

    async def _admit(self, request: JobRequest) -> _Admission:
        """The job this request names: the one started under its key already, or a new one
        with its recording (None: none that replays it, and why not when one exists)."""
        if request.role is JobRole.agent:
            # As every backend: the launcher is built, so its checks refuse what they refuse.
            await asyncio.to_thread(
                build_launcher,
                request.script,
                request.dependencies,
                python=self.job_python_version,
            )
        ref = job_ref(request.key)
        existing = self._load(ref)
        if existing is not None:
            return _Admission(existing, existing=True)
        inputs = self._inputs(request)
        recording_key = inputs.key()
        recording = self.store.get(recording_key)
        refusal = None if recording is None else _cannot_replay(recording, request.timeout_s)
        job = _Job(
            ref=ref,
            key=request.key,
            job_id=request.job_id,
            role=request.role,
            created_at=request.now,
            timeout_s=request.timeout_s,
            nonce=request.env.get(NONCE_ENV, ""),
            recording_key=recording_key,
            caps=_caps_of(request),
        )
        replays = recording is not None and refusal is None
        return _Admission(
            job, inputs=inputs, recording=recording if replays else None, refusal=refusal
        )

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        job = self._load(job_ref(key))
        return None if job is None else await self._view(job, now)

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        jobs = [job for job in map(self._load, refs) if job is not None]
        inner_refs = [job.inner_ref for job in jobs if job.inner_ref]
        inner = self._seen_lately(inner_refs, now)
        if len(inner) < len(inner_refs):
            # Some are due a look there: all are looked at (one listing serves them all on
            # Hugging Face), so that they fall due together again rather than one a second.
            inner = await self.inner.observe(inner_refs, now)
            for inner_ref, view in inner.items():
                if view.state.terminal:  # an ended job is not looked at again
                    self._inner_seen.pop(inner_ref, None)
                else:
                    self._inner_seen[inner_ref] = (now, view)
        seen: dict[str, BackendJob] = {}
        for job in jobs:
            if job.inner_ref is None:
                seen[job.ref] = self._replayed_view(job, now)
            elif job.inner_ref in inner:
                seen[job.ref] = await self._inner_view(job, inner[job.inner_ref], now)
        return seen

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        if self._path(ref) is None and self._inner_orphans() is not None:
            # One of `live_jobs`' refs (the orphan reaper's): a job of the underlying backend.
            return await self.inner.cancel(ref, now)
        job = self._job(ref)
        if job.inner_ref is not None:
            self._inner_seen.pop(job.inner_ref, None)  # look at it again on the next look
            return await self._inner_view(job, await self.inner.cancel(job.inner_ref, now), now)
        if job.cancel_requested_at is None and not self._replayed_view(job, now).state.terminal:
            job.cancel_requested_at = now
            self._save(job)
        return self._replayed_view(job, now)

    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """A job that ran: its backend's measure. A replayed one: its recorded artifact's size
        (what its recorded run kept), judged by this job's caps, as that backend would."""
        ours = self._job(job.ref)
        if ours.inner_ref is not None:
            inner = await self.inner.keep_outputs(job.model_copy(update={"ref": ours.inner_ref}))
            return await self._inner_view(ours, inner, job.now)
        if ours.caps is None:
            ours.caps = job
            self._save(ours)
        return self._replayed_view(ours, job.now)

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        job = self._job(ref)
        if job.inner_ref is not None:
            return await self.inner.logs(job.inner_ref, tail, now)
        view = self._replayed_view(job, now)
        recording = self._recording(job)
        lines = [f"replayed job {job.job_id} ({job.role.value}): recording {job.recording_key}"]
        if view.state is not JobState.queued:
            printed = replayed_lines(recording, job.nonce)
            if not view.state.terminal:  # running: as much of the log as its time has come to
                share = min(1.0, view.running_s / recording.running_s) if recording.running_s else 1
                printed = printed[: int(len(printed) * share)]
            lines += printed
        return lines[-tail:] if tail > 0 else []

    # -- OrphanSource: the jobs that fell through, as the underlying backend lists them ------

    async def live_jobs(self) -> list[LiveJob]:
        """This deployment's live jobs on the underlying backend (every job that fell through;
        replayed jobs run nowhere), by the underlying backend's refs, which `cancel` takes.
        Only where that backend lists its jobs (`Capabilities.reaps_orphans`: over `hf`)."""
        orphans = self._inner_orphans()
        return [] if orphans is None else await orphans.live_jobs()

    def _inner_orphans(self) -> OrphanSource | None:
        return cast(OrphanSource, self.inner) if hasattr(self.inner, "live_jobs") else None

    def _seen_lately(self, inner_refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        """The views of these jobs seen on the underlying backend less than `inner_look_s` ago
        (the others are due a look there)."""
        fresh: dict[str, BackendJob] = {}
        for inner_ref in inner_refs:
            seen = self._inner_seen.get(inner_ref)
            if seen is not None and (now - seen[0]).total_seconds() < self.inner_look_s:
                fresh[inner_ref] = seen[1]
        return fresh

    # -- JobsBackend: what is not a job (the underlying backend's) -----------------------------

    async def hardware(self) -> list[FlavorPrice]:
        return await self.inner.hardware()

    def job_limits(self) -> JobLimits | None:
        return self.inner.job_limits()

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        return await self.inner.resolve_model(repo_id, revision)

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        return await self.inner.resolve_dataset(repo_id, denylist)

    def storage(self) -> JobStorage:
        return self._storage

    async def read_dataset(self, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
        return await self.inner.read_dataset(repo_id, revision, max_bytes)

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        """A job that fell through: what it wrote, from the underlying backend. A replayed job
        wrote nothing anywhere, and a recording keeps its run's artifact size, not its files:
        refused, so that the contamination check reports these outputs as not read."""
        job = self._job(ref)
        if job.inner_ref is not None:
            return await self.inner.read_outputs(job.inner_ref, max_bytes)
        raise ToolError(
            ErrorType.not_recorded,
            f"job {job.job_id} was replayed from recording {job.recording_key}, which keeps "
            "no output files: its outputs cannot be read",
        )

    # -- test controls -------------------------------------------------------------------------

    def hold_cancellation(self, ref: str) -> None:
        """The replayed job's cancellation, once asked for, is not confirmed until released."""
        job = self._job(ref)
        job.hold_cancel = True
        self._save(job)

    def release_cancellation(self, ref: str) -> None:
        job = self._job(ref)
        job.hold_cancel = False
        self._save(job)

    # -- internals -----------------------------------------------------------------------------

    def _inputs(self, request: JobRequest) -> JobInputs:
        evaluated = None
        if request.role is not JobRole.agent:
            target = self._load(request.artifact_ref or "")
            if target is None:
                raise ToolError(
                    ErrorType.not_allowed,
                    "the replay backend knows no job whose outputs this evaluation would read",
                )
            evaluated = target.recording_key
        return JobInputs(
            role=request.role,
            task_id=request.task_id,
            script_sha256=sha256_text(request.script),
            dependencies=list(request.dependencies),
            flavor=request.flavor,
            datasets=list(request.datasets),
            base_model=request.base_model,
            task_params=request.env.get(TASK_PARAMS_ENV, "") if evaluated else "",
            evaluated=evaluated,
        )

    async def _not_recorded(
        self, inputs: JobInputs, request: JobRequest, why: str | None
    ) -> ToolError:
        # Reads and compares up to MAX_SCANNED recordings (about a second per thousand on a busy
        # machine): off the event loop.
        near = await asyncio.to_thread(self.store.nearest, inputs, request.script, NEAREST_KEYS)
        what = "script and inputs" if request.role is JobRole.agent else "evaluation"
        message = why or (
            f"the replay backend has no recorded outcome for this {what} (key {inputs.key()}) "
            "and runs nothing itself"
        )
        if near:
            message += f"; nearest recorded: {near[0].key[:12]}… (differs in " + (
                ", ".join(near[0].differs) + ")"
            )
        return ToolError(
            ErrorType.not_recorded,
            message,
            key=inputs.key(),
            nearest=[n.model_dump() for n in near],
        )

    async def _start_inner(self, request: JobRequest, inputs: JobInputs) -> str:
        inner_request = request
        if request.role is not JobRole.agent:
            target = self._load(request.artifact_ref or "")
            if target is None or target.inner_ref is None:
                raise await self._not_recorded(
                    inputs,
                    request,
                    f"this evaluation has no recording (key {inputs.key()}), and the job it "
                    "evaluates was replayed: it never ran, so there are no outputs to evaluate "
                    "for real",
                )
            inner_request = request.model_copy(update={"artifact_ref": target.inner_ref})
        found = await self.inner.find_by_key(request.key, request.now)
        started = found or await self.inner.submit(inner_request)
        return started.ref

    async def _view(self, job: _Job, now: datetime) -> BackendJob:
        if job.inner_ref is None:
            return self._replayed_view(job, now)
        seen = await self.inner.observe([job.inner_ref], now)
        if job.inner_ref not in seen:
            return BackendJob(ref=job.ref, key=job.key, state=JobState.queued, created_at=now)
        return await self._inner_view(job, seen[job.inner_ref], now)

    async def _inner_view(self, job: _Job, inner: BackendJob, now: datetime) -> BackendJob:
        """A job that really runs, as ours; recorded the first time it is seen ended."""
        if inner.state.terminal and not job.recorded:
            await self._record(job, inner, now)
        return inner.model_copy(update={"ref": job.ref, "key": job.key, "replayed": False})

    async def _record(self, job: _Job, inner: BackendJob, now: datetime) -> None:
        job.recorded = True
        if inner.state in (JobState.succeeded, JobState.failed, JobState.timed_out):
            if not inner.vanished and job.inputs is not None and job.inner_ref is not None:
                lines = await self.inner.logs(job.inner_ref, MAX_LOG_TAIL, now)
                kept, trusted = bounded_log(lines, job.nonce)
                started = inner.started_at or inner.finished_at or inner.created_at
                artifact = None
                if job.role is JobRole.agent:
                    artifact = await self.inner.storage().artifact_bytes(job.inner_ref)
                await asyncio.to_thread(
                    self.store.put,
                    Recording(
                        key=job.recording_key,
                        inputs=job.inputs,
                        script=job.script,
                        state=inner.state.value,  # type: ignore[arg-type]
                        queue_s=max(0.0, (started - inner.created_at).total_seconds()),
                        running_s=inner.running_s,
                        timeout_s=job.timeout_s,
                        message=inner.message,
                        lines=kept,
                        trusted=trusted,
                        artifact_bytes=artifact,
                        source=f"fall-through:{self.inner.name}",
                        recorded_at=now,
                    ),
                )
        self._save(job)

    def _recording(self, job: _Job) -> Recording:
        recording = self.store.get(job.recording_key)
        if recording is None:  # removed from the store while the job was replayed
            raise ToolError(
                ErrorType.hf_error,
                f"the recording {job.recording_key} this job replays is gone from the store",
            )
        return recording

    def _replayed_view(self, job: _Job, now: datetime) -> BackendJob:
        """The replayed job at workflow time `now`, from its recording and the time scale. Its
        running time is the recorded one (what it is charged); its times are scaled."""
        return self._run(job).view(now, job.cancel_requested_at, hold_cancel=job.hold_cancel)

    def _run(self, job: _Job, recording: Recording | None = None) -> KnownRun:
        """The replayed job's whole run, as its recording and its request's timeout make it
        (a recorded run longer than the timeout ends `timed_out` at the timeout)."""
        recording = recording or self._recording(job)
        ran_s, outcome = recording.running_s, JobState(recording.state)
        if ran_s > job.timeout_s:  # the request's timeout is shorter than the recorded run
            ran_s, outcome = float(job.timeout_s), JobState.timed_out
        stored, refused = self._judged(job, recording.artifact_bytes or 0)
        return KnownRun(
            ref=job.ref,
            key=job.key,
            created_at=job.created_at,
            queue_s=recording.queue_s,
            ran_s=ran_s,
            outcome=outcome,
            time_scale=self.time_scale,
            message=recording.message,
            stored_bytes=stored,
            outputs_refused=refused,
        )

    def _judged(self, job: _Job, size: int) -> tuple[int | None, OutputsRefusal | None]:
        """A replayed agent job's recorded outputs judged by its caps: what its artifact keeps,
        or why they are refused (the verdict kept, so that its storage answers alike). None
        and None: its storage is not counted (an evaluation, or no caps)."""
        if job.caps is None:
            return None, None
        refused = job.caps.over(size)
        if refused is not None and not job.outputs_refused:
            job.outputs_refused = True
            self._save(job)
        return (0, refused) if refused is not None else (size, None)

    def _job(self, ref: str) -> _Job:
        job = self._load(ref)
        if job is None:
            raise ToolError(ErrorType.hf_error, f"the replay backend knows no job {ref!r}")
        return job

    def _path(self, ref: str) -> Path | None:
        if not ref.startswith(REF_PREFIX) or not ref[len(REF_PREFIX) :].isalnum():
            return None
        return self._jobs / f"{ref}.json"

    def _load(self, ref: str) -> _Job | None:
        path = self._path(ref)
        if path is None:
            return None
        try:
            return _Job.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValidationError as err:
            raise ToolError(ErrorType.hf_error, f"replay job {ref}: unreadable state") from err

    def _save(self, job: _Job) -> None:
        path = self._path(job.ref)
        assert path is not None
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(job.model_dump_json())
        os.replace(tmp, path)


def _caps_of(request: JobRequest) -> KeepOutputs | None:
    allowance = request.storage_allowance_bytes
    if request.role is not JobRole.agent or allowance is None:
        return None
    return KeepOutputs(
        ref="",
        key=request.key,
        now=request.now,
        artifact_cap_bytes=request.artifact_cap_bytes or allowance,
        storage_allowance_bytes=allowance,
        storage_cap_bytes=request.storage_cap_bytes,
    )


def job_ref(key: str) -> str:
    return REF_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def _cannot_replay(recording: Recording, timeout_s: int) -> str | None:
    """Why this recording does not tell what a run under `timeout_s` would do (None: it does)."""
    if recording.state == "timed_out" and timeout_s > recording.timeout_s:
        return (
            f"the recorded run (key {recording.key}) timed out at its {recording.timeout_s} s; "
            f"what it does within this job's {timeout_s} s was never recorded"
        )
    return None


class ReplayStorage:
    """Replayed jobs keep no folder: their artifact is the recorded run's size until deleted.
    Jobs that fell through are the underlying backend's storage's."""

    def __init__(self, backend: ReplayBackend) -> None:
        self.name = backend.name
        self._backend = backend

    async def artifact_bytes(self, ref: str) -> int | None:
        job = self._backend._load(ref)
        if job is None:
            return None
        if job.inner_ref is not None:
            return await self._backend.inner.storage().artifact_bytes(job.inner_ref)
        recording = self._backend.store.get(job.recording_key)
        if job.storage_deleted or recording is None:
            return None
        return 0 if job.outputs_refused else recording.artifact_bytes

    async def held_bytes(self) -> dict[str, int] | None:
        return None  # its folders are not on this host's disk

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        job = self._backend._load(ref)
        if job is None:
            return 0
        if job.inner_ref is not None:
            return await self._backend.inner.storage().delete(
                job.inner_ref, keep_artifact=keep_artifact
            )
        if not keep_artifact and not job.storage_deleted:
            job.storage_deleted = True
            self._backend._save(job)
        return 0  # nothing of a replayed job is on any disk
