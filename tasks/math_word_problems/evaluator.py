#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.13.0",
#     "transformers==5.23.0",
#     "safetensors==0.8.0",
# ]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
# torch and transformers live in the job's venv, not the server's: nothing to check them with.
# pyright: reportMissingImports=false
"""The evaluator of the math word problems family (`math_word_problems`, GSM8K, and its `_tiny`
member): how many of a public test set's word problems the post-trained model answers with the
right final number.

Its parameters come from the task's `[evaluation]` table (POSTTRAIN_TASK_PARAMS, JSON). Inputs
are the generation kit's (tasks/generation_kit.py): /base_model for everything but the weights,
only the checked `*.safetensors` files of /model, POSTTRAIN_NONCE, POSTTRAIN_HIDDEN_SPLIT_SEED
(grader jobs only: it marks the hidden split; the hidden split itself is the public test set,
the same for every episode, which is why the contamination check looks for it).

Items (`source`):

    "tiny"   word problems generated here from public seeds (`tiny_problems`): adding to or
             taking from a count of things, numbers 0 to 20. The hidden split is the test set:
             `test_items` problems whose person is one of TEST_NAMES; the dev split is the first
             `dev_items` of the train set (every other name). The task folder ships the test
             set as JSON Lines (`test.jsonl`, the contamination check's items; a test checks it
             equals this generator's).
    "gsm8k"  GSM8K (openai/gsm8k, config `main`) from the dataset mounted for evaluation jobs
             at `data_dir`: the hidden split is its `test` split (1,319 problems), the dev split
             the first `dev_items` problems of its `train` split. Read with pyarrow, which the
             task adds to this header (`data_dependencies`).

Score. Each problem goes alone in a user message (followed by `instruction` on a new line when
it is not empty), formatted with the base model's chat template; the model generates greedily,
at most `max_new_tokens` new tokens. The final answer is the number after the LAST `####` of the
reply (GSM8K's own convention: `#### 72`; commas inside the number are ignored, a sign and a
decimal point are allowed); a reply without one has no answer. An answer counts when it equals
the reference number exactly (as a decimal: `18`, `18.0` and `18.00` are the same number).
score = correct / n. The score line carries `n`, `answered` (replies with a `####` number),
`correct`, the engine and the generation's tokens and seconds: counts only, never an item.

Faults: those of the generation kit (artifacts it refuses score 0 with `artifact_valid: false`;
the grader's own faults exit 2, no score line); data that cannot be read here is the grader's.
"""

import json
import random
import re
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from tasks.evaluator_kit import GraderFault, final_line, grader_inputs, run_grader
from tasks.generation_kit import GENERATION_KEYS, generate, settings_from

PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
DEFAULTS: dict[str, Any] = {
    "source": "tiny",
    "dev_items": 100,
    "test_items": 200,
    "instruction": "",
    "data_dir": "/datasets/openai/gsm8k",
    # Read by tasks/registry.py (added to this header), never here.
    "data_dependencies": [],
    "max_new_tokens": 12,
    "batch_size": 100,
    "engine": "transformers",
    "gpu_memory_utilization": 0.85,
}
FINAL = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
# The tiny distribution: who, what, and four sentence shapes (two add, two take away).
NAMES = ("Ann", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hana")
TEST_NAMES = ("Gus", "Hana")  # the test set's people; the train set has the others
THINGS = ("apples", "books", "cards", "coins", "eggs", "pens", "rocks", "shells")
SHAPES = (
    ("{n} has {a} {t}. {n} gets {b} more. How many {t} does {n} have?", 1),
    ("{n} had {a} {t} and found {b} more. How many {t} now?", 1),
    ("{n} has {a} {t} and gives {b} away. How many {t} are left?", -1),
    ("{n} had {a} {t}, then lost {b}. How many {t} remain?", -1),
)
MAX_NUMBER = 20
TRAIN_SEED = "math_word_problems_tiny/train/1"
TEST_SEED = "math_word_problems_tiny/test/1"


# -- the items --------------------------------------------------------------------------------


def tiny_problem(rng: random.Random, names: tuple[str, ...]) -> tuple[str, int]:
    """One tiny word problem with a person from `names`, and its answer (never negative)."""
    shape, sign = rng.choice(SHAPES)
    name, thing = rng.choice(names), rng.choice(THINGS)
    a, b = rng.randint(0, MAX_NUMBER), rng.randint(0, MAX_NUMBER)
    if sign < 0 and b > a:
        a, b = b, a
    return shape.format(n=name, a=a, b=b, t=thing), a + sign * b


def tiny_problems(split: str, count: int) -> list[tuple[str, str, str]]:
    """`count` distinct problems of the public `split` ("train" or "test") as (id, question,
    answer): the same every time. Train problems never name a test person, so the two sets
    never share a problem."""
    test = split == "test"
    names = TEST_NAMES if test else tuple(n for n in NAMES if n not in TEST_NAMES)
    rng = random.Random(TEST_SEED if test else TRAIN_SEED)
    found: dict[str, int] = {}
    for _ in range(100 * count):
        if len(found) == count:
            break
        text, answer = tiny_problem(rng, names)
        found.setdefault(text, answer)
    return [(f"tiny-{split}-{n:04d}", text, str(a)) for n, (text, a) in enumerate(found.items())]


def gsm8k_rows(data_dir: Path, split: str, limit: int | None) -> list[tuple[str, str, str]]:
    """GSM8K's `split` as (id, question, final answer) from the mounted dataset's Parquet
    file(s) of config `main`; the final answer is what follows `####` in its `answer`."""
    try:
        import pyarrow.parquet as parquet
    except ImportError as exc:
        raise GraderFault(f"pyarrow is needed to read GSM8K: {exc}") from None
    files = sorted((data_dir / "main").glob(f"{split}-*.parquet"))
    if not files:
        raise GraderFault(f"no GSM8K {split} split under {data_dir}/main (is it mounted?)")
    rows: list[tuple[str, str, str]] = []
    for path in files:
        table = parquet.read_table(path, columns=["question", "answer"]).to_pylist()
        for row in table:
            final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
            rows.append((f"gsm8k-{split}-{len(rows):04d}", str(row["question"]), final))
            if limit is not None and len(rows) == limit:
                return rows
    return rows


def items(params: dict[str, Any], hidden: bool) -> list[tuple[str, str, str]]:
    """The split's problems: the test set when `hidden`, else the dev slice of the train set."""
    if params["source"] == "tiny":
        if hidden:
            return tiny_problems("test", params["test_items"])
        return tiny_problems("train", params["dev_items"])
    data_dir = Path(params["data_dir"])
    if hidden:
        return gsm8k_rows(data_dir, "test", None)
    return gsm8k_rows(data_dir, "train", params["dev_items"])


# -- the score --------------------------------------------------------------------------------


def final_answer(reply: str) -> Decimal | None:
    """The number after the reply's last `####` (commas dropped), or None."""
    found = FINAL.findall(reply)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None


def is_correct(reply: str, reference: str) -> bool:
    answer = final_answer(reply)
    if answer is None:
        return False
    try:
        return answer == Decimal(reference)
    except InvalidOperation:
        return False


def task_params(raw: str | None) -> dict[str, Any]:
    """The task's parameters over the defaults. Raises GraderFault if they are malformed (they
    come from the task's spec, never from the agent)."""
    try:
        given = json.loads(raw) if raw else {}
    except ValueError:
        raise GraderFault(f"{PARAMS_ENV} is not JSON") from None
    if not isinstance(given, dict) or not set(given) <= set(DEFAULTS):
        raise GraderFault(f"{PARAMS_ENV} must be an object with keys among {sorted(DEFAULTS)}")
    params = {**DEFAULTS, **given}
    if params["source"] not in ("tiny", "gsm8k"):
        raise GraderFault(f"{PARAMS_ENV}: source must be 'tiny' or 'gsm8k'")
    for key in ("dev_items", "test_items"):
        if isinstance(params[key], bool) or not isinstance(params[key], int) or params[key] < 1:
            raise GraderFault(f"{PARAMS_ENV}: {key} must be a positive integer")
    return params


def evaluate(environ: dict[str, str]) -> str:
    """The score line for this job's artifact; raises GraderFault for faults not the artifact's."""
    job = grader_inputs(environ)
    params = task_params(environ.get(PARAMS_ENV))
    settings = settings_from({key: params[key] for key in GENERATION_KEYS})
    if not (job.base_dir / "config.json").is_file():
        raise GraderFault(f"the base model in {job.base_dir} has no config.json")
    chosen = items(params, job.hidden_seed is not None)
    started = time.monotonic()
    suffix = f"\n{params['instruction']}" if params["instruction"] else ""
    conversations = [[{"role": "user", "content": question + suffix}] for _, question, _ in chosen]
    made = generate(job, conversations, settings)
    n = len(chosen)
    payload: dict[str, Any] = {"n": n, "answered": 0, "correct": 0}
    if not made.artifact_valid:
        payload |= {"score": 0.0, "artifact_valid": False, "reason": made.reason}
        return final_line(job, payload, started)
    answered = sum(final_answer(text) is not None for text in made.texts)
    correct = sum(
        is_correct(text, reference)
        for text, (_, _, reference) in zip(made.texts, chosen, strict=True)
    )
    payload |= {
        "score": correct / n if n else 0.0,
        "artifact_valid": True,
        "answered": answered,
        "correct": correct,
        "engine": made.engine,
        "device": made.device,
        "generated_tokens": made.generated_tokens,
        "generation_s": made.generation_s,
        "files": list(made.files),
        "reason": "" if correct == n else f"{n - correct} of {n} not right",
    }
    if made.engine_note:
        payload["engine_note"] = made.engine_note
    return final_line(job, payload, started)


if __name__ == "__main__":
    sys.exit(run_grader(evaluate, "math word problems evaluator"))
