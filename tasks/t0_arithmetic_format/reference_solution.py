#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.13.0",
#     "transformers==5.23.0",
#     "safetensors==0.8.0",
# ]
# ///
# torch and transformers live in the job's venv, not the server's: nothing to check them with.
# pyright: reportMissingImports=false
"""Reference solution of the arithmetic-format family: supervised fine-tuning on generated data.

The job script a good agent submits, for both members of the family: it reads the base model
from /base_model, generates question/answer pairs of the task's distribution (the job has no
network), trains the model to reply exactly `ANSWER: <integer>` through the base model's own
chat template, and writes the weights as safetensors to /data/outputs, in the base model's
dtype and tensor names. Which member it serves follows from the model's size (a profile each):
the tiny member's generated model trains on the CPU in minutes; on a GPU the same code trains
the Hugging Face member's base model.

    python reference_solution.py [BASE_DIR [OUTPUTS_DIR]]    defaults: /base_model /data/outputs

It repeats the evaluator's question generator (an agent's script is one file); a test checks
the two against each other.
"""

import math
import os
import random
import sys
import time
from pathlib import Path

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# The distribution of each member (its prompt) and how to train for it.
PROFILES = {
    "tiny": {
        "max_operand": 20,
        "operators": ["+", "-"],
        "max_operations": 1,
        "steps": 500,
        "batch_size": 128,
        "learning_rate": 3e-3,
    },
    "full": {
        "max_operand": 999,
        "operators": ["+", "-", "*"],
        "max_operations": 2,
        "steps": 3000,
        "batch_size": 32,
        "learning_rate": 2e-5,
    },
}
# The tiny member's generated model has ~0.3 M parameters; the full member's base model 0.5 B.
TINY_BELOW_PARAMETERS = 50_000_000
# The time the training loop may take whatever the step (the job's own timeout is longer);
# the learning-rate schedule ends with it.
MAX_TRAIN_SECONDS = float(os.environ.get("MAX_TRAIN_SECONDS", 20 * 60))
WARMUP = 0.1


def learning_rate_factor(progress: float) -> float:
    """The one-cycle shape: a linear warm-up from 1/25 over the first tenth, then a cosine
    decay to zero, as a function of progress in [0, 1]."""
    if progress < WARMUP:
        return 0.04 + 0.96 * progress / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (progress - WARMUP) / (1.0 - WARMUP)))


def question(rng: random.Random, params: dict) -> tuple[str, int]:
    """One question of the task's distribution and its answer (as the evaluator draws them)."""
    operations = rng.randint(1, params["max_operations"])
    numbers = [rng.randint(0, params["max_operand"]) for _ in range(operations + 1)]
    ops = [rng.choice(params["operators"]) for _ in range(operations)]
    a, b = numbers[0], numbers[1]
    if operations == 1:
        return f"What is {a} {ops[0]} {b}?", OPERATORS[ops[0]](a, b)
    c = numbers[2]
    if rng.random() < 0.5:
        inner = OPERATORS[ops[0]](a, b)
        return f"What is ({a} {ops[0]} {b}) {ops[1]} {c}?", OPERATORS[ops[1]](inner, c)
    inner = OPERATORS[ops[1]](b, c)
    return f"What is {a} {ops[0]} ({b} {ops[1]} {c})?", OPERATORS[ops[0]](a, inner)


def examples(tokenizer, rng: random.Random, params: dict, count: int) -> list[tuple[list, list]]:
    """(input ids, labels) pairs: the prompt as the evaluator builds it, then the reply and the
    end of turn; the loss is on the reply only."""
    end = tokenizer.eos_token or ""
    pairs = []
    for _ in range(count):
        text, answer = question(rng, params)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(f"ANSWER: {answer}{end}", add_special_tokens=False)["input_ids"]
        pairs.append((prompt_ids + reply_ids, [-100] * len(prompt_ids) + reply_ids))
    return pairs


def batch(pairs: list[tuple[list, list]], pad_id: int, device: str) -> dict:
    import torch

    width = max(len(ids) for ids, _ in pairs)
    ids = [ids + [pad_id] * (width - len(ids)) for ids, _ in pairs]
    labels = [labels + [-100] * (width - len(labels)) for _, labels in pairs]
    mask = [[1] * len(i) + [0] * (width - len(i)) for i, _ in pairs]
    return {
        "input_ids": torch.tensor(ids, device=device),
        "labels": torch.tensor(labels, device=device),
        "attention_mask": torch.tensor(mask, device=device),
    }


def main(base_dir: Path, outputs: Path) -> None:
    # Imported here, so that the question generator above loads without them (a test compares
    # it with the evaluator's).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    saved_dtype = model.dtype
    parameters = sum(p.numel() for p in model.parameters())
    profile = PROFILES["tiny" if parameters < TINY_BELOW_PARAMETERS else "full"]
    if device == "cpu" and parameters < TINY_BELOW_PARAMETERS:
        # For a model this small, a second intra-op thread costs more in synchronisation than it
        # gains: measured 0.20 CPU-s per step on one thread, 1.3 on two on a busy 2-core machine.
        torch.set_num_threads(1)
    print(f"{parameters} parameters on {device}: profile {profile}", flush=True)
    model.to(device=device, dtype=torch.float32).train()  # fp32 master weights
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=profile["learning_rate"])
    steps = profile["steps"]
    rng = random.Random(1234)
    started = time.monotonic()
    for step in range(steps):
        # Whichever runs out first, steps or time, ends the schedule: on a slow or busy machine
        # the rate still anneals to zero by the end instead of stopping at its peak.
        progress = max(step / steps, (time.monotonic() - started) / MAX_TRAIN_SECONDS)
        if progress >= 1.0:
            print(f"stopping after {step} steps: the time budget is spent", flush=True)
            break
        for group in optimizer.param_groups:
            group["lr"] = profile["learning_rate"] * learning_rate_factor(progress)
        inputs = batch(examples(tokenizer, rng, profile, profile["batch_size"]), pad_id, device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if not math.isfinite(loss.item()):
            raise SystemExit("the loss is not finite; stopping")
    model.to(dtype=saved_dtype).eval()
    outputs.mkdir(parents=True, exist_ok=True)
    # Only safetensors weights count; the base model's names, dtypes and shapes are kept.
    model.save_pretrained(outputs, safe_serialization=True)
    print(f"wrote {sorted(p.name for p in outputs.iterdir())}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        Path(arguments[0]) if arguments else Path("/base_model"),
        Path(arguments[1]) if len(arguments) > 1 else Path("/data/outputs"),
    )
