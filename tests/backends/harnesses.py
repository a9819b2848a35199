"""One harness per registered backend: the backend, jobs that behave as a test asks, and the
faults the conformance suite injects (tests/backends/test_conformance.py).

- fake: the file-backed fake (activities/backends/fake), scripted by a `FakeScenario` whose rules
  match a marker in each job's script; its clock is the `now` every call carries.
- local: real jobs in bubblewrap on this machine (as tests/local/conftest.py builds them); the
  scripts really do what the behaviour says, in real time.
- replay: the replay backend over the fake, with fall-through: the suite's behaviours are
  recorded in its store (as a recorded run of them would be), so they are replayed; a script it
  has not recorded (the syntax cases) runs on the fake.
- hf: HfBackend on real `HfApi` objects over the HTTP-level fake Hub (tests/hf/http_hub.py), whose
  jobs follow `JobPlan`s on the Hub's own clock; an evaluation's score line is printed by a stand-in
  evaluator that reads what the evaluation really has mounted at /model.

What a backend genuinely cannot do is declared in `cannot` with the reason; the suite asserts the
declaration instead of skipping.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx2
import pytest
from huggingface_hub import set_client_factory
from huggingface_hub.utils._http import default_client_factory

from activities.backends.fake.backend import (
    FakeBackend,
    FakeDataset,
    FakeJobScript,
    FakeScenario,
)
from activities.backends.hf.backend import HfBackend
from activities.backends.hf.http import install_hub_client
from activities.backends.hf.labels import LABEL_JOB, LABEL_ROLE, HfRef, label_value
from activities.backends.interface import JobRequest, JobsBackend
from activities.backends.local import jobfiles as jf
from activities.backends.local.backend import LocalBackend
from activities.backends.local.store import job_ref
from activities.backends.replay.backend import ReplayBackend
from activities.backends.replay.recording import (
    NONCE_PLACEHOLDER,
    JobInputs,
    RecordedState,
    Recording,
    sha256_text,
)
from activities.backends.replay.store import ReplayStore
from activities.jobs.activities import HIDDEN_SEED_SECRET
from activities.jobs.launcher_report import read_launcher_lines
from job_launcher.builder import read_embedded
from job_launcher.trusted_lines import NONCE_ENV, SCORE_TAG, format_trusted_line
from posttrain_common.contracts.jobs import BackendJob, JobRole, RepoRef
from tests.hf.conftest import FAST_HTTP, http_backend
from tests.hf.fake_hub import FakeHub, FakeJob, JobPlan, model_json
from tests.hf.http_hub import FakeXet, HubHttp, Scopes
from tests.local.conftest import JOB_PYTHON, SMALL, TEST_BWRAP, write_model

Behaviour = Literal["succeeds", "fails", "runs_long", "writes_artifact", "evaluates"]
Fault = Literal["submit", "observe", "cancel", "logs"]

# What a job that succeeds prints, one line each (the suite reads them back with a tail).
LINES = [f"conformance line {i}" for i in range(1, 6)]
# The artifact an agent job writes: /data/outputs/model.bin, this many bytes of b"w".
ARTIFACT_FILE, ARTIFACT_BYTES = "model.bin", 3000
# Simulated backends: how long a job that succeeds runs (61 s: billed as 2 started minutes).
SIMULATED_RUN_S = 61.0
DATASET_ID = "conformance/public-data"
DATASET_FILES = {"README.md": b"# conformance\n", "data/train.jsonl": b'{"q": 1}\n' * 50}
MISSING_DATASET_ID = "conformance/no-such-data"
MODEL_ID = "conformance/base-model"

_MARK = "# conformance-behaviour: "
# What the local backend's jobs really run for each behaviour (the marker is for the simulated
# backends, whose jobs do what their scenario says for it).
_SCRIPTS: dict[Behaviour, str] = {
    "succeeds": "".join(f"print({line!r}, flush=True)\n" for line in LINES),
    "fails": "import sys\nprint('failing on purpose', flush=True)\nsys.exit(3)\n",
    "runs_long": "import time\nprint('running', flush=True)\ntime.sleep(600)\n",
    "writes_artifact": (
        f"open('/data/outputs/{ARTIFACT_FILE}', 'wb').write(b'w' * {ARTIFACT_BYTES})\n"
        "print('saved', flush=True)\n"
    ),
    # The evaluator: a score of 1.0 exactly when /model holds the artifact the agent wrote.
    "evaluates": (
        "import json, os\n"
        "try:\n"
        f"    data = open('/model/{ARTIFACT_FILE}', 'rb').read()\n"
        "except OSError:\n"
        "    data = b''\n"
        f"score = 1.0 if data == b'w' * {ARTIFACT_BYTES} else 0.0\n"
        f"print({SCORE_TAG!r}, os.environ[{NONCE_ENV!r}], json.dumps({{'score': score}}))\n"
    ),
}


def script_for(behaviour: Behaviour) -> str:
    return f"{_MARK}{behaviour}\n{_SCRIPTS[behaviour]}"


class Harness(ABC):
    """A backend under test, with controls. Times: `now()` is the backend's present (simulated
    backends move it in `advance`; the local backend's is the wall clock)."""

    name: str
    backend: JobsBackend
    model: RepoRef  # a base model pinned to a commit, in the backend's own hub
    dataset_revision: str  # DATASET_ID's commit
    # What this backend cannot do, by the suite's name for it, and why.
    cannot: ClassVar[dict[str, str]]
    # Faults it can inject (`inject`): the operations whose next call it can make fail
    # transiently.
    transient_faults: tuple[Fault, ...]
    # How long a job that succeeds runs, when the backend simulates it (None: really runs).
    succeeds_running_s: float | None = SIMULATED_RUN_S
    # Seconds of the backend's clock to wait for a job to end, and a job's poll step.
    end_within_s: float
    step_s: float

    @abstractmethod
    def now(self) -> datetime: ...

    @abstractmethod
    async def advance(self) -> None:
        """Let the backend's time pass by one step."""

    def request(
        self, behaviour: Behaviour, *, role: JobRole = JobRole.agent, **fields: Any
    ) -> JobRequest:
        secrets_ = {HIDDEN_SEED_SECRET: "conformance-seed"} if role is JobRole.grader else {}
        values: dict[str, Any] = {
            "role": role,
            "episode_id": "ep-conformance",
            "task_id": "t0_artifact",
            "job_id": "job-" + secrets.token_hex(6),
            "flavor": "cpu-basic",
            "timeout_s": 120,
            "script": script_for(behaviour),
            "base_model": self.model,
            "key": f"episode-conformance/job/{secrets.token_hex(6)}",
            "env": {NONCE_ENV: secrets.token_hex(16)},
            "secrets": secrets_,
            "now": self.now(),
        }
        values.update(fields)
        return JobRequest(**values)

    async def until(
        self, what: str, check: Callable[[], Awaitable[BackendJob | None]]
    ) -> BackendJob:
        """Advance the backend's time until `check` returns a job; fail after `end_within_s`
        of the backend's time (and 60 s of real time)."""
        start, wall = self.now(), time.monotonic()
        while True:
            found = await check()
            if found is not None:
                return found
            late = (self.now() - start).total_seconds() > self.end_within_s
            if late or time.monotonic() - wall > 60:
                raise AssertionError(f"{self.name}: {what} did not happen in time")
            await self.advance()

    async def view(self, ref: str) -> BackendJob:
        return (await self.backend.observe([ref], self.now()))[ref]

    async def wait_end(self, ref: str) -> BackendJob:
        async def ended() -> BackendJob | None:
            job = await self.view(ref)
            return job if job.state.terminal else None

        return await self.until(f"the end of {ref}", ended)

    async def wait_running(self, ref: str) -> BackendJob:
        async def running() -> BackendJob | None:
            job = await self.view(ref)
            assert not job.state.terminal, (job, await self.logs(ref))
            return job if job.state.value == "running" else None

        return await self.until(f"{ref} running", running)

    async def logs(self, ref: str, tail: int = 1000) -> list[str]:
        return await self.backend.logs(ref, tail, self.now())

    @abstractmethod
    def unknown_ref(self) -> str:
        """A ref of this backend's own form that names no job."""

    @abstractmethod
    def inject(self, fault: Fault, ref: str | None) -> None:
        """The next call of `fault` (on the job `ref`; for a submit, the next job requested)
        fails as a transient error of this backend would."""

    @abstractmethod
    def declaring(self, python: str) -> JobsBackend:
        """Another backend of this kind whose jobs run Python `python`."""

    @abstractmethod
    async def stick_cancellations(self, ref: str) -> None:
        """The job's cancellation, once asked for, is not confirmed until released."""

    @abstractmethod
    async def release_cancellations(self, ref: str) -> None: ...

    def close(self) -> None:  # noqa: B027 (most harnesses leave nothing running)
        """Stop whatever the harness left running."""

    async def launched(self, ref: str, request: JobRequest) -> dict[str, Any] | None:
        """What shows that the job ran under the job launcher (DESIGN §6 item 4), as this
        backend lets it be seen; None where it runs no process (declared `cannot["launcher"]`)."""
        return None


# -- fake ------------------------------------------------------------------------------------------


class FakeHarness(Harness):
    name = "fake"
    cannot: ClassVar[dict[str, str]] = {
        "artifact_bytes": "the fake keeps no job folders: its storage is NoStorage, which measures "
        "nothing (None) and deletes nothing (0)",
        "unknown_model": "the fake resolves every model repo (a hash of its name and revision); "
        "its scenarios list datasets, not models",
        "real_evaluation": "the fake runs no process: an evaluation's score line is scripted "
        "(FakeJobScript.score), not computed from a mounted artifact",
        "launcher": "the fake runs no process, so no launcher either: a job's lines are "
        "scripted (FakeJobScript.logs)",
    }
    transient_faults = ("submit", "observe", "cancel", "logs")
    end_within_s = 3600.0
    step_s = 5.0

    def __init__(self, tmp_path: Path, job_python: str = "3.12") -> None:
        behaviours: list[FakeJobScript] = [
            FakeJobScript(
                script_contains=script_for("succeeds"),
                queue_s=2,
                run_s=SIMULATED_RUN_S,
                logs=LINES,
            ),
            FakeJobScript(script_contains=_MARK + "fails", queue_s=2, run_s=5, outcome="failed"),
            FakeJobScript(script_contains=_MARK + "runs_long", queue_s=2, run_s=3600),
            FakeJobScript(
                script_contains=_MARK + "writes_artifact",
                queue_s=2,
                run_s=10,
                outputs={ARTIFACT_FILE: "w" * ARTIFACT_BYTES},
            ),
            FakeJobScript(script_contains=_MARK + "evaluates", queue_s=2, run_s=10, score=1.0),
        ]
        self._scenario = FakeScenario(
            jobs=behaviours,
            datasets={
                DATASET_ID: FakeDataset(
                    revision="d" * 40,
                    files={path: data.decode() for path, data in DATASET_FILES.items()},
                )
            },
        )
        self.fake = FakeBackend(tmp_path / "fake", self._scenario, job_python=job_python)
        self.backend = self.fake
        # What the fake resolves any model's `main` to.
        main = hashlib.sha1(f"{MODEL_ID}@main".encode()).hexdigest()
        self.model = RepoRef(repo_id=MODEL_ID, revision=main)
        self.dataset_revision = "d" * 40
        self._now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
        self._submit_fault = False
        self._tmp_path = tmp_path

    def now(self) -> datetime:
        return self._now

    async def advance(self) -> None:
        self._now += timedelta(seconds=self.step_s)

    def request(
        self, behaviour: Behaviour, *, role: JobRole = JobRole.agent, **fields: Any
    ) -> JobRequest:
        request = super().request(behaviour, role=role, **fields)
        if self._submit_fault:  # the fake's faults are its rules': this job's rule fails once
            self._submit_fault = False
            marker = f"# fails to start once: {request.key}\n"
            self.fake.scenario.jobs.insert(
                0,
                FakeJobScript(script_contains=marker, run_s=3600, transient_errors={"submit": 1}),
            )
            request = request.model_copy(update={"script": request.script + marker})
        return request

    def unknown_ref(self) -> str:
        return "fake-" + "0" * 24

    def inject(self, fault: Fault, ref: str | None) -> None:
        if fault == "submit":
            self._submit_fault = True
            return
        assert ref is not None
        with self.fake._state() as state:  # the job's own rule fails its next `fault` call
            job = state.jobs[ref]
            served = state.failures_served.get(f"{job.request.key}:{fault}", 0)
            job.rule.transient_errors[fault] = served + 1

    def declaring(self, python: str) -> JobsBackend:
        return FakeBackend(self._tmp_path / f"fake-{python}", self._scenario, job_python=python)

    async def stick_cancellations(self, ref: str) -> None:
        for rule in self.fake.scenario.jobs:
            rule.cancel_confirm_after_s = None
        # The job's rule was copied into its record when it was submitted: set it there too.
        with self.fake._state() as state:
            state.jobs[ref].rule.cancel_confirm_after_s = None

    async def release_cancellations(self, ref: str) -> None:
        self.fake.confirm_cancellations()


# -- local -----------------------------------------------------------------------------------------


class LocalHarness(Harness):
    name = "local"
    cannot: ClassVar[dict[str, str]] = {
        "transient": "the local backend has no remote service: its calls read and write files "
        "on this machine, which succeed or fail for good, so it never raises "
        "TransientBackendError",
        "declared_python": "the local backend's job Python is a real interpreter: its version is "
        "read from it (LocalBackend.job_python_version), never declared",
    }
    transient_faults = ()
    succeeds_running_s = None
    end_within_s = 90.0
    step_s = 0.05

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the local backend runs as root in these tests (CI does)")
        # A cancellation waits this long for the job's end before it answers (10 s in
        # production): an unconfirmed one answers "still running" sooner here.
        monkeypatch.setattr("activities.backends.local.store.CANCEL_WAIT_S", 1.0)
        self.local = LocalBackend(
            tmp_path / "state" / "local", job_python=JOB_PYTHON, limits=SMALL, bwrap=TEST_BWRAP
        )
        self.backend = self.local
        revision = self.local.hub.add_model(MODEL_ID, write_model(tmp_path / "model-src"))
        self.model = RepoRef(repo_id=MODEL_ID, revision=revision)
        data = tmp_path / "dataset-src"
        for path, content in DATASET_FILES.items():
            (data / path).parent.mkdir(parents=True, exist_ok=True)
            (data / path).write_bytes(content)
        self.dataset_revision = self.local.hub.add_dataset(DATASET_ID, data)
        self._stopped: list[int] = []

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def advance(self) -> None:
        await asyncio.sleep(self.step_s)  # real time: the jobs are real processes

    def unknown_ref(self) -> str:
        return job_ref("episode-conformance/job/never-submitted")

    def inject(self, fault: Fault, ref: str | None) -> None:
        raise AssertionError(self.cannot["transient"])

    def declaring(self, python: str) -> JobsBackend:
        raise AssertionError(self.cannot["declared_python"])

    def _supervisor(self, ref: str) -> int:
        ident = jf.read_json(self.local.jobs_dir / ref / jf.SUPERVISOR)
        assert ident is not None and jf.is_alive(ident), f"{ref} has no live supervisor"
        return int(ident["pid"])

    async def stick_cancellations(self, ref: str) -> None:
        # The job's supervisor, which records its end, stops: the cancel kills the sandbox,
        # and nothing confirms it until the supervisor goes on.
        pid = self._supervisor(ref)
        os.kill(pid, signal.SIGSTOP)
        self._stopped.append(pid)

    async def release_cancellations(self, ref: str) -> None:
        while self._stopped:
            os.kill(self._stopped.pop(), signal.SIGCONT)

    def close(self) -> None:
        for pid in self._stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    async def launched(self, ref: str, request: JobRequest) -> dict[str, Any] | None:
        # The launcher's own lines, with the job's nonce (the script cannot print them).
        report = read_launcher_lines(await self.logs(ref, 2000), request.env[NONCE_ENV])
        return {
            "exit_code": report.exit_code,
            "failed_stage": report.failed_stage,
            "loopback_tcp": report.loopback_tcp,
        }


# -- hf --------------------------------------------------------------------------------------------


class EvaluatingHub(HubHttp):
    """The HTTP fake Hub, whose evaluation jobs print what an evaluator reading their /model
    would: a score of 1.0 exactly when the mounted outputs hold the agent's artifact."""

    def _create(self, spec: dict[str, Any], namespace: str) -> FakeJob:
        job = super()._create(spec, namespace)
        if (spec.get("labels") or {}).get(LABEL_ROLE) in ("dev", "grader"):
            model = next(v for v in spec.get("volumes") or [] if v.get("mountPath") == "/model")
            assert model.get("readOnly") is True, model
            job.plan = JobPlan(scheduling_s=2, running_s=10, logs=_LazyScore(self, model))
        return job

    def _bucket_file(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        # A file a job wrote is listed by its size (JobPlan.outputs); its bytes are what the
        # suite's `writes_artifact` writes.
        bucket = f"{match['ns']}/{match['name']}"
        size = self.hub.buckets.get(bucket, {}).get(match["path"])
        if size is not None:
            self.files.setdefault(f"{bucket}/{match['path']}", b"w" * size)
        return super()._bucket_file(match, request, scopes)

    def _bucket_batch(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        # The HTTP fake stores added files only; deletions are carried out here.
        bucket = self.hub.buckets.get(f"{match['ns']}/{match['name']}", {})
        for line in request.content.decode().splitlines():
            operation = json.loads(line)
            if operation["type"] == "deleteFile":
                bucket.pop(operation["path"], None)
        return super()._bucket_batch(match, request, scopes)


class _LazyScore(list[str]):
    """An evaluator's log, read when the Hub serves it: the score of what /model holds then."""

    def __init__(self, http: HubHttp, model: dict[str, Any]) -> None:
        super().__init__()
        self._http, self._model = http, model

    def _lines(self) -> list[str]:
        files = self._http.hub.buckets.get(self._model["source"], {})
        size = files.get(f"{self._model['path']}/{ARTIFACT_FILE}")
        score = 1.0 if size == ARTIFACT_BYTES else 0.0
        return [format_trusted_line(SCORE_TAG, "{nonce}", {"score": score})]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._lines())

    def __len__(self) -> int:
        return len(self._lines())


class HfHarness(Harness):
    name = "hf"
    cannot: ClassVar[dict[str, str]] = {}
    transient_faults = ("submit", "observe", "cancel", "logs")
    end_within_s = 3600.0
    step_s = 5.0
    # The Hub route that each operation's first request goes to (a 503 there is transient).
    ROUTES: ClassVar[dict[Fault, str]] = {
        "submit": "create_job",
        "observe": "list_jobs",
        "cancel": "inspect_job",
        "logs": "job_logs",
    }

    def __init__(self, http: HubHttp, job_python: str = "3.12") -> None:
        self.http = http
        self.hub = http.hub
        self.model = RepoRef(repo_id=MODEL_ID, revision="b" * 40)
        self.hub.models[MODEL_ID] = model_json(MODEL_ID, self.model.revision)
        self.dataset_revision = "d" * 40
        http.add_dataset(DATASET_ID, self.dataset_revision, DATASET_FILES)
        self._plans: dict[str, JobPlan] = {}
        self.hub.plan_for = self._plan_for
        # Every observe reaches the Hub here (no listing shared between looks of one moment:
        # that saving is tested in tests/hf/test_listing_reuse.py), so a fault injected into
        # the listing is met by the next look.
        self.hf: HfBackend = http_backend(
            http, python=job_python, cancel_confirm_looks=2, listing_reuse_s=0.0
        )
        self.backend = self.hf

    def _plan_for(self, labels: dict[str, str]) -> JobPlan:
        return self._plans.get(labels.get(LABEL_JOB, ""), JobPlan())

    def request(
        self, behaviour: Behaviour, *, role: JobRole = JobRole.agent, **fields: Any
    ) -> JobRequest:
        request = super().request(behaviour, role=role, **fields)
        plans: dict[Behaviour, JobPlan] = {
            "succeeds": JobPlan(scheduling_s=2, running_s=SIMULATED_RUN_S, logs=list(LINES)),
            "fails": JobPlan(scheduling_s=2, running_s=5, outcome="ERROR", message="exit 3"),
            "runs_long": JobPlan(scheduling_s=2, running_s=3600),
            "writes_artifact": JobPlan(
                scheduling_s=2, running_s=10, outputs={ARTIFACT_FILE: ARTIFACT_BYTES}
            ),
        }
        if behaviour in plans:
            self._plans[label_value(request.job_id)] = plans[behaviour]
        return request

    def now(self) -> datetime:
        return self.hub.clock()

    async def advance(self) -> None:
        self.hub.advance(self.step_s)

    def unknown_ref(self) -> str:
        # A job id the Hub answers 404 for (once: not yet taken for vanished).
        return HfRef(job_id="0" * 24, namespace=self.hub.namespace).encode()

    def inject(self, fault: Fault, ref: str | None) -> None:
        self.http.answer(self.ROUTES[fault], 503)

    def declaring(self, python: str) -> JobsBackend:
        return http_backend(self.http, python=python)

    def close(self) -> None:
        set_client_factory(default_client_factory)  # the Hub client is process-wide

    def _job(self, ref: str) -> FakeJob:
        return next(job for job in self.hub.jobs.values() if job.id in ref)

    async def stick_cancellations(self, ref: str) -> None:
        self._job(ref).plan.cancel_after_s = None

    async def launched(self, ref: str, request: JobRequest) -> dict[str, Any] | None:
        # The one file the job was started with, as the Hub holds it in the job's /data folder.
        spec = self._job(ref).spec
        data = next(v for v in spec["volumes"] if v.get("mountPath") == "/data")
        command = " ".join(spec.get("command") or [])
        name = command.rsplit("/", 1)[-1]
        uploaded = self.http.files[f"{data['source']}/{data['path']}/{name}"].decode()
        config, script = read_embedded(uploaded)
        return {
            "script": script,
            "pass_env": config["pass_env"],
            "command": command,
            "loopback_tcp": config["loopback_tcp"],
        }

    async def release_cancellations(self, ref: str) -> None:
        self._job(ref).plan.cancel_after_s = 0.0


def hf_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HfHarness:
    """The HTTP fake Hub installed as tests/hf/conftest.py's `http_hub` fixture installs it
    (`close` restores the process's Hub client)."""
    http = EvaluatingHub(FakeHub())
    install_hub_client(FAST_HTTP, transport=http)
    monkeypatch.setattr("huggingface_hub.utils._xet.get_xet_session", lambda: FakeXet(http))
    return HfHarness(http)


# -- replay ----------------------------------------------------------------------------------------


class ReplayHarness(Harness):
    name = "replay"
    cannot: ClassVar[dict[str, str]] = {
        "transient": "a replayed job is answered from files on this machine (its recording and "
        "its state), which succeed or fail for good, so it never raises TransientBackendError; "
        "a job that falls through raises its underlying backend's",
        "unknown_model": "models are resolved by the underlying backend, here the fake, which "
        "resolves every model repo",
        "real_evaluation": "a replayed evaluation prints the recorded run's score line; nothing "
        "reads a mounted artifact",
        "read_outputs": "a replayed job wrote no files, and its recording keeps the artifact's "
        "size only: not_recorded (a job that fell through reads its underlying backend's)",
        "launcher": "a replayed job never ran: its lines are the recorded run's (that run's "
        "backend ran it under the launcher)",
    }
    transient_faults = ()
    end_within_s = 3600.0
    step_s = 5.0

    def __init__(self, tmp_path: Path, job_python: str = "3.12") -> None:
        self.inner = FakeHarness(tmp_path / "inner", job_python=job_python)
        self.model = self.inner.model
        self.dataset_revision = self.inner.dataset_revision
        self.store = ReplayStore(tmp_path / "store")
        self._tmp_path = tmp_path
        self._record_behaviours()
        self.replay = ReplayBackend(
            tmp_path / "replay", self.store, self.inner.fake, fall_through=True
        )
        self.backend = self.replay

    def _inputs(self, behaviour: Behaviour, role: JobRole, evaluated: str | None) -> JobInputs:
        return JobInputs(
            role=role,
            task_id="t0_artifact",
            script_sha256=sha256_text(script_for(behaviour)),
            flavor="cpu-basic",
            base_model=self.model,
            evaluated=evaluated,
        )

    def _record(
        self,
        inputs: JobInputs,
        state: RecordedState,
        running_s: float,
        *,
        script: str = "",
        lines: list[str] | None = None,
        trusted: list[int] | None = None,
        artifact_bytes: int | None = None,
    ) -> str:
        key = inputs.key()
        self.store.put(
            Recording(
                key=key,
                inputs=inputs,
                script=script,
                state=state,
                queue_s=2,
                running_s=running_s,
                timeout_s=7200,
                message="exit 3" if state == "failed" else "",
                lines=lines or [],
                trusted=trusted or [],
                artifact_bytes=artifact_bytes,
                source="conformance",
                recorded_at=datetime(2026, 3, 1, tzinfo=UTC),
            )
        )
        return key

    def _record_behaviours(self) -> None:
        """The suite's behaviours as a recorded run of each left them."""
        agent = JobRole.agent
        runs: dict[Behaviour, tuple[RecordedState, float, list[str]]] = {
            "succeeds": ("succeeded", SIMULATED_RUN_S, list(LINES)),
            "fails": ("failed", 5, ["failing on purpose"]),
            "runs_long": ("succeeded", 3600, ["running"]),
        }
        for behaviour, (state, running_s, lines) in runs.items():
            inputs = self._inputs(behaviour, agent, None)
            self._record(inputs, state, running_s, script=script_for(behaviour), lines=lines)
        artifact = self._record(
            self._inputs("writes_artifact", agent, None),
            "succeeded",
            10,
            script=script_for("writes_artifact"),
            lines=["saved"],
            artifact_bytes=ARTIFACT_BYTES,
        )
        score = format_trusted_line(SCORE_TAG, NONCE_PLACEHOLDER, {"score": 1.0})
        for role in (JobRole.dev, JobRole.grader):
            inputs = self._inputs("evaluates", role, artifact)
            self._record(inputs, "succeeded", 10, lines=["evaluating", score], trusted=[1])

    def now(self) -> datetime:
        return self.inner.now()

    async def advance(self) -> None:
        await self.inner.advance()

    def unknown_ref(self) -> str:
        return "replay-" + "0" * 24

    def inject(self, fault: Fault, ref: str | None) -> None:
        raise AssertionError(self.cannot["transient"])

    def declaring(self, python: str) -> JobsBackend:
        inner = self.inner.declaring(python)
        return ReplayBackend(self._tmp_path / f"replay-{python}", self.store, inner)

    async def stick_cancellations(self, ref: str) -> None:
        self.replay.hold_cancellation(ref)

    async def release_cancellations(self, ref: str) -> None:
        self.replay.release_cancellation(ref)


HARNESSES: dict[str, Callable[[Path, pytest.MonkeyPatch], Harness]] = {
    "fake": lambda tmp_path, _monkeypatch: FakeHarness(tmp_path),
    "local": LocalHarness,
    "hf": hf_harness,
    "replay": lambda tmp_path, _monkeypatch: ReplayHarness(tmp_path),
}
