"""Launcher overhead on this machine (run as root: the launcher drops to a job uid).

    uv run python bench/launcher_overhead.py [--runs 20]

1. start → first line: from spawning `python3 launcher.py --phase run` (venv already installed)
   to the agent script's first line (seccomp, fd closing, uid drop and exec included; package
   installs excluded). Target: median ≤ 100 ms. Measured with a configured job uid (what the
   local backend does) and with the launcher choosing an unused uid (what Hugging Face does).
2. venv + install of one small local wheel, warm cache (`--phase install`). Target ≤ 1 s.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from activities.backends.local.backend import python_version
from job_launcher.builder import NONCE_ENV, LauncherConfig, build_launcher

JOB_PYTHON = "/usr/bin/python3"
JOB_PYTHON_VERSION = python_version(JOB_PYTHON)
FIRST_LINE = "import time\nprint('FIRST', time.time(), flush=True)\n"


def small_wheel(folder: Path) -> None:
    files = {
        "bench_probe/__init__.py": b"VALUE = 1\n",
        "bench_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bench-probe\n"
        b"Version: 1.0\n\n",
        "bench_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"sha256={raw}"

    record = "".join(f"{p},{digest(d)},{len(d)}\n" for p, d in files.items())
    record += "bench_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / "bench_probe-1.0-py3-none-any.whl", "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr("bench_probe-1.0.dist-info/RECORD", record)


def run(launcher: Path, phase: str) -> tuple[float, str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        NONCE_ENV: secrets.token_hex(16),
    }
    start = time.time()
    proc = subprocess.run(
        [JOB_PYTHON, str(launcher), "--phase", phase],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"launcher failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    first = [line for line in proc.stdout.splitlines() if line.startswith("FIRST ")]
    if phase == "run":
        if not first:
            raise SystemExit(f"the script printed no FIRST line:\n{proc.stdout}\n{proc.stderr}")
        return float(first[0].split()[1]) - start, proc.stdout
    return elapsed, proc.stdout


def summary(name: str, values: list[float], target: float) -> None:
    values_ms = sorted(v * 1000 for v in values)
    median = statistics.median(values_ms)
    p90 = values_ms[int(0.9 * (len(values_ms) - 1))]
    verdict = "ok" if median <= target * 1000 else "OVER TARGET"
    print(
        f"{name:<52} median {median:7.1f} ms  p90 {p90:7.1f} ms  "
        f"min {values_ms[0]:7.1f} ms  (target ≤ {target * 1000:.0f} ms: {verdict})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the launcher switches to a job uid")
    uv = shutil.which("uv")
    root = Path(tempfile.mkdtemp(prefix="posttrain-bench-"))
    os.chmod(root, 0o755)
    try:
        wheels = root / "wheels"
        wheels.mkdir()
        small_wheel(wheels)
        (root / "data").mkdir()

        def config(uid: int | None, venv: str) -> LauncherConfig:
            return LauncherConfig(
                python=JOB_PYTHON,
                data_dir=str(root / "data"),
                venv_dir=venv,
                find_links=(str(wheels),),
                no_index=True,
                uv=uv,
                uid=uid,
                gid=uid,
            )

        # 1. start → first line, venv installed once beforehand.
        venv = str(root / "venv")
        for label, uid in (
            ("configured uid (local backend)", 3_900_000),
            ("unused uid chosen by scanning /proc (HF)", None),
        ):
            launcher = root / "launcher.py"
            launcher.write_text(
                build_launcher(
                    FIRST_LINE, ["bench-probe"], config(uid, venv), python=JOB_PYTHON_VERSION
                )
            )
            if not os.path.exists(venv):
                run(launcher, "install")
            run(launcher, "run")  # warm the page cache
            times = []
            for _ in range(args.runs):
                launcher.write_text(
                    build_launcher(
                        FIRST_LINE, ["bench-probe"], config(uid, venv), python=JOB_PYTHON_VERSION
                    )
                )
                times.append(run(launcher, "run")[0])
            summary(f"start → first line, {label}", times, 0.100)

        # 2. venv + install of one small wheel, warm uv cache.
        installs = []
        for i in range(max(5, args.runs // 2) + 1):
            target = str(root / f"venv-{i}")
            launcher = root / "launcher.py"
            launcher.write_text(
                build_launcher(
                    FIRST_LINE, ["bench-probe"], config(None, target), python=JOB_PYTHON_VERSION
                )
            )
            elapsed, _ = run(launcher, "install")
            if i:  # the first run warms the cache
                installs.append(elapsed)
            shutil.rmtree(target)
        summary("venv + install of one small wheel (warm, uv)", installs, 1.0)
        print(f"python {JOB_PYTHON}, uv {uv}, {args.runs} runs, {sys.platform}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
