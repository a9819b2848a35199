"""The arithmetic-format family, measured: does the tiny member learn, how long does it take,
and what does an evaluation of the Hugging Face member cost on its eval flavor.

    uv run python bench/arith_tiny.py [--quick]

Runs in a venv with the evaluator's pinned dependencies (torch from this machine's wheel
folders, pip's `find-links`; built once under the uv cache's folder and reused):

1. the tiny member (`t0_arithmetic_format_tiny`): the family's reference solution trains the
   generated base model on the CPU (training wall time); the family's evaluator scores the
   unchanged base and the trained checkpoint on the dev split (wall time, items per second);
2. the Hugging Face member (`t0_arithmetic_format`), whose evaluation cannot run here (no GPU,
   no download of Qwen2.5-0.5B): a CPU dry run at the real model's size (its configuration with
   random weights, bf16, prompts as long as its chat template makes them, the task's batch and
   `max_new_tokens`), one thread, timed in CPU seconds so that the machine's other load does
   not count. From it, the tokens one dev evaluation and one grading generate and their cost on
   the eval flavor (`l4x1`, one NVIDIA L4):

       compute   the dry run's CPU seconds x (this CPU's measured bf16 matmul rate / the L4's
                 dense bf16 peak, 121 TFLOPS, NVIDIA L4 datasheet): the GPU at its peak;
       memory    every decoding step reads the weights once: steps x weight bytes / 300 GB/s
                 (the L4's memory bandwidth, same datasheet);
       host      steps x the time one decoding step takes to drive: measured here with the same
                 24 layers at a tiny width (the Python and per-operation dispatch that a GPU does
                 not remove); the GPU cannot step faster than that;
       checks    the value check's NaN/inf pass over the base model's and the artifact's weights
                 (measured here on the real-size model, in memory), and imports (measured here);

   added up (no overlap assumed: an upper estimate), beside a stated allowance for what this
   machine cannot measure (the job's start on Hugging Face, the install of the CUDA build of
   torch, reading the weights from disk), against `eval_timeout_minutes` and `score_timeout_s`.

`--quick` (tests) caps training at 20 s and makes the dry run one small batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from job_launcher.requirements import script_dependencies  # noqa: E402
from job_launcher.trusted_lines import read_score  # noqa: E402
from posttrain_common.pip_config import pip_find_links  # noqa: E402
from posttrain_env.models import TaskSpec  # noqa: E402
from tasks.models.tiny_arith_lm import write_tiny_arith_model  # noqa: E402
from tasks.registry import TASKS_DIR, evaluator_script, load_task  # noqa: E402

TINY = load_task("t0_arithmetic_format_tiny")
FULL = load_task("t0_arithmetic_format")
REFERENCE = TASKS_DIR / "t0_arithmetic_format" / "reference_solution.py"
# Qwen/Qwen2.5-0.5B-Instruct's configuration (config.json of the Hub repo); the bench cannot
# download the model, so it measures the same shapes with random weights.
QWEN_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
# Its chat template wraps a question in a default system prompt: about 45 tokens per prompt.
QWEN_PROMPT_TOKENS = 45
# NVIDIA L4 datasheet: 121 TFLOPS dense bf16 (242 with sparsity), 300 GB/s of GDDR6.
L4_BF16_FLOPS = 121e12
L4_BYTES_PER_S = 300e9
# Not measurable here: a Hugging Face job's start on l4x1, the install of the CUDA build of
# torch with its NVIDIA libraries (a few GB of wheels from PyPI) into the job's venv, and
# reading the weights from the job's disk (~1 GB three times: the base model's check, the
# artifact's, the model run's). An allowance, not a measurement: ten minutes.
START_AND_INSTALL_ALLOWANCE_S = 600
# A timeout below this many times the expected cost is flagged.
TIMEOUT_MARGIN = 2.0

DRY_RUN = r"""
import json, sys, time, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
shape, batch, new, prompt, batches = json.loads(sys.argv[1]), *map(int, sys.argv[2:6])
torch.set_num_threads(1)  # one core, timed in CPU seconds: the machine's other load aside
torch.manual_seed(0)


def cpu(work):
    started = time.process_time()
    work()
    return time.process_time() - started


# This CPU's bf16 matmul rate at the model's MLP shape and the task's batch.
hidden, inner = shape["hidden_size"], shape["intermediate_size"]
a = torch.randn(batch, hidden).to(torch.bfloat16)
b = torch.randn(hidden, inner).to(torch.bfloat16)
a @ b
rounds = 20
flops = 2 * batch * hidden * inner * rounds
matmul_flops_per_s = flops / cpu(lambda: [a @ b for _ in range(rounds)])

model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16).eval()
weights = list(model.parameters())  # the tied embedding once, as the checkpoint stores it
weight_bytes = sum(t.numel() * t.element_size() for t in weights)
ids = torch.randint(100, 1000, (batch, prompt))
with torch.inference_mode():
    finite_s = cpu(lambda: [bool(torch.isfinite(t).all()) for t in weights])
    model.generate(ids[:2, :8], max_new_tokens=2, do_sample=False)  # warm up
    started = time.monotonic()
    generate_s = cpu(lambda: [
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False)
        for _ in range(batches)
    ])
    wall_s = time.monotonic() - started
    # Driving one decoding step: the same 24 layers at a tiny width, one sequence.
    thin = Qwen2ForCausalLM(Qwen2Config(**{**shape, "vocab_size": 1024, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}))
    thin = thin.to(torch.bfloat16).eval()
    one = torch.randint(100, 1000, (1, prompt))
    thin.generate(one, max_new_tokens=2, do_sample=False)
    steps = 64
    host_s = cpu(lambda: thin.generate(one, attention_mask=torch.ones_like(one),
        max_new_tokens=steps, min_new_tokens=steps, do_sample=False)) / steps
print(json.dumps({
    "cpu_s": generate_s, "wall_s": wall_s, "tokens": batches * batch * new,
    "steps": batches * new, "matmul_flops_per_s": matmul_flops_per_s,
    "weight_bytes": weight_bytes, "finite_s": finite_s, "host_step_s": host_s,
}))
"""
IMPORTS = "import time; s = time.process_time(); import torch, transformers, safetensors.torch; "
IMPORTS += "from transformers import AutoModelForCausalLM; print(time.process_time() - s)"


def model_python(cache: Path) -> Path:
    venv = cache / "arith-bench-venv"
    python = venv / "bin" / "python"
    if python.exists():
        return python
    links = [arg for folder in pip_find_links() for arg in ("--find-links", folder)]
    subprocess.run(["uv", "venv", "-q", "-p", "/usr/bin/python3", str(venv)], check=True)
    deps = script_dependencies(evaluator_script(TINY))
    subprocess.run(["uv", "pip", "install", "-q", "-p", str(python), *links, *deps], check=True)
    return python


def children_cpu_s() -> float:
    """CPU seconds used so far by this process's finished children (the machine's other load
    does not count in them, unlike in wall time)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def evaluate(python: Path, base: Path, model: Path, work: Path) -> tuple[float, float, float]:
    """(dev score, seconds, CPU seconds) of the family's evaluator on `model`."""
    script = work / "evaluator.py"
    script.write_text(evaluator_script(TINY))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "bench",
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps(TINY.evaluation),
    }
    started, cpu = time.monotonic(), children_cpu_s()
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, check=True
    )
    seconds, cpu = time.monotonic() - started, children_cpu_s() - cpu
    reading = read_score(done.stdout.splitlines(), "bench")
    if not reading.valid:
        raise SystemExit(f"the evaluator gave no valid score: {reading.reason}\n{done.stderr}")
    return reading.score, seconds, cpu


def count(task: TaskSpec, key: str) -> int:
    """An integer of the task's [evaluation] table."""
    value = task.evaluation[key]
    assert isinstance(value, int), f"{task.id}: {key} is not an integer"
    return value


def hf_member_cost(python: Path, env: dict[str, str], *, quick: bool) -> list[str]:
    """The dry run at Qwen2.5-0.5B's size and the Hugging Face member's expected cost."""
    full_batch, new_tokens = count(FULL, "batch_size"), count(FULL, "max_new_tokens")
    batch, new = full_batch, new_tokens
    batches = 2
    if quick:
        batch, new, batches = 4, 4, 1
    args = [json.dumps(QWEN_05B), str(batch), str(new), str(QWEN_PROMPT_TOKENS), str(batches)]
    done = subprocess.run(
        [str(python), "-c", DRY_RUN, *args], env=env, check=True, capture_output=True, text=True
    )
    m = json.loads(done.stdout.strip().splitlines()[-1])
    imports = subprocess.run(
        [str(python), "-c", IMPORTS], env=env, check=True, capture_output=True, text=True
    )
    import_s = float(imports.stdout.strip().splitlines()[-1])
    per_s = m["tokens"] / m["cpu_s"]
    cpu_per_step = m["cpu_s"] / m["steps"]  # at the dry run's batch, prefill included
    factor = m["matmul_flops_per_s"] / L4_BF16_FLOPS
    lines = [
        "t0_arithmetic_format (Qwen2.5-0.5B shapes, random weights, bf16, CPU dry run, 1 thread):",
        f"  {per_s:.0f} generated tokens/s per CPU-second at batch {batch} "
        f"({m['tokens']} tokens: {m['cpu_s']:.1f} CPU-s, {m['wall_s']:.1f} s wall)",
        f"  this CPU: {m['matmul_flops_per_s'] / 1e9:.0f} GFLOPS bf16 matmul per core; "
        f"L4 {L4_BF16_FLOPS / 1e12:.0f} TFLOPS dense bf16: factor 1/{1 / factor:.0f}",
        f"  driving one decoding step (24 layers): {m['host_step_s'] * 1e3:.1f} ms; "
        f"NaN/inf pass over {m['weight_bytes'] / 1e9:.2f} GB of weights: {m['finite_s']:.1f} "
        f"CPU-s; importing torch and transformers: {import_s:.1f} CPU-s",
    ]
    for label, items, timeout_s in (
        ("one dev evaluation", count(FULL, "dev_items"), FULL.eval_timeout_minutes * 60),
        ("one grading", count(FULL, "hidden_items"), FULL.score_timeout_s),
    ):
        steps = math.ceil(items / full_batch) * new_tokens
        tokens = items * new_tokens
        on_cpu = steps * cpu_per_step * (full_batch / batch)  # the dry run's rate, scaled to 64
        compute_s = on_cpu * factor
        memory_s = steps * m["weight_bytes"] / L4_BYTES_PER_S
        host_s = steps * m["host_step_s"]
        checks_s = 2 * m["finite_s"] + import_s  # base model and artifact; then the imports
        run_s = compute_s + memory_s + host_s + checks_s
        expected_s = run_s + START_AND_INSTALL_ALLOWANCE_S
        margin = timeout_s / expected_s
        lines += [
            f"  {label}: {items} items x {new_tokens} new tokens = {tokens} tokens "
            f"(+ {items * QWEN_PROMPT_TOKENS} prompt tokens), {steps} decoding steps: "
            f"{on_cpu / 60:.1f} min on one core of this CPU",
            f"    on {FULL.eval_flavor}: compute {compute_s:.1f} s + memory {memory_s:.1f} s"
            f" + host {host_s:.1f} s + checks and imports {checks_s:.1f} s = {run_s:.0f} s; with "
            f"{START_AND_INSTALL_ALLOWANCE_S} s allowed for the job's start, torch's install "
            "and reading the weights: "
            f"{expected_s / 60:.1f} min against a timeout of {timeout_s / 60:.0f} min "
            f"({margin:.1f}x){'' if margin >= TIMEOUT_MARGIN else '  <-- below the margin'}",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short check that it runs (tests)")
    args = parser.parse_args()
    cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv").parent
    python = model_python(cache)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"{os.cpu_count()} cores, load average {load}; torch from {', '.join(pip_find_links())}"
    ]
    with tempfile.TemporaryDirectory(prefix="arith-bench-") as tmp:
        work = Path(tmp)
        base, trained = work / "base", work / "trained"
        write_tiny_arith_model(base)
        copy = work / "copy"
        copy.mkdir()
        (copy / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes())
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if args.quick:
            env["MAX_TRAIN_SECONDS"] = "20"
        started, cpu = time.monotonic(), children_cpu_s()
        subprocess.run(
            [str(python), str(REFERENCE), str(base), str(trained)],
            env=env,
            check=True,
            capture_output=True,
        )
        train_s, train_cpu = time.monotonic() - started, children_cpu_s() - cpu
        base_score, base_s, base_cpu = evaluate(python, base, copy, work)
        trained_score, trained_s, trained_cpu = evaluate(python, base, trained, work)
        items = count(TINY, "dev_items")
        lines += [
            "t0_arithmetic_format_tiny (dev split, "
            f"{items} items, {TINY.evaluation['max_new_tokens']} new tokens):",
            f"  base model      score {base_score:.2f}   evaluation {base_s:6.1f} s wall, "
            f"{base_cpu:.1f} CPU-s",
            f"  reference       score {trained_score:.2f}   evaluation {trained_s:6.1f} s wall, "
            f"{trained_cpu:.1f} CPU-s ({items / trained_s:.1f} items/s, model loading included)",
            f"  training        {train_s:6.1f} s wall, {train_cpu:.1f} CPU-s (reference "
            "solution, CPU)",
        ]
        lines += hf_member_cost(python, env, quick=args.quick)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
