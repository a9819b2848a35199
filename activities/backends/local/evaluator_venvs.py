"""Warm grading on the local backend: one venv per evaluator, built once, shared read-only.

An evaluation's packages (its evaluator's pinned PEP 723 dependencies: torch, transformers, …)
used to be installed into each job's own venv, so every dev or grader job paid for copying
them out of the uv cache and then for importing them from `.py` files, and the first one after
a start also for downloading them (issue 44: 88.8 s for the first grading, ~50 s of it the
install). Here an evaluator's venv is built once per **key** and kept under
`<state>/local/evaluator-venvs/<key>/venv`:

- the key is the SHA-256 of what the install uses: the dependencies as the launcher normalises
  them (`merged_dependencies(script, [])`), the header's `exclude-newer`, the job Python and
  its version, and the backend's find-links and no-index settings; a change to any of them is
  another venv (an old one is left in place: delete the folder to reclaim it);
- it is built by the same install phase a job runs (`launcher.py --phase install` in bwrap with
  network, wheels only, through the shared uv cache), only with `/env` bound to the key's
  folder, under an exclusive lock on `<key>.lock` (`fcntl.flock`): four graders starting at
  once build it once, the other three wait and then find it done. Its `.py` files are then
  compiled once (`compileall` by the base interpreter, `-I -S`: no package code runs as root;
  paths recorded as the job sees them, `/env/venv/...`), which the read-only venv could never
  do for itself at each import. `<key>.done` (JSON: the packages and when) marks it complete; a
  build that failed or was killed leaves none, and the next job starts it again from empty;
- it is owned by root and readable by all (the launcher's umask), and every evaluation job of
  that key mounts it read-only at `/env`: the run phase only reads `/env/venv` (the launcher's
  `--phase run` never writes it). A job with a done venv skips the build at once (the wrapper
  exits 0 before starting anything).

On Hugging Face there is no such cache (docs/backends.md, "Warm grading"): each grader job is
`uv run` of the launcher on a fresh machine, which installs the evaluator's packages from PyPI
there; `run_uv_job`'s `image` is the only thing a job can start warm with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from job_launcher.requirements import merged_dependencies, script_exclude_newer

# What the key's folder holds (mounted at /env), and the venv inside it.
VENV_NAME = "venv"
IN_SANDBOX = "/env"
# Bump when the way a venv is built changes, so no venv built the old way is used again.
LAYOUT = 1

# The build phase's wrapper, run by the job Python on the host as `python -I -S -c WRAPPER
# lock done folder info_fd -- bwrap …`: it holds the key's lock for the whole build, skips it
# when `done` exists, else empties the folder, runs the install sandbox (its `--info-fd`
# answered to the supervisor's pipe, so a cancelled job's sandbox is killed as any phase's),
# compiles the venv and writes `done`. Standard library only, no site: nothing installed runs.
WRAPPER = r"""
import fcntl, json, os, shutil, subprocess, sys, time
os.umask(0o022)  # readable (never writable) by the jobs' uids
lock_path, done_path, folder, supervisor_fd = sys.argv[1:5]
command = sys.argv[sys.argv.index("--") + 1:]
supervisor_fd = int(supervisor_fd)
with open(lock_path, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(done_path):
        print("the evaluator's venv is ready (built by an earlier job)", flush=True)
        sys.exit(0)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, mode=0o755)
    started = time.time()
    print("building the evaluator's venv (once for every job of this evaluator)", flush=True)
    info_r, info_w = os.pipe()
    command = [str(info_w) if a == "@INFO@" else a for a in command]
    proc = subprocess.Popen(command, pass_fds=(info_w,))
    os.close(info_w)
    data = b""
    while True:
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        data += chunk
        try:
            json.loads(data)
        except ValueError:
            continue
        try:
            os.write(supervisor_fd, data)
        except OSError:
            pass  # the supervisor stopped waiting for it
        break
    os.close(info_r)
    try:
        os.close(supervisor_fd)
    except OSError:
        pass
    code = proc.wait()
    if code != 0:
        sys.exit(code)
    installed = time.time()
    venv = os.path.join(folder, "venv")
    compiled = subprocess.run(
        [sys.executable, "-I", "-S", "-m", "compileall", "-q", "-j", "0",
         "-s", folder, "-p", "/env", os.path.join(venv, "lib")],
        stdout=subprocess.DEVNULL,
    )
    print(f"installed in {installed - started:.1f} s, compiled in {time.time() - installed:.1f} s"
          f" (compileall exit {compiled.returncode})", flush=True)
    with open(done_path + ".tmp", "w") as out:
        json.dump({"built_at": time.time(), "install_s": installed - started}, out)
    os.replace(done_path + ".tmp", done_path)
"""
# The supervisor replaces this placeholder with its info pipe (job_runner.INFO_FD's value).
INFO_PLACEHOLDER = "@INFO@"


def venv_key(
    script: str,
    *,
    job_python: str,
    job_python_version: str,
    find_links: Sequence[str],
    no_index: bool,
) -> str:
    """The key of an evaluator's venv: what its install depends on."""
    what = {
        "layout": LAYOUT,
        "dependencies": merged_dependencies(script, []),
        "exclude_newer": script_exclude_newer(script),
        "python": job_python,
        "python_version": job_python_version,
        "find_links": list(find_links),
        "no_index": no_index,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class EvaluatorVenvs:
    """The backend's cache of evaluator venvs, under `root` (owned by the server's user)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, key: str) -> Path:
        """What every job of this key mounts at /env (the venv is `venv/` inside)."""
        return self.root / key

    def is_done(self, key: str) -> bool:
        return (self.root / f"{key}.done").is_file()

    def build_phase(self, key: str, install: dict[str, Any], job_python: str) -> dict[str, Any]:
        """The job's install phase as the locked, skip-when-done build of the key's venv:
        `install` is the phase a job would run with `/env` bound to the key's folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        argv = list(install["argv"])
        bwrap_info = argv.index("--info-fd") + 1
        supervisor_fd = argv[bwrap_info]
        argv[bwrap_info] = INFO_PLACEHOLDER
        # Dies with the wrapper (killed by the supervisor when the job is cancelled or times out),
        # so no installer outlives the lock it ran under.
        argv.insert(1, "--die-with-parent")
        lock, done = self.root / f"{key}.lock", self.root / f"{key}.done"
        wrapper = [job_python, "-I", "-S", "-c", WRAPPER, str(lock), str(done)]
        wrapper += [str(self.folder(key)), supervisor_fd, "--", *argv]
        return {**install, "argv": wrapper, "failure": install["failure"]}
