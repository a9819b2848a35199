"""The supervisor of one local job: `python -m activities.local.job_runner <job folder>`.

Standard library only. Started detached by the backend (its own session; it double-forks so
that it is nobody's child and outlives the worker or server that started it), it reads the
phases' secret environment (nonce, grader seed) from stdin — never from a file or its command
line — then runs the phases of `job.json` in order (install with network, then the sandboxed
run), each in bubblewrap with its output appended to `log`. While a phase runs it enforces:

- the job's timeout (counted from the job's start, install included): state `timed_out`;
- a cancellation (the `cancel` file): state `cancelled`;
- the outputs folder against the artifact cap, and everything the job can write (/data, /tmp,
  /dev/shm, the log) against the disk cap: state `failed`.

Stopping a phase kills its pid-namespace init (bwrap's `child-pid`), which ends every process
inside. Then it moves the outputs to `artifact/` without following links (agent jobs), frees
the scratch folders and writes `result.json` once. The backend only ever reads these files.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from activities.local import jobfiles as jf
from activities.local.sandbox import INFO_FD

INFO_WAIT_S = 30.0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m activities.local.job_runner <job folder>", file=sys.stderr)
        return 2
    folder = Path(argv[1])
    secret_env = json.loads(sys.stdin.read() or "{}")
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:  # the first process only waits until the supervisor is recorded
        os.close(ready_w)
        ok = os.read(ready_r, 1) == b"1"
        os._exit(0 if ok else 1)
    os.close(ready_r)
    ok = b"0"
    try:
        jf.write_json(folder / jf.SUPERVISOR, jf.identity(os.getpid()))
        supervisor = Supervisor(folder, secret_env)  # records the start: the job now runs
        ok = b"1"
    finally:
        os.write(ready_w, ok)
        os.close(ready_w)
    devnull = os.open(os.devnull, os.O_RDWR)
    errors = os.open(folder / "supervisor.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(errors, 1)
    os.dup2(errors, 2)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    supervisor.run()
    return 0


class Supervisor:
    def __init__(self, folder: Path, secret_env: dict[str, dict[str, str]]) -> None:
        self.folder = folder
        self.spec: dict[str, Any] = json.loads((folder / jf.JOB).read_text())
        self.secret_env = secret_env
        self.started = time.time()
        self.deadline = self.started + float(self.spec["timeout_s"])
        self.log_fd = os.open(folder / jf.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.next_size_check = 0.0
        jf.write_json(folder / jf.STATUS, {"started_at": self.started})

    def say(self, text: str) -> None:
        os.write(self.log_fd, f"[posttrain-local] {text}\n".encode())

    def run(self) -> None:
        state, exit_code, message = "succeeded", 0, ""
        phases: list[dict[str, Any]] = []  # wall times per phase (bench/episode_wall.py)
        for phase in self.spec["phases"]:
            phase_started = time.time()
            stop, exit_code = self.run_phase(phase)
            phases.append({"name": phase["name"], "started": phase_started, "ended": time.time()})
            if stop is not None:
                state, message = stop
                break
            if exit_code != 0:
                state = "failed"
                message = phase["failure"].replace("{code}", str(exit_code))
                break
        finished = time.time()
        if state != "cancelled" and (self.folder / jf.CANCEL).exists():
            state, message = "cancelled", "cancelled"  # asked while the last phase was ending
        kept_note = ""
        if not self.spec["privileged"]:
            # Without root the job shares our uid, and may have locked us out of /data.
            try:
                os.chmod(self.folder / "data", 0o755)
            except OSError:
                pass
        if self.spec.get("collect"):
            if state == "failed" and message.startswith("outputs"):
                shutil.rmtree(self.folder / "data" / "outputs", ignore_errors=True)
            kept, dropped = jf.collect_artifact(
                self.folder / "data" / "outputs",
                self.folder / jf.ARTIFACT,
                bool(self.spec["privileged"]),
            )
            kept_note = f"; artifact: {kept} files" + (
                f", {dropped} links or special files dropped" if dropped else ""
            )
        for name in self.spec.get("cleanup", []):
            _remove(self.folder / name)
        self.say(f"job {state} after {finished - self.started:.1f} s{kept_note}")
        jf.create_json(
            self.folder / jf.RESULT,
            {
                "state": state,
                "exit_code": exit_code,
                "started_at": self.started,
                "finished_at": finished,
                "running_s": finished - self.started,
                "message": message or state,
                "phases": phases,
            },
        )

    def run_phase(self, phase: dict[str, Any]) -> tuple[tuple[str, str] | None, int]:
        """Run one phase to its end. Returns (stop reason, exit code); a stop reason is
        (state, message) when the supervisor ended the phase itself."""
        if (self.folder / jf.CANCEL).exists():
            return ("cancelled", "cancelled"), -1
        env = dict(phase.get("env", {}))
        env.update(self.secret_env.get(phase["name"], {}))
        info_r, info_w = os.pipe()
        argv = [str(info_w) if a == INFO_FD else a for a in phase["argv"]]
        limits = self.spec["limits"] if phase.get("limits") else None
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self.log_fd,
                stderr=self.log_fd,
                env=env,
                pass_fds=(info_w,),
                start_new_session=True,
                preexec_fn=(lambda: _set_limits(limits)) if limits else None,
            )
        except OSError as exc:
            os.close(info_r)
            os.close(info_w)
            return ("failed", f"could not start the sandbox: {exc}"), -1
        os.close(info_w)
        child = _read_child_pid(info_r, proc)
        sandbox = jf.identity(child) if child else None
        jf.write_json(self.folder / jf.SANDBOX, {**(sandbox or {}), "phase": phase["name"]})
        stop: tuple[str, str] | None = None
        while proc.poll() is None:
            stop = self.check()
            if stop is not None:
                self.say(stop[1])
                break
            time.sleep(float(self.spec.get("poll_s", 0.1)))
        if stop is not None:
            _stop(proc, sandbox)
        code = proc.wait()
        # The phase has ended only once its pid namespace is empty (its init reaps last).
        deadline = time.monotonic() + 10
        while jf.is_alive(sandbox) and time.monotonic() < deadline:
            time.sleep(0.01)
        return stop, code

    def check(self) -> tuple[str, str] | None:
        if (self.folder / jf.CANCEL).exists():
            return "cancelled", "cancelled"
        now = time.time()
        if now >= self.deadline:
            return "timed_out", f"timed out after {self.spec['timeout_s']} s"
        if now < self.next_size_check:
            return None
        self.next_size_check = now + float(self.spec.get("size_every_s", 0.5))
        watch = self.spec["watch"]
        max_files = int(watch["max_files"])
        out_bytes, out_files = jf.usage(self.folder / "data" / "outputs", max_files)
        if out_bytes > watch["artifact_cap_bytes"] or out_files > max_files:
            return "failed", (
                f"outputs reached {out_bytes} bytes in {out_files} entries, over this job's cap "
                f"of {watch['artifact_cap_bytes']} bytes and {max_files} entries; stopped"
            )
        total = os.stat(self.folder / jf.LOG).st_size
        for name in watch["scratch"]:
            size, files = jf.usage(self.folder / name, max_files)
            total += size
            if files > max_files:
                total = watch["disk_cap_bytes"] + 1
        if total > watch["disk_cap_bytes"]:
            return "failed", (
                f"the job wrote {total} bytes (/data, /tmp, /dev/shm and its log), over the "
                f"disk cap of {watch['disk_cap_bytes']} bytes; stopped"
            )
        return None


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


def _set_limits(limits: dict[str, int]) -> None:
    """In the forked bwrap, before exec: rlimits every process of the phase inherits."""
    for name, key in (
        ("RLIMIT_NPROC", "nproc"),
        ("RLIMIT_FSIZE", "file_bytes"),
        ("RLIMIT_AS", "memory_bytes"),
    ):
        value = limits.get(key)
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _remove(path: Path) -> None:
    def fix(_func: object, failed: str, _exc_info: object) -> None:
        # A job sharing our uid (no root) may have left folders without write permission.
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=fix)  # onerror, not onexc: the supervisor may run on 3.11


if __name__ == "__main__":
    sys.exit(main(sys.argv))
