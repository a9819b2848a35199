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
"""The evaluator of the arithmetic-format task family (`t0_arithmetic_format` and its `_tiny`
member): how often the post-trained model answers an arithmetic question exactly right, in
exactly the required format.

Its parameters come from the task's `[evaluation]` table (POSTTRAIN_TASK_PARAMS, JSON); the
question distribution is the one the task's prompt describes. Inputs:

    /base_model                  architecture, config, generation settings, tokenizer and chat
                                 template: everything but the weights comes from here only
    /model                       the agent job's outputs: only the regular *.safetensors files
                                 directly in it are read, after the kit validates their headers;
                                 nothing else there (a config, a tokenizer, a chat template, a
                                 pickle, code) is ever opened
    POSTTRAIN_NONCE              the job's nonce, printed on the score line (required)
    POSTTRAIN_HIDDEN_SPLIT_SEED  grader jobs only: the hidden split's seed
    POSTTRAIN_TASK_PARAMS        the task's evaluation parameters (JSON)
    POSTTRAIN_MODEL_DIR, POSTTRAIN_BASE_MODEL_DIR   override the two folders (tests, backends)

Items. The dev split is drawn from a public seed (`dev_seed`); the hidden split is drawn inside
the grader job from the seed only it receives, from the same distribution, and never holds a dev
question. No item, question or generation is ever printed: the log holds counts only.

Score. Each question goes alone in a user message formatted with the base model's chat template;
the model generates greedily, at most `max_new_tokens` new tokens, in batches (on the GPU when
there is one, else the CPU, the same code). A reply counts when, stripped of surrounding
whitespace, it is exactly `ANSWER: <integer>` and the integer is right. score = correct / n.

Faults. Every check on the artifact runs before any model code, in isolated children with
memory and CPU-time caps that follow the base model's size, never the artifact's. The first
(standard library only) reads the artifact's headers, within a byte budget set by the base
model's, and compares names, dtypes and shapes with the base model's. Then this process imports
torch (a grader that cannot is at fault: exit 2), and the second child runs the value check (no
NaN or inf) on the base model's own weights, then on the artifact's. Each child reports how far
it got: one that fails once it has started on the artifact (anything wrong, anything the
artifact makes the reader do, its CPU-time cap included) gives score 0 with `artifact_valid:
false` and the reason; one that fails before (the value check failing on the base model itself,
under the same caps) is the grader's. Once the weights pass, what the model run needs does not
depend on them (their names, dtypes and shapes are the base model's), so a failure after the
checks (out of memory, a CUDA error) is the grader's too: no score line, exit status 2, which
the broker reports as score_failed. The model run's child decides the device, once (CUDA when
torch sees it, else the CPU; this process never initialises CUDA), and on the CPU caps its
memory.

Output: exactly one `POSTTRAIN_SCORE <nonce> {json}` line with `score`, `n`, `format_ok`,
`correct`, `split` and `artifact_valid`.
"""

import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.evaluator_kit import (
    ON_ARTIFACT,
    ArtifactError,
    GraderFault,
    TensorInfo,
    cap_address_space,
    final_line,
    grader_inputs,
    header_budget,
    read_error,
    read_tensor_set,
    run_grader,
    run_isolated,
    shorten,
    structure_problem,
    verdict,
)

PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
ANSWER = re.compile(r"ANSWER: (-?[0-9]+)")
OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
DEFAULTS: dict[str, Any] = {
    "max_operand": 999,
    "operators": ["+", "-", "*"],
    "max_operations": 2,
    "dev_items": 200,
    "hidden_items": 500,
    "max_new_tokens": 32,
    "batch_size": 64,
    "dev_seed": "t0_arithmetic_format/dev/1",
}
# Each check child's CPU time: the value check reads the base model's weights and the
# artifact's once each, seconds for a 0.5 B model; capped far above that and, for both children
# together, far below the grader's timeout (900 s for the tiny member), whatever the artifact
# holds.
CHECK_CPU_SECONDS = 300
GIB = 1 << 30
# Below this, a model on the CPU runs on one thread (the tiny member's has 0.3 M parameters).
SMALL_MODEL_PARAMETERS = 50_000_000


# -- the questions ---------------------------------------------------------------------------------


def question(rng: random.Random, params: dict[str, Any]) -> tuple[str, int]:
    """One question of the task's distribution and its answer.

    One operation `a op b`, or two with parentheses, `(a op b) op c` or `a op (b op c)`; operands
    are integers from 0 to `max_operand`, operators from `operators`."""
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


def draw(seed: str, count: int, params: dict[str, Any], avoid: frozenset[str]) -> list[tuple]:
    """`count` distinct questions drawn with `seed`, none of them in `avoid` (fewer only when the
    distribution has no more)."""
    rng = random.Random(seed)
    found: dict[str, int] = {}
    for _ in range(100 * count):
        if len(found) == count:
            break
        text, answer = question(rng, params)
        if text not in avoid:
            found.setdefault(text, answer)
    return list(found.items())


def items(params: dict[str, Any], hidden_seed: str | None) -> list[tuple[str, int]]:
    dev = draw(params["dev_seed"], params["dev_items"], params, frozenset())
    if hidden_seed is None:
        return dev
    avoid = frozenset(text for text, _ in dev)
    return draw(f"hidden/{hidden_seed}", params["hidden_items"], params, avoid)


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
    if not set(params["operators"]) <= set(OPERATORS) or params["max_operations"] not in (1, 2):
        raise GraderFault(f"{PARAMS_ENV}: unknown operators or max_operations")
    return params


# -- the checks (isolated children: memory and CPU time capped) --------------------------------


def check_headers(
    report: Callable[[str], None], base: dict[str, TensorInfo], model_dir: str
) -> dict[str, Any]:
    """The artifact's headers against the base model's (standard library only): {"ok": True,
    "weights": {tensor: file}}, {"artifact_valid": False, "reason"}, or {"grader_fault": why}."""
    report(ON_ARTIFACT)
    try:
        got = read_tensor_set(Path(model_dir), max_header_total=header_budget(base))
    except ArtifactError as exc:
        return {"artifact_valid": False, "reason": str(exc)}
    except OSError as exc:
        return read_error(exc)
    problem = structure_problem(base, got)
    if problem:
        return {"artifact_valid": False, "reason": problem}
    # Names equal the base model's, so this map is the base model's size whatever the files.
    return {"ok": True, "weights": {name: info.path for name, info in sorted(got.items())}}


def check_values(
    report: Callable[[str], None], base_files: list[str], files: list[str], memory: int
) -> dict[str, Any]:
    """No NaN or inf in the artifact's floating-point tensors: {"ok": True}, {"artifact_valid":
    False, "reason"}, or {"grader_fault": why}. The same check runs on the base model's files
    first, under the same caps: the artifact's tensors have the base model's names, dtypes and
    shapes, so once it passes there, whatever fails on the artifact is the artifact's doing."""
    import torch  # imported by the parent already (before the fork): nothing to load here
    from safetensors import safe_open

    cap_address_space(memory)  # above what torch maps already: the cap is for the work
    report("base model")

    def non_finite(paths: list[str]) -> str:
        for path in paths:
            with safe_open(path, framework="pt") as weights:
                for name in weights.keys():  # safe_open has no __iter__
                    tensor = weights.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        return f"{shorten(name)!r} holds NaN or inf"
        return ""

    try:
        problem = non_finite(base_files)
    except OSError as exc:
        return {"grader_fault": f"the base model's weights are unreadable: {exc}"}
    if problem:
        return {"grader_fault": f"the base model's weights fail the value check: {problem}"}
    report(ON_ARTIFACT)
    try:
        problem = non_finite(files)
    except OSError as exc:
        return read_error(exc)
    return {"artifact_valid": False, "reason": problem} if problem else {"ok": True}


# -- the model run (an isolated child; counts only come back) -----------------------------------


def weights_folder(base_dir: Path, weights: dict[str, str], folder: Path) -> None:
    """A model folder with the base model's configuration and the artifact's (validated)
    weights, `weights` mapping each tensor to its file: links to those files and an index
    naming which one holds each tensor. No other file of the artifact is linked, so none can
    be read."""
    for name in ("config.json", "generation_config.json"):
        if (base_dir / name).is_file():
            (folder / name).write_bytes((base_dir / name).read_bytes())
    links = {
        path: f"weights-{n:05d}.safetensors" for n, path in enumerate(sorted(set(weights.values())))
    }
    for path, link in links.items():
        (folder / link).symlink_to(path)
    index = {"metadata": {}, "weight_map": {name: links[weights[name]] for name in sorted(weights)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def run_model(
    base_dir: str,
    weights: dict[str, str],
    questions: list[str],
    answers: list[int],
    params: dict[str, Any],
    memory: int,
) -> dict[str, Any]:
    """Greedy replies to every question, scored; only the counts are returned. `weights`: the
    checked artifact's tensors and their files (its headers are not read again here beyond
    what safetensors does when loading, within the budget the checks enforced)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base = Path(base_dir)
    # The one place the device is decided: where the model runs. On the CPU, the address
    # space is capped (after the import: the cap is for the work); CUDA reserves far more.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        cap_address_space(memory)
    with tempfile.TemporaryDirectory(prefix="weights-") as folder:
        weights_folder(base, weights, Path(folder))
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype="auto", local_files_only=True, trust_remote_code=False
        )
    model.to(device).eval()
    if device == "cpu" and model.num_parameters() < SMALL_MODEL_PARAMETERS:
        # A small model on the CPU: one intra-op thread, since a second costs more in
        # synchronisation than it gains (several times the CPU time on a busy machine).
        torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True, trust_remote_code=False)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        generation = GenerationConfig.from_pretrained(base, local_files_only=True)
    except OSError:  # a base model without generation_config.json
        generation = GenerationConfig.from_model_config(model.config)
    generation.update(
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        max_new_tokens=params["max_new_tokens"],
        pad_token_id=tokenizer.pad_token_id,
    )
    format_ok = correct = 0
    size = params["batch_size"]
    with torch.inference_mode():
        for start in range(0, len(questions), size):
            batch = questions[start : start + size]
            prompts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
                )
                for text in batch
            ]
            encoded = tokenizer(
                prompts, return_tensors="pt", padding=True, add_special_tokens=False
            )
            encoded = encoded.to(device)
            output = model.generate(**encoded, generation_config=generation)
            replies = tokenizer.batch_decode(
                output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True
            )
            for reply, answer in zip(replies, answers[start : start + size], strict=True):
                match = ANSWER.fullmatch(reply.strip())
                format_ok += match is not None
                correct += match is not None and int(match.group(1)) == answer
    return {"format_ok": format_ok, "correct": correct, "device": device}


# -- the job ------------------------------------------------------------------------------------


def evaluate(environ: dict[str, str]) -> str:
    """The score line for this job's artifact; raises GraderFault for faults not the artifact's."""
    job = grader_inputs(environ)
    params = task_params(environ.get(PARAMS_ENV))
    base, base_dir = job.base, job.base_dir
    if not (base_dir / "config.json").is_file():
        raise GraderFault(f"the base model in {base_dir} has no config.json")
    chosen = items(params, job.hidden_seed)
    started = time.monotonic()
    payload: dict[str, Any] = {"n": len(chosen), "format_ok": 0, "correct": 0}
    # Every child's memory follows the base model's size, never the artifact's.
    memory = max(4 * GIB, 3 * sum(info.nbytes for info in base.values()) + 2 * GIB)
    headers = verdict(
        run_isolated(
            check_headers,
            base,
            str(job.model_dir),
            memory_bytes=memory,
            cpu_seconds=CHECK_CPU_SECONDS,
            stages=True,
        ),
        "the header check",
    )
    if headers.get("ok"):
        weights: dict[str, str] = headers["weights"]
        _import_torch()
        values = verdict(
            run_isolated(
                check_values,
                sorted({info.path for info in base.values()}),
                sorted(set(weights.values())),
                memory,
                memory_bytes=None,  # the child caps itself above what torch maps
                cpu_seconds=CHECK_CPU_SECONDS,
                stages=True,
            ),
            "the value check",
        )
    else:
        weights, values = {}, headers
    if not values.get("ok"):
        payload |= {"score": 0.0, "artifact_valid": False, "reason": values["reason"]}
        return final_line(job, payload, started)
    ran = run_isolated(
        run_model,
        str(base_dir),
        weights,
        [text for text, _ in chosen],
        [answer for _, answer in chosen],
        params,
        memory,
        memory_bytes=None,  # the child caps itself on the CPU, after importing torch
        cpu_seconds=None,  # bounded by the grader's own timeout; the weights are not suspects
    )
    if not ran.ok:
        raise GraderFault(f"the model run failed after the checks passed: {ran.problem}")
    counts = ran.value
    n = len(chosen)
    payload |= {
        "score": counts["correct"] / n if n else 0.0,
        "artifact_valid": True,
        "format_ok": counts["format_ok"],
        "correct": counts["correct"],
        "device": counts["device"],
        "files": sorted(shorten(Path(path).name) for path in set(weights.values()))[:8],
        "reason": "" if counts["correct"] == n else f"{n - counts['correct']} of {n} not right",
    }
    return final_line(job, payload, started)


def _import_torch() -> None:
    """Import torch and safetensors here, once, for the children forked after it (never
    transformers, and nothing that could initialise CUDA: only the model run's child does). A
    grader that cannot import them is at fault, whatever the artifact."""
    try:
        import torch  # noqa: F401, I001 (torch first: the error names what is missing)
        import safetensors.torch  # noqa: F401
    except ImportError as exc:
        raise GraderFault(f"the grader cannot import torch and safetensors: {exc}") from None


if __name__ == "__main__":
    sys.exit(run_grader(evaluate, "arithmetic evaluator"))
