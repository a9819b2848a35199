"""What needs a GPU, in one command (issue 42): both real members graded with each engine, and a
two-GPU DDP job, under the job launcher with its loopback-only TCP policy. Run as root.

    uv run python scripts/gpu_check.py [--members t1_tool_call,math_word_problems]
        [--engines transformers,vllm] [--gpus 2] [--keep DIR]
    uv run python scripts/gpu_check.py --cpu     (the same on a machine without a GPU: the
        members' tiny twins with transformers, and the DDP job with gloo on two CPU processes)

NEEDS A GPU MACHINE (Linux, CUDA driver, root) AND THE INTERNET: the evaluators' pinned packages
(CUDA torch, transformers, vLLM: some GB) come from PyPI, the base model from the Hub at the
member's pinned revision (public: no token), and each member's data must have been fetched
first (`posttrain-env tasks fetch <member>`). Nothing is spent: it runs on this machine.

Every job is what a grader or an agent job runs on Hugging Face: the one launcher file, `--phase
all` (wheels only, then seccomp, fds closed, an unused uid, HF_HUB_OFFLINE=1), with no
bubblewrap around it (the local backend's sandbox has no GPU devices). For each member and
engine it grades the base model's own weights as the artifact on the hidden split, with the
task's parameters and `engine` set, and prints the score, the engine that ran, the decoding's
tokens/s and the job's wall time. Then a DDP job: torch from PyPI, `--gpus` processes, one GPU
each, NCCL whose bootstrap goes over loopback TCP (MASTER_ADDR=127.0.0.1, NCCL_SOCKET_IFNAME=lo,
GLOO_SOCKET_IFNAME=lo, as docs/backends.md tells an agent), a few training steps of a small MLP
and a checkpoint written to its outputs folder (/data/outputs/ on Hugging Face); it prints
steps/s and all_reduce bus GB/s. Each job's line says `loopback_tcp` as its launcher's trusted
line did. Exit status 1 when a job failed, a score line is missing or the policy was off.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from activities.backends.local.backend import python_version  # noqa: E402
from job_launcher.builder import LauncherConfig, build_launcher  # noqa: E402
from job_launcher.requirements import script_exclude_newer  # noqa: E402
from job_launcher.trusted_lines import (  # noqa: E402
    LAUNCHER_TAG,
    NONCE_ENV,
    read_score,
    trusted_payloads,
)
from posttrain_common.pip_config import pip_find_links  # noqa: E402
from tasks.evaluator_kit import BASE_DIR_ENV, HIDDEN_SEED_ENV, MODEL_DIR_ENV  # noqa: E402
from tasks.registry import evaluator_script, generated_model, load_task  # noqa: E402

JOB_PYTHON = "/usr/bin/python3"
TASK_PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
SYSTEM_CERTS = "/etc/ssl/certs/ca-certificates.crt"
MEMBERS = ("t1_tool_call", "math_word_problems")

DDP = """
# /// script
# dependencies = [TORCH]
# ///
import json, os, socket, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
# The launcher runs the script in its data dir (/data on Hugging Face): outputs/ is the artifact.
CHECKPOINT = os.path.join(os.getcwd(), "outputs", "ddp.pt")

def rank_main(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      NCCL_SOCKET_IFNAME="lo")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    start = time.perf_counter()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    init_s = time.perf_counter() - start
    width = 4096 if cuda else 256
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(4)]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers).to(device), device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=device)
    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    sync()
    steps_s = STEPS / (time.perf_counter() - start)
    tensor = torch.ones((256 << 20) // 4 if cuda else (8 << 20) // 4, device=device)
    dist.all_reduce(tensor)
    sync()
    start = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(tensor)
    sync()
    seconds = (time.perf_counter() - start) / 10
    bus_gb_s = tensor.numel() * 4 * 2 * (world - 1) / world / seconds / 1e9
    if rank == 0:
        torch.save(model.module.state_dict(), CHECKPOINT)
    queue.put({"rank": rank, "init_s": init_s, "steps_s": steps_s, "bus_gb_s": bus_gb_s,
               "device": str(device)})
    dist.destroy_process_group()

if __name__ == "__main__":
    world = WORLD
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(world, port, queue), nprocs=world)
    ranks = sorted((queue.get() for _ in range(world)), key=lambda r: r["rank"])
    print("DDP " + json.dumps({"ranks": ranks,
                               "checkpoint_bytes": os.path.getsize(CHECKPOINT)}))
"""


@dataclass
class Job:
    """One launcher run: its trusted lines, stdout and wall time."""

    returncode: int
    stdout: str
    stderr: str
    nonce: str
    seconds: float

    @property
    def sandbox(self) -> dict:
        lines = trusted_payloads(self.stdout.splitlines(), LAUNCHER_TAG, self.nonce)
        return next((p for p in lines if p.get("stage") == "sandbox"), {})


class Launcher:
    """Runs scripts as the one file of a job under the launcher, in folders of `root`."""

    def __init__(self, root: Path, find_links: tuple[str, ...]) -> None:
        self.root = root
        self.find_links = find_links
        self.count = 0

    def run(self, script: str, env: dict[str, str], pass_env: tuple[str, ...] = ()) -> Job:
        """`script` under the launcher (`--phase all`), its header's exclude-newer honoured as
        the backends honour an evaluator's; `env` added to the launcher's, `pass_env` the
        names the script may see."""
        self.count += 1
        folder = self.root / f"job-{self.count}"
        (folder / "data").mkdir(parents=True)
        for path in (folder, folder / "data"):
            os.chmod(path, 0o755)
        config = LauncherConfig(
            python=JOB_PYTHON,
            data_dir=str(folder / "data"),
            find_links=self.find_links,
            uv=shutil.which("uv"),
            pass_env=pass_env,
            exclude_newer=script_exclude_newer(script),
        )
        launcher = folder / "launcher.py"
        launcher.write_text(build_launcher(script, [], config, python=python_version(JOB_PYTHON)))
        nonce = secrets.token_hex(16)
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE", SYSTEM_CERTS),
            NONCE_ENV: nonce,
            **{k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES",) if k in os.environ},
            **env,
        }
        start = time.monotonic()
        done = subprocess.run(
            [JOB_PYTHON, str(launcher), "--phase", "all"],
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
        )
        return Job(done.returncode, done.stdout, done.stderr, nonce, time.monotonic() - start)


def base_model(member: str, cpu: bool, root: Path) -> tuple[str, Path]:
    """The member's task id here and its base model's folder: the tiny twin's, generated here
    (--cpu), or the real member's, downloaded from the Hub at its pinned revision."""
    task_id = f"{member}_tiny" if cpu else member
    spec = load_task(task_id)
    folder = root / "models" / task_id
    if cpu:
        generate = generated_model(spec.base_model.local or "")
        if generate is None:
            raise SystemExit(f"{task_id} has no generated base model")
        generate(folder)
    else:
        from huggingface_hub import snapshot_download

        snapshot_download(
            spec.base_model.repo_id, revision=spec.base_model.revision, local_dir=folder
        )
    for path in (folder, *folder.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return task_id, folder


def grade(launcher: Launcher, task_id: str, base: Path, engine: str) -> tuple[bool, str]:
    spec = load_task(task_id)
    params = {**spec.evaluation, "engine": engine}
    # The header pins what `engine` needs: vLLM for "vllm" (or "auto").
    script = evaluator_script(spec.model_copy(update={"evaluation": params}))
    env = {
        TASK_PARAMS_ENV: json.dumps(params),
        MODEL_DIR_ENV: str(base),  # the base model's own weights as the artifact
        BASE_DIR_ENV: str(base),
        HIDDEN_SEED_ENV: secrets.token_hex(8),
    }
    job = launcher.run(script, env, pass_env=(NONCE_ENV, *env))
    reading = read_score(job.stdout.splitlines(), job.nonce)
    details = reading.details if reading.valid else {}
    tokens, decoding = details.get("generated_tokens", 0), details.get("generation_s") or 0
    rate = f"{tokens / decoding:,.0f} tokens/s" if decoding else "no decoding time"
    ok = job.returncode == 0 and reading.valid and job.sandbox.get("loopback_tcp") is True
    line = (
        f"{task_id:<24} engine {engine:<12} ran {details.get('engine', '-'):<12} "
        f"score {reading.score if reading.valid else '-'}  {tokens} tokens, {rate}, "
        f"job {job.seconds:.1f} s, device {details.get('device', '-')}, "
        f"loopback_tcp {job.sandbox.get('loopback_tcp')}"
    )
    if not ok:
        line += f"\n    FAILED (exit {job.returncode}): {job.stderr.strip()[-600:]}"
    return ok, line


def ddp(launcher: Launcher, gpus: int, cpu: bool) -> tuple[bool, str]:
    torch = '"torch==2.13.0"' if cpu else '"torch"'
    script = DDP.replace("TORCH", torch).replace("WORLD", str(gpus)).replace("STEPS", "20")
    job = launcher.run(script, {})
    report = next((json.loads(x[4:]) for x in job.stdout.splitlines() if x.startswith("DDP ")), {})
    ok = job.returncode == 0 and bool(report) and job.sandbox.get("loopback_tcp") is True
    if report:
        ranks = report["ranks"]
        line = (
            f"DDP, {gpus} processes on {', '.join(r['device'] for r in ranks)}: "
            f"{min(r['steps_s'] for r in ranks):.1f} steps/s, all_reduce "
            f"{min(r['bus_gb_s'] for r in ranks):.2f} GB/s (bus), init_process_group "
            f"{max(r['init_s'] for r in ranks):.2f} s, checkpoint {report['checkpoint_bytes']} "
            f"bytes, job {job.seconds:.1f} s, loopback_tcp {job.sandbox.get('loopback_tcp')}"
        )
    else:
        line = f"DDP, {gpus} processes: no report, loopback_tcp {job.sandbox.get('loopback_tcp')}"
    if not ok:
        line += f"\n    FAILED (exit {job.returncode}): {job.stderr.strip()[-600:]}"
    return ok, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Both real members graded with each engine, and a DDP job."
    )
    parser.add_argument("--members", default=",".join(MEMBERS))
    parser.add_argument("--engines", default=None, help="default: transformers,vllm (--cpu: "
                        "transformers)")  # fmt: skip
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="the tiny twins and gloo, no GPU")
    parser.add_argument("--keep", type=Path, default=None, help="keep the jobs' folders here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the launcher switches every job to an unused uid")
    engines = (args.engines or ("transformers" if args.cpu else "transformers,vllm")).split(",")
    # --cpu: torch's CPU build from pip's find-links (/opt/wheels on the project's machines).
    find_links = tuple(pip_find_links()) if args.cpu else ()
    root = args.keep or Path(tempfile.mkdtemp(prefix="posttrain-gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    launcher = Launcher(root, find_links)
    results = []
    try:
        for member in args.members.split(","):
            task_id, base = base_model(member, args.cpu, root)
            for engine in engines:
                ok, line = grade(launcher, task_id, base, engine)
                print(line, flush=True)
                results.append(ok)
        ok, line = ddp(launcher, args.gpus, args.cpu)
        print(line, flush=True)
        results.append(ok)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
