"""The supervisor of one local job: `python -m activities.backends.local.job_runner <job folder>`.

Standard library only. Started detached by the backend (its own session; it double-forks so
that it is nobody's child and outlives the worker or server that started it), it reads the
phases' secret environment (nonce, grader seed) from stdin — never from a file or its command
line — then:

1. contains the job (docs/backends.md, "Local backend", DESIGN §10): host disk for its own disk
beside
   the other running jobs' and a reserve (else it does not start); its control groups (memory
   with swap off, processes, CPU weight and quota; activities/backends/local/cgroups.py) and its
   filesystems (an ext4 image for /data, /tmp and the venv, a tmpfs for /dev/shm, mounted in a
   mount namespace of the supervisor's own; activities/backends/local/scratch.py). A job whose
   limits
   cannot be set up as the backend planned does not run;
2. runs the phases of `job.json` in order (install with network, then the sandboxed run), each
   in bubblewrap inside the job's groups, its output piped through the supervisor into `log`;
   while a phase runs it enforces the job's timeout (`timed_out`), a cancellation (the `cancel`
   file: `cancelled`), the outputs folder against the artifact cap and the log against its cap
   (`failed`), and, where the host gave no filesystem, the folders against the disk cap;
3. copies the outputs to `artifact/` (agent jobs), reads what the groups counted, removes the
   groups and the filesystems, and writes `result.json` — always, whatever the job left behind
   or whatever failed on the way; the message says which limit the job hit.

Stopping a phase kills its pid-namespace init (bwrap's `child-pid`), which ends every process
inside; removing the job's groups kills anything left in them. The backend only reads files.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from activities.backends.local import collection, scratch
from activities.backends.local import jobfiles as jf
from activities.backends.local.cgroups import CgroupError, GroupLimits, JobGroups
from activities.backends.local.sandbox import INFO_FD
from activities.backends.local.scratch import describe_bytes as _size

INFO_WAIT_S = 30.0
DRAIN_WAIT_S = 10.0
READ_CHUNK = 1 << 16
# At most this much output is copied to the log per look, so the checks stay timely.
READ_PER_LOOK = 4 << 20
# The job's output pipe: what it may print between two looks (fcntl F_SETPIPE_SZ).
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031


# The first process's exit status when another supervisor already has the job (its starter
# treats that as started); any other failure to start is 1.
ALREADY_SUPERVISED = 3
_STARTED, _ALREADY = b"1", b"3"


def read_secret_env(raw: bytes) -> dict[str, dict[str, str]] | None:
    """The phases' secret environment as the backend sends it (always a JSON object, `{}` when
    there are none), or None when it did not arrive whole: the starter stopped (a worker
    killed) before writing it. A job started without its nonce and seed would run only to fail
    as its evaluator's fault."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return value


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m activities.backends.local.job_runner <job folder>", file=sys.stderr)
        return 2
    folder = Path(argv[1])
    secret_env = read_secret_env(sys.stdin.buffer.read())
    if secret_env is None:
        # Nothing is recorded: the folder stays unclaimed, and a retried submit starts it.
        print("the job's secrets did not arrive whole; it was not started", file=sys.stderr)
        return 1
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:  # the first process only waits until the supervisor is recorded
        os.close(ready_w)
        answer = os.read(ready_r, 1)
        os._exit(0 if answer == _STARTED else ALREADY_SUPERVISED if answer == _ALREADY else 1)
    os.close(ready_r)
    ok = b"0"
    supervisor = None
    try:
        # The claim is an exclusive create: of two starters of one job (a retried submit beside
        # a slow first one), or a supervisor and the backend recording that none ever came
        # (store.py, `_reconcile`), exactly one wins.
        if jf.create_json(folder / jf.SUPERVISOR, jf.identity(os.getpid())):
            supervisor = Supervisor(folder, secret_env)  # records the start: the job now runs
            ok = _STARTED
        else:
            ok = _ALREADY
    finally:
        os.write(ready_w, ok)
        os.close(ready_w)
    if supervisor is None:
        return 0
    devnull = os.open(os.devnull, os.O_RDWR)
    errors = os.open(folder / "supervisor.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(errors, 1)
    os.dup2(errors, 2)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    supervisor.run()
    return 0


class Stop(Exception):
    """The supervisor ends the phase: (state, message)."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.message = message


class Supervisor:
    def __init__(self, folder: Path, secret_env: dict[str, dict[str, str]]) -> None:
        self.folder = folder
        self.spec: dict[str, Any] = json.loads((folder / jf.JOB).read_text())
        self.secret_env = secret_env
        self.started = time.time()
        self.deadline = self.started + float(self.spec["timeout_s"])
        self.log_fd = os.open(folder / jf.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.log_cap = int(self.spec.get("resources", {}).get("log_bytes") or 1 << 62)
        self.next_size_check = 0.0
        self.last_pump = 0.0
        self.busy = False  # its CPU weight was lowered (`weigh_busy_job`)
        self.groups: JobGroups | None = None
        self.tools: scratch.Tools | None = None
        self.mounted = False
        # Limits the job met while it ran (sticky: a job may free the space again).
        self.disk_full = self.files_full = self.shm_full = False
        # What collection kept ({"files", "bytes"} and "refused" when it kept nothing).
        self.outputs: dict[str, Any] | None = None
        # The limits the job met, as `explain` names them ("memory", "processes", ...).
        self.limits: list[str] = []
        jf.write_json(folder / jf.STATUS, {"started_at": self.started})

    def say(self, text: str) -> None:
        os.write(self.log_fd, f"[posttrain-local] {text}\n".encode())

    # -- the whole job -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run the job and record its end. Never raises: the result is always written."""
        state, exit_code, message = "failed", -1, ""
        phases: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        notes: list[str] = []
        try:
            try:
                self.contain()
            except scratch.HostDiskError as exc:
                message = str(exc)  # names the limit: the host's disk and its reserve
            except (CgroupError, scratch.ScratchError, OSError) as exc:
                message = f"the job's limits could not be set up, so it did not run: {exc}"
            else:
                state, exit_code, message, phases = self.run_phases()
            if state != "cancelled" and (self.folder / jf.CANCEL).exists():
                state, message = "cancelled", "cancelled"  # asked while the last phase ended
            if self.groups is not None:
                usage = self.groups.usage()
            self.look_at_filesystems()
            if self.spec.get("collect"):
                state, message, collected = self.collect(state, message)
                notes.append(collected)
        except BaseException as exc:  # whatever happened, the job gets a result
            state, message = "failed", f"the job's supervisor failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            for problem in self.release():
                self.say(f"cleanup: {problem}")
        finished = time.time()
        message = message or state
        try:
            message = self.explain(state, message, exit_code, usage)
            self.say(f"job {state} after {finished - self.started:.1f} s" + "".join(notes))
        except Exception:  # the result below matters more than its wording
            traceback.print_exc()
        jf.create_json(
            self.folder / jf.RESULT,
            {
                "state": state,
                "exit_code": exit_code,
                "started_at": self.started,
                "finished_at": finished,
                "running_s": finished - self.started,
                "message": message,
                "phases": phases,  # wall times per phase (bench/episode_wall.py)
                "usage": usage,
                # Agent jobs: what the artifact holds (apparent bytes), or why it holds nothing.
                "outputs": self.outputs,
                "limits": self.limits,
            },
        )

    def run_phases(self) -> tuple[str, int, str, list[dict[str, Any]]]:
        phases: list[dict[str, Any]] = []
        for phase in self.spec["phases"]:
            phase_started = time.time()
            try:
                exit_code = self.run_phase(phase)
            except Stop as stop:
                return stop.state, -1, stop.message, phases
            finally:
                phases.append(
                    {"name": phase["name"], "started": phase_started, "ended": time.time()}
                )
            if exit_code != 0:
                failure = phase["failure"].replace("{code}", str(exit_code))
                return "failed", exit_code, failure, phases
        return "succeeded", 0, "", phases

    # -- containment -------------------------------------------------------------------------------

    def contain(self) -> None:
        """The job's host disk, control groups and filesystems, before anything of it runs."""
        resources = self.spec["resources"]
        filesystem = self.spec.get("filesystem")
        retention = self.spec.get("retention")
        caps = self.caps()
        artifact = 0
        if self.spec.get("collect"):
            artifact = min(caps.artifact_bytes, caps.storage_bytes or caps.artifact_bytes)
        scratch.claim_host_disk(
            self.folder,
            disk_bytes=resources["disk_bytes"],
            reserve_bytes=int(self.spec.get("host_disk_reserve_bytes") or 0),
            image=bool(filesystem),
            artifact_bytes=artifact,
            holders=scratch.Retention(**retention) if retention else None,
        )
        placements = self.spec.get("cgroups") or []
        if placements:
            self.groups = JobGroups.from_spec(placements, self.folder.name)
            jobs = self.spec["jobs_limits"]
            self.groups.create(
                GroupLimits(
                    memory_bytes=jobs["memory_bytes"],
                    cpus=jobs["cpus"],
                    cpu_weight=jobs["cpu_weight"],
                ),
                GroupLimits(
                    memory_bytes=resources["memory_bytes"],
                    processes=resources["processes"],
                    cpus=resources["vcpus"],
                    cpu_weight=self.spec["job_cpu_weight"],
                ),
            )
        if filesystem:
            self.tools = scratch.Tools(**filesystem)
            scratch.enter_private_mount_namespace()
            self.mounted = True
            scratch.mount_job_filesystems(
                self.folder,
                self.tools,
                disk_bytes=resources["disk_bytes"],
                files=resources["files"],
                shm_bytes=shm_bytes(resources),
            )
            self.throttle_disk()
        else:
            (self.folder / scratch.FS).mkdir(exist_ok=True)
            (self.folder / scratch.SHM).mkdir(exist_ok=True)
            os.chmod(self.folder / scratch.SHM, 0o1777)
        scratch.prepare_folders(self.folder / scratch.FS, self.spec.get("data_owner"))

    def throttle_disk(self) -> None:
        """Hold the job's I/O on its own disk (`disk_io` of its spec: posttrain_env/limits.py,
        LOCAL_JOB_DISK_BYTES_PER_S), so that a job fsyncing without end leaves the host's disk
        to other episodes' jobs and to Temporal. Where no blkio group is, the job runs
        unthrottled."""
        limits = self.spec.get("disk_io")
        device = scratch.disk_device(self.folder / scratch.FS)
        if not limits or device is None or self.groups is None:
            return
        self.groups.throttle_disk(device, int(limits["bytes_per_s"]), int(limits["iops"]))

    def release(self) -> list[str]:
        """Remove the job's groups and filesystems. Never raises; returns what was left."""
        problems: list[str] = []
        if self.groups is not None:
            try:
                problems += self.groups.remove()
            except OSError as exc:
                problems.append(f"control groups: {exc}")
        if self.tools is not None and self.mounted:
            try:
                problems += scratch.unmount_job_filesystems(self.folder, self.tools)
            except OSError as exc:
                problems.append(f"filesystems: {exc}")
        for name in (scratch.FS, scratch.SHM, scratch.IMAGE):
            try:
                scratch.remove_tree(self.folder / name)
            except OSError as exc:
                problems.append(f"removing {name}: {exc}")
        return problems

    # -- one phase ---------------------------------------------------------------------------------

    def run_phase(self, phase: dict[str, Any]) -> int:
        """Run one phase to its end and return its exit code; Stop when the supervisor ended it."""
        if (self.folder / jf.CANCEL).exists():
            raise Stop("cancelled", "cancelled")
        env = dict(phase.get("env", {}))
        env.update(self.secret_env.get(phase["name"], {}))
        info_r, info_w = os.pipe()
        out_r, out_w = os.pipe()
        _widen(out_w)
        argv = [str(info_w) if a == INFO_FD else a for a in phase["argv"]]
        rlimits = self.spec["limits"] if phase.get("limits") else None
        groups = self.groups
        niceness = int(self.spec.get("niceness") or 0)

        def enter_limits() -> None:  # in the forked child, before exec
            if groups is not None:
                groups.join(os.getpid())
            if niceness:
                os.nice(niceness)
            if rlimits is not None:
                _set_limits(rlimits)

        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                env=env,
                pass_fds=(info_w,),
                start_new_session=True,
                preexec_fn=enter_limits,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in (info_r, info_w, out_r, out_w):
                os.close(fd)
            raise Stop("failed", f"could not start the sandbox: {exc}") from None
        os.close(info_w)
        os.close(out_w)
        try:
            child = _read_child_pid(info_r, proc)
            sandbox = jf.identity(child) if child else None
            jf.write_json(self.folder / jf.SANDBOX, {**(sandbox or {}), "phase": phase["name"]})
            stop: Stop | None = None
            while proc.poll() is None:
                try:
                    self.pump(out_r, timeout=float(self.spec.get("poll_s", 0.1)))
                    self.check()
                except Stop as reason:
                    stop = reason
                    self.say(stop.message)
                    break
            if stop is not None:
                _stop(proc, sandbox)
            code = proc.wait()
            # The phase has ended only once its pid namespace is empty (its init reaps last).
            deadline = time.monotonic() + 10
            while jf.is_alive(sandbox) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.drain(out_r)
        finally:
            os.close(out_r)
        if stop is not None:
            raise stop
        return code

    def pump(self, out_r: int, timeout: float) -> None:
        """Copy what the phase printed to the log, waiting up to `timeout` for it. At most one
        copy per `timeout`: a job that prints in tiny writes would otherwise wake this process
        (which runs outside the job's control groups, on the server's share of the CPU) once
        per write; the pipe (PIPE_BYTES) holds what it prints meanwhile, and a job that fills
        it waits, on its own CPU share."""
        wait = self.last_pump + timeout - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.last_pump = time.monotonic()
        ready, _, _ = select.select([out_r], [], [], timeout)
        copied = 0
        while ready and copied < READ_PER_LOOK:
            chunk = os.read(out_r, READ_CHUNK)
            if not chunk:
                return
            self.write_log(chunk)
            copied += len(chunk)
            ready, _, _ = select.select([out_r], [], [], 0)

    def drain(self, out_r: int) -> None:
        """The phase's last output, until every writer has closed (or a deadline: a process
        that outlives its namespace, which the kernel does not allow, would hold it open)."""
        deadline = time.monotonic() + DRAIN_WAIT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out_r], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(out_r, READ_CHUNK)
            if not chunk:
                return
            try:
                self.write_log(chunk)
            except Stop:
                pass  # over the log cap at the very end: the rest is dropped

    def write_log(self, chunk: bytes) -> None:
        room = self.log_cap - os.fstat(self.log_fd).st_size
        if len(chunk) > room:
            if room > 0:
                os.write(self.log_fd, chunk[:room] + b"\n")
            raise Stop(
                "failed",
                f"the job's log reached its cap of {_size(self.log_cap)}; stopped (print less, "
                "write details to a file in /data/outputs)",
            )
        os.write(self.log_fd, chunk)

    def check(self) -> None:
        """Raise Stop when the job must end now (cancel, timeout, a cap it went over)."""
        if (self.folder / jf.CANCEL).exists():
            raise Stop("cancelled", "cancelled")
        now = time.time()
        if now >= self.deadline:
            raise Stop("timed_out", f"timed out after {self.spec['timeout_s']} s")
        self.look_at_filesystems()  # two statvfs calls: cheap enough for every look
        if now < self.next_size_check:
            return
        self.next_size_check = now + float(self.spec.get("size_every_s", 0.5))
        self.weigh_busy_job()
        watch = self.spec["watch"]
        max_files = int(watch["max_files"])
        caps = self.caps()
        out_bytes, out_files = jf.usage(self.folder / scratch.FS / "data" / "outputs", max_files)
        over = collection.over_a_cap(out_bytes, caps)
        if over is not None or out_files > max_files:
            held = f"{out_bytes} bytes in {out_files} entries"
            raise Stop(
                "failed",
                f"outputs reached {held}, over what this job may keep "
                f"({min(caps.artifact_bytes, caps.storage_bytes or caps.artifact_bytes)} bytes, "
                f"{max_files} entries); stopped",
            )
        if self.spec.get("filesystem"):
            return
        # No filesystem of its own (no root, or no loop devices): measure the folders.
        total = entries = 0
        for folder in (self.folder / scratch.FS, self.folder / scratch.SHM):
            size, files = jf.usage(folder, max_files)
            total += size
            entries += files
        if entries > max_files:
            raise Stop(
                "failed",
                f"the job made more than {max_files} files and folders (/data, /tmp, /dev/shm "
                "and its packages), over its cap; stopped",
            )
        if total > watch["disk_cap_bytes"]:
            raise Stop(
                "failed",
                f"the job wrote {total} bytes (/data, /tmp, /dev/shm and its packages), over "
                f"the disk cap of {watch['disk_cap_bytes']} bytes; stopped",
            )

    def weigh_busy_job(self) -> None:
        """Once the job has used `busy_job.after_cpu_s` of CPU, lower its CPU weight to
        `busy_job.cpu_weight` (posttrain_env/limits.py, LOCAL_BUSY_JOB_AFTER_CPU_S): jobs that
        have used little then come first under contention."""
        busy = self.spec.get("busy_job")
        if self.busy or not busy or self.groups is None:
            return
        used = self.groups.cpu_used_s()
        if used is None or used < float(busy["after_cpu_s"]):
            return
        self.busy = True
        try:
            self.groups.set_cpu_weight(int(busy["cpu_weight"]))
        except CgroupError as exc:
            self.say(f"could not lower the job's CPU weight: {exc}")
            return
        self.say(
            f"the job has used {used:.0f} CPU-seconds: it now weighs {busy['cpu_weight']} "
            f"against a new job's {self.spec['job_cpu_weight']} when the CPUs are contended"
        )

    def look_at_filesystems(self) -> None:
        """Note whether the job's filesystems are full (it will have met ENOSPC)."""
        if not self.spec.get("filesystem") or not self.mounted:
            return
        disk = scratch.fullness(self.folder / scratch.FS)
        if disk is not None:
            self.disk_full |= disk.out_of_space
            self.files_full |= disk.out_of_files
        shm = scratch.fullness(self.folder / scratch.SHM)
        if shm is not None:
            self.shm_full |= shm.out_of_space or shm.out_of_files

    # -- the end -----------------------------------------------------------------------------------

    def caps(self) -> collection.Caps:
        """What this job's artifact may hold: its own cap, and what its episode may still keep."""
        watch = self.spec["watch"]
        storage = watch.get("storage_bytes")
        whole = watch.get("storage_cap_bytes")
        return collection.Caps(
            artifact_bytes=int(watch["artifact_cap_bytes"]),
            entries=int(watch["max_files"]),
            storage_bytes=None if storage is None else int(storage),
            storage_cap_bytes=None if whole is None else int(whole),
        )

    def collect(self, state: str, message: str) -> tuple[str, str, str]:
        """Copy the outputs to the artifact whole, or keep none of them (agent jobs). Returns
        (state, message, log note). Never raises: a copy that fails fails the job, with an
        empty artifact."""
        outputs = self.folder / scratch.FS / "data" / "outputs"
        artifact = self.folder / jf.ARTIFACT
        try:
            collected = collection.collect(outputs, artifact, self.caps())
        except OSError as exc:
            for leftover in (
                artifact,
                artifact.with_name(artifact.name + collection.PARTIAL_SUFFIX),
            ):
                scratch.remove_tree(leftover)
            os.mkdir(artifact, 0o755)  # empty, never half
            self.outputs = {"files": 0, "bytes": 0}
            reason = f"collecting the job's outputs failed, nothing was kept: {exc}"
            return "failed", reason, "; artifact: none (the copy failed)"
        self.outputs = {"files": collected.files, "bytes": collected.bytes}
        refusal = collected.refusal
        if refusal is None:
            return state, message, f"; artifact: {collected.files} files, {collected.bytes} bytes"
        self.outputs["refused"] = refusal.as_dict()
        note = "; artifact: none (refused)"
        if state == "succeeded" or message.startswith("outputs reached"):
            return "failed", refusal.message, note
        return state, f"{message}; {refusal.message}", note

    def explain(self, state: str, message: str, exit_code: int, usage: dict[str, int]) -> str:
        """The job's message, saying which limit it met (if any)."""
        resources = self.spec["resources"]
        met: list[str] = []
        oom = usage.get("oom_kills", 0)
        if oom:
            peak = usage.get("memory_peak_bytes", 0)
            own = usage.get("memory_limit_bytes") or resources["memory_bytes"]
            if peak >= own - (1 << 20):
                self.limits.append("memory")
                met.append(
                    f"it went over its memory limit of {_size(resources['memory_bytes'])} "
                    f"({resources['flavor']} on this machine) and the kernel killed "
                    f"{oom} of its processes"
                )
            else:
                jobs = self.spec["jobs_limits"]["memory_bytes"]
                self.limits.append("jobs_memory")
                met.append(
                    f"all local jobs together reached their memory limit of {_size(jobs)} and "
                    f"the kernel killed {oom} of its processes"
                )
        refused = usage.get("fork_refusals", 0)
        if refused:
            self.limits.append("processes")
            met.append(
                f"it reached its limit of {resources['processes']} processes and threads "
                f"({refused} forks refused)"
            )
        if self.disk_full:
            disk = _size(resources["disk_bytes"])
            self.limits.append("disk")
            met.append(f"it ran out of disk: /data, /tmp and its packages share {disk} (ENOSPC)")
        if self.files_full:
            self.limits.append("files")
            met.append(
                f"it ran out of files: /data, /tmp and its packages hold at most "
                f"{resources['files']} files and folders (ENOSPC)"
            )
        if self.shm_full:
            self.limits.append("shm")
            met.append(
                f"/dev/shm was full (at most {_size(shm_bytes(resources))} and "
                f"{resources['files']} files; ENOSPC)"
            )
        if not met:
            return message
        if state == "failed" and exit_code > 0:
            return "; ".join(met) + f": {message}"
        return f"{message}; " + "; ".join(met)


def _widen(pipe: int) -> None:
    """Give the job's output pipe PIPE_BYTES (Linux's unprivileged maximum, 1 MiB by default):
    what it may print between two looks of the supervisor."""
    try:
        fcntl.fcntl(pipe, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # a host with a lower pipe-max-size: the default 64 KiB, the job waits sooner


def shm_bytes(resources: dict[str, Any]) -> int:
    """/dev/shm holds at most half the job's memory: its pages are memory (charged to the
    job's group), so a full /dev/shm answers ENOSPC before the job's memory runs out."""
    return int(resources["memory_bytes"]) // 2


def _stop(proc: subprocess.Popen[bytes], sandbox: dict[str, int] | None) -> None:
    """Kill the phase's pid-namespace init: the kernel then kills everything inside, and the
    outer bwrap exits once the namespace is empty. Killing the outer bwrap first would let it
    report the end while processes inside are still being torn down."""
    if jf.kill(sandbox):
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # no init known (bwrap never reported it)
    except ProcessLookupError:
        pass


def _read_child_pid(fd: int, proc: subprocess.Popen[bytes]) -> int | None:
    """bwrap's `--info-fd` JSON carries `child-pid`: the init of the phase's pid namespace."""
    data = b""
    deadline = time.monotonic() + INFO_WAIT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
                try:
                    return int(json.loads(data)["child-pid"])
                except (ValueError, KeyError):
                    continue
            elif proc.poll() is not None:
                break
    finally:
        os.close(fd)
    return None


def _set_limits(limits: dict[str, int | None]) -> None:
    """In the forked bwrap, before exec: rlimits every process of the phase inherits. Memory
    (RLIMIT_AS) and processes (RLIMIT_NPROC) only where the host gave no control group for
    them: a group limits the job as a whole, an rlimit each process or uid."""
    for name, key in (
        ("RLIMIT_NPROC", "nproc"),
        ("RLIMIT_FSIZE", "file_bytes"),
        ("RLIMIT_AS", "memory_bytes"),
    ):
        value = limits.get(key)
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
