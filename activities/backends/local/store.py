"""The local backend's jobs on disk: create a job folder and start its supervisor, read a job's
state from its files, cancel it. Everything here works from files alone, so any number of
backend objects (a restarted worker, a second process) see the same jobs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.backends.local import jobfiles as jf
from activities.backends.local import scratch
from activities.backends.local.cgroups import JobGroups, Placement
from activities.backends.local.collection import PARTIAL_SUFFIX
from activities.backends.local.job_runner import ALREADY_SUPERVISED
from activities.backends.local.plan import JobPlan
from posttrain_common.contracts.jobs import BackendJob, OutputsRefusal
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import JobState

REF = re.compile(r"local-[0-9a-f]{24}")
# A job folder without a supervisor this long after its creation never started.
START_GRACE_S = 30.0
# What `_reconcile` records as a job's supervisor when none came within START_GRACE_S.
NEVER_SUPERVISED = {"never_started": True}
CANCEL_WAIT_S = 10.0
# Counting an artifact stops past this many entries (a job's own file limit is far below it).
MAX_COUNTED = 10_000_000
# The folder that holds the `activities` package: as many levels up as this module is deep.
PROJECT_ROOT = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]


def job_ref(key: str) -> str:
    """The job's backend id, derived from its idempotency key (one folder per key)."""
    return "local-" + hashlib.sha256(key.encode()).hexdigest()[:24]


class JobStore:
    def __init__(self, jobs_dir: Path, supervisor_python: str) -> None:
        self.jobs_dir = jobs_dir
        self.supervisor_python = supervisor_python
        jobs_dir.mkdir(parents=True, exist_ok=True)

    def known(self, ref: str) -> Path:
        """The job's folder; ToolError(hf_error) for a ref this backend never made."""
        folder = self.jobs_dir / ref
        if not REF.fullmatch(ref) or not (folder / jf.JOB).exists():
            raise ToolError(ErrorType.hf_error, f"the local backend knows no job {ref!r}")
        return folder

    def artifact(self, ref: str | None) -> Path | None:
        """The artifact folder of a job that has ended, else None."""
        if ref is None or not REF.fullmatch(ref):
            return None
        folder = self.jobs_dir / ref / jf.ARTIFACT
        return folder if folder.is_dir() else None

    def live_uids(self) -> set[int]:
        """Uids of our jobs that have not ended (or not started yet)."""
        uids = set()
        for folder in self.jobs_dir.iterdir():
            spec = jf.read_json(folder / jf.JOB)
            if spec and not (folder / jf.RESULT).exists():
                uids.add(int(spec.get("uid", 0)))
        return uids

    def sweep(self, placements: Sequence[Placement]) -> None:
        """Release what ended jobs left behind when their supervisor was killed (control
        groups, folders), e.g. before this server restarted. Per ended job, a read of its
        job.json and a few stat calls when there is nothing to release."""
        for folder in self.jobs_dir.iterdir():
            if not REF.fullmatch(folder.name) or not (folder / jf.RESULT).exists():
                continue
            spec = jf.read_json(folder / jf.JOB) or {}
            # The groups the job was given, and where this server puts jobs now: a server
            # restarted in another group of its own (a new container, a systemd unit) has
            # other placements than the spec's.
            recorded = [Placement(**item) for item in spec.get("cgroups") or []]
            groups = JobGroups(list(dict.fromkeys([*recorded, *placements])), folder.name)
            leftovers = [folder / name for name in (scratch.FS, scratch.SHM, scratch.IMAGE)]
            if not groups.exist() and not any(p.exists() for p in leftovers):
                continue
            if jf.is_alive(jf.read_json(folder / jf.SUPERVISOR)):
                continue  # still tearing down
            release_leftovers(folder, spec, wait_s=0.5)
            groups.remove(timeout_s=0.5)

    # -- create ----------------------------------------------------------------------------------

    def create(self, ref: str, plan: JobPlan, spec: dict[str, Any]) -> BackendJob:
        """Write the job's folder and start its supervisor; a create of a ref that exists
        returns its job. When that job's supervisor never came (the first create's process was
        killed between writing the folder and handing the supervisor its secrets), this create
        starts it: supervisors claim a job exclusively, so it runs once whoever starts it."""
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=self.jobs_dir))
        # The job's writable folders are made by its supervisor, on its own filesystem.
        (staging / "job").mkdir(mode=0o755)
        for name, (content, mode) in plan.files.items():
            (staging / name).write_bytes(content)
            os.chmod(staging / name, mode)
        jf.write_json(staging / jf.JOB, {**spec, "ref": ref, "created_at": time.time()})
        try:
            os.rename(staging, self.jobs_dir / ref)  # atomic: a job folder is whole or absent
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            view = self.start_unclaimed(ref, plan.secret_env)
            if view is None:
                raise
            return view
        os.chmod(self.jobs_dir / ref, 0o755)
        self._start_supervisor(self.jobs_dir / ref, plan.secret_env)
        view = self.view(ref)
        assert view is not None
        return view

    def _start_supervisor(self, folder: Path, secret_env: dict[str, dict[str, str]]) -> None:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(PROJECT_ROOT)}
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        proc = subprocess.Popen(
            [
                self.supervisor_python,
                "-P",
                "-m",
                "activities.backends.local.job_runner",
                str(folder),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd="/",
            env=env,
            start_new_session=True,  # no terminal signal or process-group kill reaches it
        )
        # Secrets travel on stdin: never on a command line (world-readable) or on disk.
        _, err = proc.communicate(json.dumps(secret_env).encode(), timeout=60)
        if proc.returncode not in (0, ALREADY_SUPERVISED):
            now = time.time()
            message = "the job's supervisor did not start: " + err.decode(errors="replace")
            jf.create_json(folder / jf.RESULT, _result("failed", now, now, message[:2000]))

    def start_unclaimed(self, ref: str, secret_env: dict[str, dict[str, str]]) -> BackendJob | None:
        """The job `ref` (None if there is none), after starting its supervisor if none ever
        claimed it: its creator died between writing the folder and handing the supervisor
        its secrets. A job whose supervisor came, or that ended, is left as it is."""
        folder = self.jobs_dir / ref
        unclaimed = not (folder / jf.SUPERVISOR).exists() and not (folder / jf.RESULT).exists()
        if unclaimed and jf.read_json(folder / jf.JOB) is not None:
            self._start_supervisor(folder, secret_env)
        return self.view(ref)

    # -- read ------------------------------------------------------------------------------------

    def view(self, ref: str) -> BackendJob | None:
        folder = self.jobs_dir / ref
        spec = jf.read_json(folder / jf.JOB) if REF.fullmatch(ref) else None
        if spec is None:
            return None
        job = BackendJob(
            ref=ref, key=spec["key"], state=JobState.queued, created_at=_time(spec["created_at"])
        )
        result = jf.read_json(folder / jf.RESULT) or self._reconcile(folder, spec)
        if result is not None:
            return job.model_copy(
                update={
                    "state": JobState(result["state"]),
                    "started_at": _time(result["started_at"]),
                    "finished_at": _time(result["finished_at"]),
                    "running_s": float(result["running_s"]),
                    "message": result["message"],
                    **_outputs_of(folder, spec, result),
                }
            )
        status = jf.read_json(folder / jf.STATUS)
        if status is None:
            return job
        started = float(status["started_at"])
        return job.model_copy(
            update={
                "state": JobState.running,
                "started_at": _time(started),
                "running_s": max(0.0, time.time() - started),
            }
        )

    def _reconcile(self, folder: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
        """A job whose supervisor is gone without a result (killed, or the machine rebooted)
        ends here: its sandbox is killed and it is recorded as failed (or cancelled)."""
        supervisor = jf.read_json(folder / jf.SUPERVISOR)
        if jf.is_alive(supervisor):
            return None
        if supervisor is None and not (folder / jf.SUPERVISOR).exists():
            if time.time() - spec["created_at"] < START_GRACE_S:
                return None  # still starting
            # None came: claim the job as a supervisor would, so that none can start it now
            # (a late retried create); a supervisor that claimed it first is running it.
            if not jf.create_json(folder / jf.SUPERVISOR, NEVER_SUPERVISED):
                return None
            supervisor = NEVER_SUPERVISED
        result = jf.read_json(folder / jf.RESULT)  # it may have finished since we looked
        if result is not None:
            return result
        jf.kill(jf.read_json(folder / jf.SANDBOX))
        now = time.time()
        started = float((jf.read_json(folder / jf.STATUS) or {}).get("started_at", now))
        if (folder / jf.CANCEL).exists():
            ended = _result("cancelled", started, now, "cancelled")
        elif supervisor == NEVER_SUPERVISED:
            never = f"the job never started: its supervisor did not come within {START_GRACE_S:g} s"
            ended = _result("failed", started, now, never)
        else:
            ended = _result("failed", started, now, "the job's supervisor stopped")
        if jf.create_json(folder / jf.RESULT, ended):
            release_leftovers(folder, spec)
        return jf.read_json(folder / jf.RESULT)

    # -- cancel ----------------------------------------------------------------------------------

    def cancel(self, ref: str) -> BackendJob:
        """Ask for the job's end and wait (up to CANCEL_WAIT_S) until it is recorded."""
        folder = self.known(ref)
        view = self.view(ref)
        assert view is not None
        if view.state.terminal:
            return view
        (folder / jf.CANCEL).touch()
        # Kill the sandbox here too, so a cancellation does not wait for the supervisor's poll.
        jf.kill(jf.read_json(folder / jf.SANDBOX))
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            view = self.view(ref)
            assert view is not None
            if view.state.terminal:
                break
            time.sleep(0.02)
        return view


def release_leftovers(folder: Path, spec: dict[str, Any], wait_s: float = 2.0) -> list[str]:
    """What a job whose supervisor is gone left behind: its control groups (killing what is
    still in them) and its folders. Its filesystems were mounted only in the supervisor's own
    mount namespace, so they went with it; here they are empty folders. Best effort: returns
    what could not be removed (a later sweep retries)."""
    problems: list[str] = []
    placements = spec.get("cgroups") or []
    if placements:
        problems += JobGroups.from_spec(placements, folder.name).remove(timeout_s=wait_s)
    # A copy of the outputs cut short by the supervisor's death is never an artifact.
    for name in (scratch.FS, scratch.SHM, scratch.IMAGE, jf.ARTIFACT + PARTIAL_SUFFIX):
        try:
            scratch.remove_tree(folder / name)
        except OSError as exc:
            problems.append(f"{folder / name}: {exc}")
    return problems


def _result(state: str, started: float, finished: float, message: str) -> dict[str, Any]:
    return {
        "state": state,
        "exit_code": -1,
        "started_at": started,
        "finished_at": finished,
        "running_s": finished - started,
        "message": message,
    }


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _outputs_of(folder: Path, spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """An ended job's outputs, limits and refusal as the BackendJob fields say them. An agent
    job whose supervisor died before it recorded its outputs keeps what its artifact holds
    (the copy is renamed into place only when whole)."""
    fields: dict[str, Any] = {"limits_met": [str(n) for n in result.get("limits") or []]}
    if spec.get("role") != "agent":
        return fields
    outputs = result.get("outputs")
    if isinstance(outputs, dict):
        fields["stored_bytes"] = int(outputs.get("bytes") or 0)
        refused = outputs.get("refused")
        if isinstance(refused, dict):
            fields["outputs_refused"] = OutputsRefusal.model_validate(refused)
    else:
        fields["stored_bytes"] = jf.usage(folder / jf.ARTIFACT, MAX_COUNTED)[0]
    return fields
