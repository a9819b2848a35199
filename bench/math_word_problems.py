"""The math word problems family, measured with its own evaluator (the generation kit's
transformers engine on the CPU, the code path a GPU flavor runs with `engine = "transformers"`
or as the fallback of "auto"):

    uv run python bench/math_word_problems.py [--quick]

1. the tiny member (`math_word_problems_tiny`): one grading of the unchanged base model on the
   hidden split (200 problems), as a grader job runs it: wall seconds, CPU seconds (this
   process's children: the machine's other load does not count), generated tokens per second;
2. the GSM8K member's model size: the same evaluator on a model with Qwen2.5-0.5B-Instruct's
   layers (24 layers, hidden 896, MLP 4864, 14 heads, 2 KV heads; random bf16 weights; the tiny
   models' one-character tokenizer, so its vocabulary and output layer are small: the real
   model's 151,936 x 896 output layer adds about 38% to the compute per token), decoding 64 new
   tokens for each of 16 problems in one batch: generated tokens per second on this CPU.

What a GPU does with it is stated in tasks/math_word_problems/task.toml (no GPU here).
`--quick` (tests) keeps both parts small.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from job_launcher.requirements import script_dependencies  # noqa: E402
from job_launcher.trusted_lines import read_score  # noqa: E402
from posttrain_common.pip_config import pip_find_links  # noqa: E402
from tasks.evaluator_kit import write_safetensors  # noqa: E402
from tasks.models import tiny_math_lm  # noqa: E402
from tasks.models._llama import LlamaSize, write_json  # noqa: E402
from tasks.registry import evaluator_script, load_task  # noqa: E402

TINY = load_task("math_word_problems_tiny")
QWEN_LAYERS = LlamaSize(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2)


def model_python(cache: Path) -> Path:
    """A venv with the evaluator's pinned dependencies (torch from this machine's wheels)."""
    venv = cache / "math-bench-venv"
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


def grade(python: Path, base: Path, params: dict, work: Path) -> tuple[dict, float, float]:
    """(score line details, wall seconds, CPU seconds) of one grading of `base` unchanged."""
    script = work / "evaluator.py"
    script.write_text(evaluator_script(TINY))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_NONCE": "bench",
        "POSTTRAIN_MODEL_DIR": str(base),
        "POSTTRAIN_BASE_MODEL_DIR": str(base),
        "POSTTRAIN_HIDDEN_SPLIT_SEED": "bench",
        "POSTTRAIN_TASK_PARAMS": json.dumps(params),
    }
    started, cpu = time.monotonic(), children_cpu_s()
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, check=True
    )
    seconds, cpu = time.monotonic() - started, children_cpu_s() - cpu
    reading = read_score(done.stdout.splitlines(), "bench")
    if not reading.valid:
        raise SystemExit(f"the evaluator gave no valid score: {reading.reason}\n{done.stderr}")
    return reading.details, seconds, cpu


def qwen_sized(folder: Path, layers: int) -> None:
    """The tiny model's tokenizer and template with Qwen2.5-0.5B's layer sizes, bf16."""
    tiny_math_lm.generate(folder)  # tokenizer, template, generation settings
    config = json.loads((folder / "config.json").read_text())
    size = LlamaSize(**{**QWEN_LAYERS.__dict__, "layers": layers})
    vocab = config["vocab_size"]
    config |= {
        "hidden_size": size.hidden,
        "intermediate_size": size.intermediate,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
        "head_dim": size.head_dim,
        "torch_dtype": "bfloat16",
    }
    write_json(folder / "config.json", config)
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in size.tensor_shapes(vocab).items():
        values = (
            np.ones(shape) if name.endswith("norm.weight") else 0.02 * rng.standard_normal(shape)
        )
        bf16 = (values.astype("<f4").view("<u4") >> 16).astype("<u2")  # truncated to bf16
        tensors[name] = ("BF16", shape, bf16.tobytes())
    write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description="The math word problems family, measured.")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    python = model_python(Path(tempfile.gettempdir()) / "posttrain-bench")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = work / "tiny"
        tiny_math_lm.generate(base)
        params = dict(TINY.evaluation) | ({"test_items": 20} if quick else {})
        details, wall, cpu = grade(python, base, params, work)
        rate = details["generated_tokens"] / details["generation_s"]
        print(
            f"math_word_problems_tiny: one grading of {details['n']} problems: {wall:.1f} s "
            f"wall, {cpu:.1f} CPU-s; generation {details['generation_s']:.1f} s, "
            f"{details['generated_tokens']} tokens, {rate:.0f} generated tokens/s"
        )
        big = work / "qwen-sized"
        layers = 2 if quick else QWEN_LAYERS.layers
        qwen_sized(big, layers)
        params = dict(TINY.evaluation) | {
            "test_items": 4 if quick else 16,
            "batch_size": 16,
            "max_new_tokens": 8 if quick else 64,
        }
        details, wall, cpu = grade(python, big, params, work)
        rate = details["generated_tokens"] / details["generation_s"]
        print(
            f"Qwen2.5-0.5B-sized ({layers} layers, bf16, CPU): {details['n']} problems x "
            f"{params['max_new_tokens']} new tokens: {details['generated_tokens']} tokens in "
            f"{details['generation_s']:.1f} s, {rate:.1f} generated tokens/s "
            f"({wall:.1f} s wall, {cpu:.1f} CPU-s with the checks and imports)"
        )


if __name__ == "__main__":
    main()
