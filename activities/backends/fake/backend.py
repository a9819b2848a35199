"""A scriptable, file-backed stand-in for Hugging Face Jobs (development and tests).

State lives in one JSON file under the state dir, guarded by an advisory lock, so the fake
survives a worker or server restart and out-of-process tests can share it. A job's progress is
computed from the workflow time passed in each call (`now`), never from the wall clock, so
workflow tests with time skipping see jobs queue, run and finish (DESIGN §9).

What each job does comes from a `FakeScenario`: the first rule that matches the job's role and
script wins. The wiring passes the scenario in (for a server or worker, read from the file
`POSTTRAIN_FAKE_SCENARIO` names); the backend reads no environment.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from activities.backends.interface import DatasetBytes, JobRequest, TransientBackendError
from activities.backends.storage import NoStorage
from activities.contamination.dataset_bytes import outputs_order, read_until
from job_launcher.builder import build_launcher
from job_launcher.trusted_lines import LAUNCHER_TAG, NONCE_ENV, SCORE_TAG, format_trusted_line
from posttrain_common.contracts.episodes import JobLimits
from posttrain_common.contracts.jobs import BackendJob, JobRole, KeepOutputs, OutputsRefusal
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import HF_ARTIFACT_CAP_BYTES, HF_EPISODE_STORAGE_BYTES
from posttrain_env.models import FlavorPrice, JobState

EvalOutput = Literal["valid", "none", "several", "garbage", "out_of_range", "no_nonce"]

DEFAULT_PRICES = [
    FlavorPrice(name="cpu-basic", micro_usd_per_minute=167),
    FlavorPrice(name="cpu-upgrade", micro_usd_per_minute=500),
    FlavorPrice(name="t4-small", micro_usd_per_minute=6_667, accelerators=1, accelerator="T4"),
    FlavorPrice(name="l4x1", micro_usd_per_minute=13_333, accelerators=1, accelerator="L4"),
    FlavorPrice(name="a10g-small", micro_usd_per_minute=16_667, accelerators=1, accelerator="A10G"),
]


class FakeJobScript(BaseModel):
    """What one job does. Durations are seconds of workflow time."""

    role: JobRole | None = None  # match: None matches any role
    script_contains: str | None = None  # match: a marker in the job's script
    # match (evaluations): a marker in the script of the agent job whose outputs it evaluates
    evaluated_script_contains: str | None = None
    queue_s: float = 5.0
    run_s: float = 60.0
    outcome: Literal["succeeded", "failed"] = "succeeded"
    # A job that reaches its timeout keeps running (and billing) this long before it stops,
    # as Hugging Face's stop lag can make it: the settlement then exceeds the reservation.
    stop_lag_s: float = 0.0
    # Seconds from the cancel request to a confirmed `cancelled`; None: never confirmed.
    cancel_confirm_after_s: float | None = 0.0
    # Operation name ("submit", "observe", "cancel", "logs") -> calls that fail with a 503 first.
    transient_errors: dict[str, int] = Field(default_factory=dict)
    # The first submit creates the job and then fails as if the connection dropped.
    fail_after_create: bool = False
    # The first submit creates the job and then hangs this many seconds (real time) before it
    # answers, as a create call whose answer is slow to come: a worker killed meanwhile leaves
    # its activity unanswered, and the retry must find the job.
    submit_hang_s: float = 0.0
    logs: list[str] = Field(default_factory=list)
    # Payloads of the launcher's trusted lines, printed with the job's own nonce once the job
    # ended (e.g. {"stage": "install", "error": "..."} for a job whose install failed).
    launcher_lines: list[dict[str, Any]] = Field(default_factory=list)
    # The backend's message once the job ended (as Hugging Face may quote a job's own output);
    # None: "fake job <state>".
    message: str | None = None
    eval_output: EvalOutput = "valid"
    # What an agent job leaves under /data/outputs/: path -> text (the contamination check
    # reads it).
    outputs: dict[str, str] = Field(default_factory=dict)
    # The apparent bytes those outputs take (None: the size of `outputs`' texts), as the job's
    # bucket folder would hold them when `keep_outputs` measures it.
    outputs_bytes: int | None = None
    # True: the outputs are measured as the job ends (its ended views carry them, as local
    # jobs' do); False: only when `keep_outputs` is asked, as on Hugging Face.
    outputs_measured_at_end: bool = True
    score: float = 0.5
    # More keys of the evaluator's score line (its details).
    eval_details: dict[str, Any] = Field(default_factory=dict)


class FakeDataset(BaseModel):
    revision: str = "0" * 40
    private: bool = False
    gated: bool = False
    # What a job mounting it reads: path in the repo -> text (the contamination check reads it).
    files: dict[str, str] = Field(default_factory=dict)


class FakeScenario(BaseModel):
    jobs: list[FakeJobScript] = Field(default_factory=list)
    prices: list[FlavorPrice] = Field(default_factory=lambda: list(DEFAULT_PRICES))
    datasets: dict[str, FakeDataset] = Field(default_factory=dict)

    def rule_for(self, role: JobRole, script: str, evaluated_script: str = "") -> FakeJobScript:
        for rule in self.jobs:
            if rule.role not in (None, role):
                continue
            if rule.script_contains is not None and rule.script_contains not in script:
                continue
            marker = rule.evaluated_script_contains
            if marker is not None and marker not in evaluated_script:
                continue
            return rule
        return FakeJobScript()


class _Kept(BaseModel):
    """What `keep_outputs` decided of an ended agent job's outputs."""

    stored_bytes: int
    refused: OutputsRefusal | None = None


class _FakeJob(BaseModel):
    ref: str
    request: JobRequest
    rule: FakeJobScript
    created_at: datetime
    cancel_requested_at: datetime | None = None
    kept: _Kept | None = None


class _FakeState(BaseModel):
    jobs: dict[str, _FakeJob] = Field(default_factory=dict)
    # "<key>:<operation>" -> failures already served, for transient errors and fail-after-create.
    failures_served: dict[str, int] = Field(default_factory=dict)


class FakeBackend:
    """Implements activities.backends.interface.JobsBackend in a file under `state_dir`."""

    name = "fake"
    prices_simulated = True
    uses_local_models = False
    # It stands in for Hugging Face: its caps.
    default_artifact_cap_bytes = HF_ARTIFACT_CAP_BYTES
    default_storage_cap_bytes = HF_EPISODE_STORAGE_BYTES

    def __init__(
        self, state_dir: Path, scenario: FakeScenario | None = None, *, job_python: str = "3.12"
    ) -> None:
        """`job_python`: the Python version its jobs declare (default: Hugging Face's default
        image's), whose grammar agent scripts are checked with."""
        self.job_python_version = job_python
        state_dir.mkdir(parents=True, exist_ok=True)
        self._path = state_dir / "fake_backend.json"
        self._lock_path = state_dir / "fake_backend.lock"
        self.scenario = scenario if scenario is not None else FakeScenario()

    # -- JobsBackend ---------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> BackendJob:
        if request.role is JobRole.agent:
            # As every backend: the launcher is built, so its checks refuse what they refuse
            # (the script's syntax for the job's Python, its dependencies). Nothing runs it.
            await asyncio.to_thread(
                build_launcher,
                request.script,
                request.dependencies,
                python=self.job_python_version,
            )
        with self._state() as state:
            evaluated = state.jobs.get(request.artifact_ref or "")
            rule = self.scenario.rule_for(
                request.role, request.script, evaluated.request.script if evaluated else ""
            )
            self._maybe_fail(state, rule, request.key, "submit")
            ref = "fake-" + hashlib.sha256(request.key.encode()).hexdigest()[:24]
            if ref in state.jobs:  # a second start of the same key: a broker bug, not a retry
                ref = f"{ref}-{len(state.jobs)}"
            job = _FakeJob(ref=ref, request=request, rule=rule, created_at=request.now)
            state.jobs[ref] = job
            if rule.fail_after_create and self._serve_once(state, request.key, "after_create"):
                raise TransientBackendError("connection dropped after the job was created")
            hang = rule.submit_hang_s > 0 and self._serve_once(state, request.key, "hang")
        if hang:  # outside the state's lock: other calls go on meanwhile
            await asyncio.sleep(rule.submit_hang_s)
        return _view(job, request.now)

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        with self._state() as state:
            for job in state.jobs.values():
                if job.request.key == key:
                    return _view(job, now)
        return None

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        with self._state() as state:
            for ref in refs:
                if ref in state.jobs:
                    self._maybe_fail(
                        state, state.jobs[ref].rule, state.jobs[ref].request.key, "observe"
                    )
            return {ref: _view(state.jobs[ref], now) for ref in refs if ref in state.jobs}

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        with self._state() as state:
            job = self._job(state, ref)
            self._maybe_fail(state, job.rule, job.request.key, "cancel")
            if job.cancel_requested_at is None and not _view(job, now).state.terminal:
                job.cancel_requested_at = now
            return _view(job, now)

    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """As Hugging Face's: the outputs measured once the job ended, kept within the caps
        or deleted whole (a failed job's too)."""
        with self._state() as state:
            fake = self._job(state, job.ref)
            self._maybe_fail(state, fake.rule, fake.request.key, "keep_outputs")
            if not _view(fake, job.now).state.terminal:
                raise TransientBackendError(f"job {job.ref} has not ended; its outputs may grow")
            if fake.kept is None:
                fake.kept = _measure(fake, job)
            return _view(fake, job.now)

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        with self._state() as state:
            job = self._job(state, ref)
            self._maybe_fail(state, job.rule, job.request.key, "logs")
            view = _view(job, now)
            lines = [f"fake job {job.request.job_id} ({job.request.role.value}) started"]
            if view.state is not JobState.queued:
                lines += job.rule.logs
            if view.state.terminal:
                nonce = job.request.env.get(NONCE_ENV, "")
                lines += [
                    format_trusted_line(LAUNCHER_TAG, nonce, p) for p in job.rule.launcher_lines
                ]
            if view.state.terminal and job.request.role is not JobRole.agent:
                lines += _evaluator_output(job)
            return lines[-tail:] if tail > 0 else []

    async def hardware(self) -> list[FlavorPrice]:
        return list(self.scenario.prices)

    def job_limits(self) -> JobLimits | None:
        return None  # not reported (the local backend reports its own)

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
            return revision
        return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        if repo_id in denylist:
            raise ToolError(
                ErrorType.dataset_not_allowed,
                f"dataset {repo_id!r} is on this task's denylist",
                dataset=repo_id,
            )
        dataset = self.scenario.datasets.get(repo_id)
        if dataset is None:
            raise ToolError(
                ErrorType.dataset_not_allowed,
                f"dataset {repo_id!r} does not exist",
                dataset=repo_id,
            )
        if dataset.private or dataset.gated:
            why = "private" if dataset.private else "gated"
            raise ToolError(
                ErrorType.dataset_not_allowed,
                f"dataset {repo_id!r} is {why}; only public, ungated datasets are allowed",
                dataset=repo_id,
            )
        return dataset.revision

    def storage(self) -> NoStorage:
        return NoStorage(self.name)  # the fake keeps no job folders

    async def read_dataset(self, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
        dataset = self.scenario.datasets.get(repo_id)
        if dataset is None or dataset.revision != revision:
            raise ToolError(ErrorType.not_allowed, f"no dataset {repo_id}@{revision}")
        files = sorted((path, text.encode()) for path, text in dataset.files.items())
        return read_until(((path, lambda n, b=data: b[:n]) for path, data in files), max_bytes)

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        with self._state() as state:
            job = state.jobs.get(ref)
            if job is None:
                raise ToolError(ErrorType.not_allowed, f"no job {ref}")
            kept = job.rule.outputs if job.kept is None or job.kept.refused is None else {}
            files = sorted((path, text.encode()) for path, text in kept.items())
        readers = [(path, lambda n, b=data: b[:n]) for path, data in files]
        return read_until(outputs_order(readers), max_bytes)

    # -- test controls -------------------------------------------------------------------------

    def requests(self) -> list[JobRequest]:
        """Every job request received, in order (tests assert on what jobs were given)."""
        with self._state() as state:
            return [job.request for job in state.jobs.values()]

    def confirm_cancellations(self) -> None:
        """Every job whose cancellation was never to be confirmed confirms it at once (a stuck
        cancellation that comes unstuck)."""
        with self._state() as state:
            for job in state.jobs.values():
                if job.rule.cancel_confirm_after_s is None:
                    job.rule = job.rule.model_copy(update={"cancel_confirm_after_s": 0.0})

    def views(self, now: datetime) -> list[BackendJob]:
        """Every job as it stands at workflow time `now` (tests: nothing left live)."""
        with self._state() as state:
            return [_view(job, now) for job in state.jobs.values()]

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _state(self) -> Iterator[_FakeState]:
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = (
                    _FakeState.model_validate_json(self._path.read_text())
                    if self._path.exists()
                    else _FakeState()
                )
                try:
                    yield state
                finally:
                    # Written even when the operation raised: a job created before a simulated
                    # dropped connection exists, as it would on the real service.
                    tmp = self._path.with_suffix(".tmp")
                    tmp.write_text(state.model_dump_json())
                    os.replace(tmp, self._path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _job(state: _FakeState, ref: str) -> _FakeJob:
        if ref not in state.jobs:
            raise ToolError(ErrorType.hf_error, f"the jobs service knows no job {ref!r}")
        return state.jobs[ref]

    def _maybe_fail(self, state: _FakeState, rule: FakeJobScript, key: str, op: str) -> None:
        if state.failures_served.get(f"{key}:{op}", 0) < rule.transient_errors.get(op, 0):
            state.failures_served[f"{key}:{op}"] = state.failures_served.get(f"{key}:{op}", 0) + 1
            raise TransientBackendError(f"503 Service Unavailable ({op})")

    @staticmethod
    def _serve_once(state: _FakeState, key: str, op: str) -> bool:
        served = state.failures_served.get(f"{key}:{op}", 0)
        state.failures_served[f"{key}:{op}"] = served + 1
        return served == 0


def _measure(job: _FakeJob, caps: KeepOutputs) -> _Kept:
    rule = job.rule
    size = rule.outputs_bytes
    if size is None:
        size = sum(len(text.encode()) for text in rule.outputs.values())
    refused = caps.over(size)
    return _Kept(stored_bytes=0 if refused else size, refused=refused)


def _caps(job: _FakeJob, now: datetime) -> KeepOutputs | None:
    """The caps an agent job's request carries (None: an evaluation, or no storage counted)."""
    request = job.request
    allowance = request.storage_allowance_bytes
    if request.role is not JobRole.agent or allowance is None:
        return None
    return KeepOutputs(
        ref=job.ref,
        key=request.key,
        now=now,
        artifact_cap_bytes=request.artifact_cap_bytes or allowance,
        storage_allowance_bytes=allowance,
        storage_cap_bytes=request.storage_cap_bytes,
    )


def _view(job: _FakeJob, now: datetime) -> BackendJob:
    """The job's state at workflow time `now`, from its rule and its history."""
    rule, created = job.rule, job.created_at
    start = created + timedelta(seconds=rule.queue_s)
    timeout_s = job.request.timeout_s
    ran_s = rule.run_s if rule.run_s <= timeout_s else timeout_s + rule.stop_lag_s
    natural_end = start + timedelta(seconds=ran_s)
    outcome = JobState(rule.outcome) if rule.run_s <= timeout_s else JobState.timed_out
    end, final = natural_end, outcome
    cancel_at = job.cancel_requested_at
    if cancel_at is not None and cancel_at < natural_end:
        if rule.cancel_confirm_after_s is None:
            end, final = datetime.max.replace(tzinfo=created.tzinfo), JobState.cancelled
        else:
            end = cancel_at + timedelta(seconds=rule.cancel_confirm_after_s)
            final = JobState.cancelled
            # Cancelled while queued: it never ran.
            if cancel_at <= start:
                start = end
    base = BackendJob(ref=job.ref, key=job.request.key, state=JobState.queued, created_at=created)
    if now < min(start, end):
        return base
    if now < end:
        return base.model_copy(
            update={
                "state": JobState.running,
                "started_at": start,
                "running_s": (now - start).total_seconds(),
            }
        )
    ran = max(0.0, (end - start).total_seconds())
    message = rule.message if rule.message is not None else f"fake job {final.value}"
    fields: dict[str, Any] = {}
    caps = _caps(job, now)
    if job.kept is None and rule.outputs_measured_at_end and caps is not None and ran > 0:
        job.kept = _measure(job, caps)  # kept with the state: the views that follow agree
    if job.kept is not None:
        fields = {"stored_bytes": job.kept.stored_bytes, "outputs_refused": job.kept.refused}
        if job.kept.refused is not None:
            message = job.kept.refused.message
            final = JobState.failed if final is JobState.succeeded else final
    return base.model_copy(
        update={
            "state": final,
            "started_at": start if ran > 0 else None,
            "finished_at": end,
            "running_s": ran,
            "message": message,
            **fields,
        }
    )


def _evaluator_output(job: _FakeJob) -> list[str]:
    nonce = job.request.env.get(NONCE_ENV, "")
    rule = job.rule
    payload = {"split": "fake", **rule.eval_details, "score": rule.score}
    score_line = format_trusted_line(SCORE_TAG, nonce, payload)
    match rule.eval_output:
        case "valid":
            return [score_line]
        case "none":
            return ["evaluation finished without a score"]
        case "several":
            return [score_line, score_line]
        case "garbage":
            return [f"{SCORE_TAG} {nonce} not-json"]
        case "out_of_range":
            return [format_trusted_line(SCORE_TAG, nonce, {"score": 1.5})]
        case "no_nonce":
            return [format_trusted_line(SCORE_TAG, "forged", {"score": rule.score})]
