"""The tool-calling family, measured: how long the tiny member's grading takes, and how fast the
family's evaluator generates at the Hugging Face member's model size.

    uv run python bench/tool_call.py [--quick]

Runs the family's evaluator exactly as a grader job uploads it (tasks.registry.evaluator_script:
the evaluator kit, the generation kit and the items embedded) in a venv with its pinned
dependencies (torch from this machine's wheel folders; built once under the uv cache's folder):

1. `t1_tool_call_tiny`: its hidden split (200 items, at most 96 new tokens) on the unchanged
   generated base model, which never ends a reply early (every reply is the whole 96 tokens:
   the most a grading can generate), timed in wall seconds and in CPU seconds (the evaluator's
   process and its children: the machine's other load does not count in them);
2. `t1_tool_call`, whose model cannot be downloaded here: the same evaluator code on a model of
   Qwen2.5-0.5B-Instruct's shapes (its config, random bf16 weights, written here) with the tiny
   member's character-level tokenizer and template, the engine setting "auto" (transformers
   here: no GPU), `batch_size` 32 as the member's task.toml, 64 dev items of at most 64 new
   tokens (random weights never end a reply early): generated tokens per second of
   `generation_s` (the generation kit's own timing: decoding alone since the kit's commit
   e5f6223; before it, also loading the model and rendering the prompts) and per CPU second of
   the whole evaluator. From it, the grading's generation on this CPU (400 items x 256 tokens)
   and, beside it, the L4's bound for the same tokens (every decoding step reads the weights
   once: steps x weight bytes / 300 GB/s; prefill at 121 TFLOPS bf16; NVIDIA's datasheet),
   against the member's `score_timeout_s`.

`--quick` (tests): 16 new tokens for the tiny member; 8 items of 4 new tokens for the
Qwen-size run.
"""

from __future__ import annotations

import argparse
import base64
import json
import lzma
import os
import re
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
from tasks.models.tiny_tool_lm import write_tiny_tool_model  # noqa: E402
from tasks.registry import TASKS_DIR, evaluator_script, load_task  # noqa: E402

TINY = load_task("t1_tool_call_tiny")
FULL = load_task("t1_tool_call")
# Qwen/Qwen2.5-0.5B-Instruct's configuration (as bench/arith_tiny.py): random weights, same shapes.
QWEN_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}
# BFCL's simple category: 400 items (tasks/t1_tool_call/evaluator.py, `bfcl_items`), at most
# 256 new tokens each.
FULL_ITEMS = 400
L4_BF16_FLOPS = 121e12
L4_BYTES_PER_S = 300e9
WRITE_QWEN = r"""
import json, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(**json.loads(sys.argv[1]))).to(torch.bfloat16)
model.save_pretrained(sys.argv[2], safe_serialization=True)
print(sum(p.numel() for p in model.parameters()))
"""


def model_python(cache: Path) -> Path:
    venv = cache / "tool-call-bench-venv"
    python = venv / "bin" / "python"
    if python.exists():
        return python
    links = [arg for folder in pip_find_links() for arg in ("--find-links", folder)]
    subprocess.run(["uv", "venv", "-q", "-p", "/usr/bin/python3", str(venv)], check=True)
    deps = script_dependencies(evaluator_script(TINY))
    subprocess.run(["uv", "pip", "install", "-q", "-p", str(python), *links, *deps], check=True)
    return python


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def evaluate(
    python: Path, base: Path, model: Path, work: Path, params: dict, *, hidden: bool, items: int = 0
) -> tuple[dict, float, float]:
    """The evaluator's score-line details, wall seconds and CPU seconds on `model` (with
    `items`, on that many of the tiny member's dev items as the split `bench.jsonl`)."""
    script = work / "evaluator.py"
    assembled = evaluator_script(TINY)
    script.write_text(with_items(assembled, items) if items else assembled)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "bench",
        "POSTTRAIN_MODEL_DIR": str(model),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_TASK_PARAMS": json.dumps(params),
        **({"POSTTRAIN_HIDDEN_SPLIT_SEED": "bench"} if hidden else {}),
    }
    started, cpu = time.monotonic(), children_cpu_s()
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, check=False
    )
    seconds, cpu = time.monotonic() - started, children_cpu_s() - cpu
    reading = read_score(done.stdout.splitlines(), "bench")
    if done.returncode != 0 or not reading.valid:
        raise SystemExit(f"the evaluator gave no valid score: {reading.reason}\n{done.stderr}")
    return reading.details, seconds, cpu


def with_items(script: str, count: int) -> str:
    """The assembled evaluator holding, as `bench.jsonl`, the first `count` dev items of the
    tiny member (encoded as tasks.registry.embedded_files does)."""
    lines = (TASKS_DIR / "t1_tool_call" / "tiny_dev.jsonl").read_bytes().splitlines(keepends=True)
    blob = base64.b85encode(lzma.compress(b"".join(lines[:count]))).decode("ascii")
    line = "EMBEDDED_FILES: dict[str, str] = " + json.dumps({"bench.jsonl": blob})
    return re.sub(r"^EMBEDDED_FILES: dict\[str, str\] = .*$", lambda _: line, script, flags=re.M)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
    python = model_python(cache)
    with tempfile.TemporaryDirectory(prefix="tool-bench-") as folder:
        work = Path(folder)
        base = work / "tiny-tool-lm"
        write_tiny_tool_model(base)
        artifact = work / "tiny-artifact"
        artifact.mkdir()
        (artifact / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes())
        tiny_params = dict(TINY.evaluation)
        if args.quick:
            tiny_params["max_new_tokens"] = 16
        details, wall, cpu = evaluate(python, base, artifact, work, tiny_params, hidden=True)
        print(
            f"t1_tool_call_tiny hidden split: {details['n']} items, "
            f"{details['generated_tokens']} generated tokens (at most "
            f"{tiny_params['max_new_tokens']} each), {wall:.1f} s wall, {cpu:.1f} CPU-s "
            f"(the evaluator's own elapsed_s {details['elapsed_s']:.1f}, generation "
            f"{details['generation_s']:.1f} s) on a machine with load "
            f"{os.getloadavg()[0]:.1f}"
        )

        qwen = work / "qwen-shape"
        shape = {**QWEN_05B}
        done = subprocess.run(
            [str(python), "-c", WRITE_QWEN, json.dumps(shape), str(qwen)],
            capture_output=True,
            text=True,
            check=True,
        )
        parameters = int(done.stdout.split()[-1])
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            (qwen / name).write_bytes((base / name).read_bytes())
        qwen_artifact = work / "qwen-artifact"
        qwen_artifact.mkdir()
        for path in qwen.glob("*.safetensors"):
            os.link(path, qwen_artifact / path.name)
        generation = ("max_new_tokens", "batch_size", "engine", "gpu_memory_utilization")
        full_params = {
            **{key: value for key, value in FULL.evaluation.items() if key in generation},
            "source": "files",
            "files": ["bench.jsonl"],
            "dev_file": "bench.jsonl",
            "hidden_file": "bench.jsonl",
            "max_new_tokens": 4 if args.quick else 64,
        }
        details, wall, cpu = evaluate(
            python,
            qwen,
            qwen_artifact,
            work,
            full_params,
            hidden=False,
            items=8 if args.quick else 64,
        )
        tokens, generation_s = details["generated_tokens"], details["generation_s"]
        per_s, per_cpu_s = tokens / generation_s, tokens / cpu
        weight_bytes = sum(p.stat().st_size for p in qwen.glob("*.safetensors"))
        full_tokens = FULL_ITEMS * int(FULL.evaluation["max_new_tokens"])  # pyright: ignore[reportArgumentType]
        print(
            f"t1_tool_call's evaluator at Qwen2.5-0.5B's size ({parameters:,} parameters, "
            f"{weight_bytes / 1e9:.2f} GB bf16), engine {details['engine']} on "
            f"{details['device']}: {details['n']} items, {tokens} generated tokens in "
            f"{generation_s:.1f} s of generation ({wall:.1f} s wall, {cpu:.1f} CPU-s for the "
            f"whole evaluator): {per_s:.1f} generated tokens/s, {per_cpu_s:.1f} per CPU-s"
        )
        cpu_grading_s = full_tokens / per_s
        steps = int(FULL.evaluation["max_new_tokens"])  # pyright: ignore[reportArgumentType]
        l4_decode_s = steps * weight_bytes / L4_BYTES_PER_S
        prompt_tokens = 600  # a BFCL item with Qwen's tools preamble: a few hundred tokens
        l4_prefill_s = 2 * parameters * prompt_tokens * FULL_ITEMS / L4_BF16_FLOPS
        print(
            f"one grading of t1_tool_call: at most {FULL_ITEMS} x {steps} = {full_tokens} "
            f"generated tokens: {cpu_grading_s / 60:.0f} min at this CPU rate; on the L4 "
            f"(vLLM, all {FULL_ITEMS} prompts in one batch) at least {l4_decode_s:.1f} s of "
            f"decoding (memory bound) and {l4_prefill_s:.1f} s of prefill (compute bound); "
            f"score_timeout_s {FULL.score_timeout_s} s"
        )


if __name__ == "__main__":
    main()
