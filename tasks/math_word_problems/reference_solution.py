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
"""Reference solution of the math word problems family: supervised fine-tuning on the train set.

The job script a good agent submits, for both members: it reads the base model from /base_model,
builds its training problems from the TRAIN set only (the tiny member: problems of the task's
train-set people, generated here like the evaluator's; the GSM8K member: GSM8K's train split
from /datasets/openai/gsm8k, which the agent mounts, and which needs `pyarrow` added to the
job's dependencies), trains the model to reply with the answer and a final `#### <number>`
through the base model's own chat template, writes the problems it trained on to
/data/outputs/train.jsonl (what the contamination check reads) and the weights as safetensors
to /data/outputs, in the base model's dtype and tensor names. Which member it serves follows
from the model's size (a profile each).

    python reference_solution.py [BASE_DIR [OUTPUTS_DIR]]    defaults: /base_model /data/outputs

It repeats the evaluator's tiny problem generator (an agent's script is one file); a test
checks the two against each other. TRAIN_SPLIT = "test" makes it a contaminated run (tests).
"""

import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

TRAIN_SPLIT = "train"
# The tiny distribution, as the task's prompt states it (and the evaluator draws it).
NAMES = ("Ann", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hana")
TEST_NAMES = ("Gus", "Hana")
THINGS = ("apples", "books", "cards", "coins", "eggs", "pens", "rocks", "shells")
SHAPES = (
    ("{n} has {a} {t}. {n} gets {b} more. How many {t} does {n} have?", 1),
    ("{n} had {a} {t} and found {b} more. How many {t} now?", 1),
    ("{n} has {a} {t} and gives {b} away. How many {t} are left?", -1),
    ("{n} had {a} {t}, then lost {b}. How many {t} remain?", -1),
)
MAX_NUMBER = 20
SEEDS = {"train": "math_word_problems_tiny/train/1", "test": "math_word_problems_tiny/test/1"}
# The GSM8K member's prompt suffix (the task's `instruction`).
INSTRUCTION = (
    "Solve the problem step by step. End your reply with a line of the form #### <number>."
)
GSM8K_TRAIN = Path("/datasets/openai/gsm8k/main")
PROFILES = {
    "tiny": {"problems": 20_000, "steps": 1200, "batch_size": 64, "learning_rate": 3e-3},
    "full": {"steps": 1400, "batch_size": 16, "learning_rate": 1e-5, "max_tokens": 512},
}
TINY_BELOW_PARAMETERS = 50_000_000
MAX_TRAIN_SECONDS = float(os.environ.get("MAX_TRAIN_SECONDS", 20 * 60))
WARMUP = 0.1


def learning_rate_factor(progress: float) -> float:
    """A linear warm-up from 1/25 over the first tenth, then a cosine decay to zero."""
    if progress < WARMUP:
        return 0.04 + 0.96 * progress / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (progress - WARMUP) / (1.0 - WARMUP)))


def tiny_problem(rng: random.Random, names: tuple) -> tuple[str, int]:
    """One tiny word problem with a person from `names`, and its answer (as the evaluator)."""
    shape, sign = rng.choice(SHAPES)
    name, thing = rng.choice(names), rng.choice(THINGS)
    a, b = rng.randint(0, MAX_NUMBER), rng.randint(0, MAX_NUMBER)
    if sign < 0 and b > a:
        a, b = b, a
    return shape.format(n=name, a=a, b=b, t=thing), a + sign * b


def tiny_problems(split: str, count: int) -> list[tuple[str, str]]:
    """`count` distinct problems of `split` as (question, reply): the evaluator's sets, each
    reply a worked line and the final answer, e.g. "3 + 4 = 7\n#### 7" (copying the numbers
    out first makes the sum a short step for a tiny model)."""
    test = split == "test"
    names = TEST_NAMES if test else tuple(n for n in NAMES if n not in TEST_NAMES)
    rng = random.Random(SEEDS[split])
    found: dict[str, int] = {}
    for _ in range(100 * count):
        if len(found) == count:
            break
        text, answer = tiny_problem(rng, names)
        found.setdefault(text, answer)
    return [(text, worked_reply(text, answer)) for text, answer in found.items()]


def worked_reply(question: str, answer: int) -> str:
    a, b = re.findall(r"[0-9]+", question)
    return f"{a} {'+' if 'more' in question else '-'} {b} = {answer}\n#### {answer}"


def gsm8k_problems() -> list[tuple[str, str]]:
    """GSM8K's train split as (question + instruction, reply): the worked answer without its
    calculator annotations (`<<48/2=24>>`), ending with its `#### <number>` line."""
    import pyarrow.parquet as parquet

    problems = []
    for path in sorted(GSM8K_TRAIN.glob(f"{TRAIN_SPLIT}-*.parquet")):
        for row in parquet.read_table(path, columns=["question", "answer"]).to_pylist():
            reply = re.sub(r"<<[^>]*>>", "", row["answer"]).strip()
            problems.append((f"{row['question']}\n{INSTRUCTION}", reply))
    return problems


def examples(tokenizer, problems: list, limit: int | None) -> list[tuple[list, list]]:
    """(input ids, labels) pairs, one per problem, made once: the prompt as the evaluator
    builds it, then the reply and the end of turn; the loss is on the reply only."""
    end = tokenizer.eos_token or ""
    pairs = []
    for question, reply in problems:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(reply + end, add_special_tokens=False)["input_ids"]
        ids, labels = prompt_ids + reply_ids, [-100] * len(prompt_ids) + reply_ids
        pairs.append((ids[:limit], labels[:limit]) if limit else (ids, labels))
    return pairs


def batch(pairs: list, pad_id: int, device: str) -> dict:
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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    saved_dtype = model.dtype
    parameters = sum(p.numel() for p in model.parameters())
    tiny = parameters < TINY_BELOW_PARAMETERS
    profile = PROFILES["tiny" if tiny else "full"]
    if device == "cpu" and tiny:
        torch.set_num_threads(1)  # a second thread costs more than it gains at this size
    problems = tiny_problems(TRAIN_SPLIT, profile["problems"]) if tiny else gsm8k_problems()
    print(
        f"{parameters} parameters on {device}; {len(problems)} {TRAIN_SPLIT} problems", flush=True
    )
    outputs.mkdir(parents=True, exist_ok=True)
    # What the model is trained on, beside it: the contamination check reads it.
    with (outputs / "train.jsonl").open("w", encoding="utf-8") as out:
        for question, reply in problems:
            out.write(json.dumps({"question": question, "reply": reply}) + "\n")
    pairs = examples(tokenizer, problems, profile.get("max_tokens"))
    model.to(device=device, dtype=torch.float32).train()  # fp32 master weights
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=profile["learning_rate"])
    steps, rng, started = profile["steps"], random.Random(1234), time.monotonic()
    for step in range(steps):
        progress = max(step / steps, (time.monotonic() - started) / MAX_TRAIN_SECONDS)
        if progress >= 1.0:
            print(f"stopping after {step} steps: the time budget is spent", flush=True)
            break
        for group in optimizer.param_groups:
            group["lr"] = profile["learning_rate"] * learning_rate_factor(progress)
        inputs = batch(rng.choices(pairs, k=profile["batch_size"]), pad_id, device)
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
    # Only safetensors weights count; the base model's names, dtypes and shapes are kept.
    model.save_pretrained(outputs, safe_serialization=True)
    print(f"wrote {sorted(p.name for p in outputs.iterdir())}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        Path(arguments[0]) if arguments else Path("/base_model"),
        Path(arguments[1]) if len(arguments) > 1 else Path("/data/outputs"),
    )
