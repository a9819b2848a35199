"""The arithmetic-format family, measured: does the tiny member learn, how long does it take,
and what does an evaluation of the Hugging Face member cost.

    uv run python bench/arith_tiny.py [--quick]

Runs in a venv with the evaluator's pinned dependencies (torch from this machine's wheel
folders, pip's `find-links`; built once under the uv cache's folder and reused):

1. the tiny member (`t0_arithmetic_format_tiny`): the family's reference solution trains the
   generated base model on the CPU (training wall time); the family's evaluator scores the
   unchanged base and the trained checkpoint on the dev split (wall time, items per second);
2. the Hugging Face member (`t0_arithmetic_format`): a CPU dry run of its evaluation at the real
   model's size (Qwen2.5-0.5B's configuration with random weights, prompts as long as its chat
   template makes them, `max_new_tokens` as the task sets it), giving generated tokens per second
   on this CPU, and from it the tokens one grading generates and the time it takes.

`--quick` (tests) caps training at 20 s and makes the dry run one small batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from job_launcher.requirements import script_dependencies  # noqa: E402
from job_launcher.trusted_lines import read_score  # noqa: E402
from posttrain_env.pip_config import pip_find_links  # noqa: E402
from tasks.registry import TASKS_DIR, evaluator_script, load_task  # noqa: E402
from tasks.tiny_arith_model import write_tiny_arith_model  # noqa: E402

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

DRY_RUN = r"""
import json, sys, time, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
shape, batch, new, prompt, batches = json.loads(sys.argv[1]), *map(int, sys.argv[2:6])
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16).eval()
ids = torch.randint(100, 1000, (batch, prompt))
with torch.inference_mode():
    model.generate(ids[:2, :8], max_new_tokens=2, do_sample=False)  # warm up
    started = time.monotonic()
    for _ in range(batches):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False)
    print(json.dumps({"seconds": time.monotonic() - started, "tokens": batches * batch * new}))
"""


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


def evaluate(python: Path, base: Path, model: Path, work: Path) -> tuple[float, float]:
    """(dev score, seconds) of the family's evaluator on `model`."""
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
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, check=True
    )
    seconds = time.monotonic() - started
    reading = read_score(done.stdout.splitlines(), "bench")
    if not reading.valid:
        raise SystemExit(f"the evaluator gave no valid score: {reading.reason}\n{done.stderr}")
    return reading.score, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short check that it runs (tests)")
    args = parser.parse_args()
    cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv").parent
    python = model_python(cache)
    lines = [f"{os.cpu_count()} cores; torch from {', '.join(pip_find_links())}"]
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
        started = time.monotonic()
        subprocess.run(
            [str(python), str(REFERENCE), str(base), str(trained)],
            env=env,
            check=True,
            capture_output=True,
        )
        train_s = time.monotonic() - started
        base_score, base_s = evaluate(python, base, copy, work)
        trained_score, trained_s = evaluate(python, base, trained, work)
        items = TINY.evaluation["dev_items"]
        lines += [
            "t0_arithmetic_format_tiny (dev split, "
            f"{items} items, {TINY.evaluation['max_new_tokens']} new tokens):",
            f"  base model      score {base_score:.2f}   evaluation {base_s:6.1f} s",
            f"  reference       score {trained_score:.2f}   evaluation {trained_s:6.1f} s "
            f"({items / trained_s:.1f} items/s, model loading included)",
            f"  training        {train_s:6.1f} s wall (reference solution, CPU)",
        ]
        params = FULL.evaluation
        batch, new = params["batch_size"], params["max_new_tokens"]
        batches = 2
        if args.quick:
            batch, new, batches = 4, 4, 1
        done = subprocess.run(
            [
                str(python),
                "-c",
                DRY_RUN,
                json.dumps(QWEN_05B),
                str(batch),
                str(new),
                str(QWEN_PROMPT_TOKENS),
                str(batches),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        per_s = measured["tokens"] / measured["seconds"]
        graded = params["hidden_items"]
        tokens = graded * new
        lines += [
            "t0_arithmetic_format (Qwen2.5-0.5B shapes, random weights, bf16, CPU dry run):",
            f"  {per_s:.0f} generated tokens/s on this CPU at batch {batch}",
            f"  one grading: {graded} items x {new} new tokens = {tokens} tokens "
            f"(+ {graded * QWEN_PROMPT_TOKENS} prompt tokens): "
            f"{tokens / per_s / 60:.1f} min on this CPU",
            f"  score_timeout_s {FULL.score_timeout_s}, eval_timeout_minutes "
            f"{FULL.eval_timeout_minutes} on {FULL.eval_flavor}",
        ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
