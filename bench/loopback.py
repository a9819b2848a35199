"""What the loopback-only TCP policy costs (issue 42), as root: the launcher drops to a job uid.

    uv run python bench/loopback.py [--calls 2000] [--rounds 5] [--mib 256] [--steps 300]

Every figure is the same script run on this machine as the one script of the launcher's run
phase (seccomp with the policy on, its supervisor serving the trapped calls; no bubblewrap) and
as a plain process of the same venv's Python (no filter at all), `--repeat` times each,
alternated, and the median taken.

1. trapped set-up calls, µs per call (median of `--rounds` rounds of `--calls` calls): a TCP
   connect to a listener of the script's own on 127.0.0.1 (socket, connect, close), a TCP bind
   to 127.0.0.1:0 (socket, bind, close), an AF_UNIX connect (made by the supervisor's helper as
   the job), and, for scale, socket+close alone (not trapped). The difference is the trap's cost.
2. data: one TCP stream of `--mib` MiB on loopback, MB/s: nothing on the data path is trapped.
3. an all-reduce loop: two processes (torch.multiprocessing), gloo over loopback TCP
   (MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo, as docs/backends.md tells an agent), `--steps`
   all_reduce calls of 1 MiB of float32 after a warm-up; its time under the policy against the
   same loop unfiltered as a ratio (target ≤ 1.10), and init_process_group's time (where the
   trapped calls are).

torch is installed once into the bench's venv from this machine's CPU wheel (pip's find-links,
/opt/wheels on these machines; its dependencies from PyPI through the uv cache).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
import textwrap
from pathlib import Path

from activities.backends.local.backend import python_version
from job_launcher.builder import NONCE_ENV, LauncherConfig, build_launcher
from job_launcher.trusted_lines import LAUNCHER_TAG, trusted_payloads
from posttrain_common.pip_config import pip_find_links

JOB_PYTHON = "/usr/bin/python3"
TORCH = "torch==2.13.0"
RATIO_TARGET = 1.10
SYSTEM_CERTS = "/etc/ssl/certs/ca-certificates.crt"

CALLS = """
import json, os, socket, statistics, sys, threading, time
calls, rounds, mib = CALLS, ROUNDS, MIB
server = socket.create_server(("127.0.0.1", 0), backlog=4096)
address = server.getsockname()
def drain():
    while True:
        conn, _ = server.accept()
        conn.close()
threading.Thread(target=drain, daemon=True).start()
unix_path = os.path.join(os.environ.get("HOME") or "/tmp", "bench.sock")
unix = socket.socket(socket.AF_UNIX); unix.bind(unix_path); unix.listen(4096)
def drain_unix():
    while True:
        conn, _ = unix.accept()
        conn.close()
threading.Thread(target=drain_unix, daemon=True).start()

def tcp_connect():
    with socket.socket() as s:
        s.connect(address)
def tcp_bind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
def unix_connect():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(unix_path)
def socket_only():
    socket.socket().close()

def per_call_us(fn):
    medians = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        medians.append((time.perf_counter_ns() - start) / calls / 1000)
    return statistics.median(medians)

out = {name: per_call_us(fn) for name, fn in (("tcp_connect", tcp_connect),
       ("tcp_bind", tcp_bind), ("unix_connect", unix_connect), ("socket_only", socket_only))}

# One TCP stream on loopback.
sink = socket.create_server(("127.0.0.1", 0))
total = mib << 20
got = [0]
def receive():
    conn, _ = sink.accept()
    buf = bytearray(1 << 20)
    while got[0] < total:
        n = conn.recv_into(buf)
        if not n:
            break
        got[0] += n
    conn.close()
reader = threading.Thread(target=receive); reader.start()
chunk = b"x" * (1 << 20)
with socket.create_connection(sink.getsockname()) as s:
    start = time.perf_counter()
    for _ in range(mib):
        s.sendall(chunk)
    reader.join()
    out["stream_mb_s"] = total / 1e6 / (time.perf_counter() - start)
print("BENCH " + json.dumps(out), flush=True)
"""

ALL_REDUCE = """
import json, os, socket, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank, port, steps, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    init_s = time.perf_counter() - start
    tensor = torch.ones(1 << 18)  # 1 MiB of float32
    for _ in range(10):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        dist.all_reduce(tensor)
    loop_s = time.perf_counter() - start
    queue.put({"rank": rank, "init_s": init_s, "loop_s": loop_s})
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(port, STEPS, queue), nprocs=2)
    ranks = [queue.get() for _ in range(2)]
    print("BENCH " + json.dumps({"init_s": max(r["init_s"] for r in ranks),
                                 "loop_s": max(r["loop_s"] for r in ranks)}), flush=True)
"""


def torch_wheels() -> list[str]:
    folders = [f for f in pip_find_links() if any(Path(f).glob("torch-2.13.0+cpu-*.whl"))]
    if not folders:
        raise SystemExit("no CPU build of torch 2.13.0 in pip's find-links (/opt/wheels here)")
    return folders


def bench_line(stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH ") :])
    raise SystemExit(f"the bench script printed nothing:\n{stdout[-3000:]}\n{stderr[-3000:]}")


class Runner:
    """Builds the launcher around a script and runs it with the policy, or runs it bare."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        (root / "data").mkdir(mode=0o755)
        self.config = LauncherConfig(
            python=JOB_PYTHON,
            data_dir=str(root / "data"),
            venv_dir=str(self.venv),
            find_links=tuple(torch_wheels()),
            uv=shutil.which("uv"),
        )

    def launcher(self, script: str, packages: list[str]) -> Path:
        path = self.root / "launcher.py"
        text = build_launcher(script, packages, self.config, python=python_version(JOB_PYTHON))
        path.write_text(text)
        return path

    def install(self) -> None:
        nonce = secrets.token_hex(16)
        path = self.launcher("print('installed')\n", [TORCH])
        env = {"PATH": os.environ["PATH"], "HOME": "/root", NONCE_ENV: nonce}
        # uv checks PyPI's certificate against these (pip's configured `cert` on these machines).
        env["SSL_CERT_FILE"] = os.environ.get("SSL_CERT_FILE", SYSTEM_CERTS)
        done = subprocess.run(
            [JOB_PYTHON, str(path), "--phase", "install"], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"installing torch failed:\n{done.stdout[-3000:]}")

    def under_policy(self, script: str) -> dict:
        nonce = secrets.token_hex(16)
        path = self.launcher(script, [TORCH])
        env = {"PATH": os.environ["PATH"], NONCE_ENV: nonce, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [JOB_PYTHON, str(path), "--phase", "run"], env=env, capture_output=True, text=True
        )
        lines = trusted_payloads(done.stdout.splitlines(), LAUNCHER_TAG, nonce)
        sandbox = next((p for p in lines if p.get("stage") == "sandbox"), {})
        if sandbox.get("loopback_tcp") is not True:
            raise SystemExit(f"the loopback policy is off here: {sandbox or lines}")
        return bench_line(done.stdout, done.stderr)

    def alternating(self, script: str, repeat: int) -> tuple[dict, dict]:
        """`repeat` runs of each side, one after the other (a shared machine's load moves), and
        the median of each figure."""
        runs: dict[str, list[dict]] = {"policy": [], "bare": []}
        for _ in range(repeat):
            runs["policy"].append(self.under_policy(script))
            runs["bare"].append(self.unfiltered(script))
        policy, bare = (
            {key: statistics.median(run[key] for run in runs[side]) for key in runs[side][0]}
            for side in ("policy", "bare")
        )
        return policy, bare

    def unfiltered(self, script: str) -> dict:
        folder = Path(tempfile.mkdtemp(dir=self.root))
        (folder / "script.py").write_text(script)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [str(self.venv / "bin" / "python"), str(folder / "script.py")],
            env=env,
            capture_output=True,
            text=True,
            cwd=folder,
        )
        return bench_line(done.stdout, done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description="What the loopback-only TCP policy costs.")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, alternated")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the launcher switches to a job uid")
    root = Path(tempfile.mkdtemp(prefix="posttrain-bench-loopback-"))
    os.chmod(root, 0o755)
    try:
        runner = Runner(root)
        runner.install()
        calls = textwrap.dedent(CALLS)
        for name, value in (("CALLS", args.calls), ("ROUNDS", args.rounds), ("MIB", args.mib)):
            calls = calls.replace(name, str(value), 1)
        policy, bare = runner.alternating(calls, args.repeat)
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1 and 5 min)")
        print(
            f"{'per call (µs, median of rounds)':<36} {'policy':>9} {'unfiltered':>11} {'added':>9}"
        )
        for key, label in (
            ("tcp_connect", "TCP connect to 127.0.0.1 (trapped)"),
            ("tcp_bind", "TCP bind to 127.0.0.1:0 (trapped)"),
            ("unix_connect", "AF_UNIX connect (trapped, helper)"),
            ("socket_only", "socket + close (not trapped)"),
        ):
            added = policy[key] - bare[key]
            print(f"{label:<36} {policy[key]:9.1f} {bare[key]:11.1f} {added:9.1f}")
        ratio = bare["stream_mb_s"] / policy["stream_mb_s"]
        print(
            f"TCP stream on loopback, {args.mib} MiB: policy {policy['stream_mb_s']:.0f} MB/s, "
            f"unfiltered {bare['stream_mb_s']:.0f} MB/s (time ratio {ratio:.2f})"
        )
        loop = ALL_REDUCE.replace("STEPS", str(args.steps))
        policy, bare = runner.alternating(loop, args.repeat)
        ratio = policy["loop_s"] / bare["loop_s"]
        verdict = "ok" if ratio <= RATIO_TARGET else "OVER TARGET"
        print(
            f"gloo all_reduce, 2 processes, 1 MiB x {args.steps}: policy {policy['loop_s']:.3f} s, "
            f"unfiltered {bare['loop_s']:.3f} s: ratio {ratio:.3f} "
            f"(target ≤ {RATIO_TARGET:.2f}: {verdict})"
        )
        print(
            f"init_process_group (TCPStore and gloo's connects): policy {policy['init_s']:.3f} s, "
            f"unfiltered {bare['init_s']:.3f} s"
        )
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1 and 5 min)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
