#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# [tool.uv]
# exclude-newer = "2025-06-01T00:00:00Z"
# ///
"""t0_artifact's trusted evaluator: compares a checkpoint with the one the prompt specifies.

Standard library only, so jobs install nothing. `tasks.registry.evaluator_script` embeds the
shared kit (tasks/evaluator_kit.py) in place of the `from tasks.evaluator_kit import` statement;
the result is the one file a grader job runs. Inputs:

    /base_model                     the base model; only its *.safetensors files are read
    /model                          the agent job's outputs; only the regular *.safetensors files
                                    directly in it are read (symlinks and other files ignored)
    POSTTRAIN_NONCE                 the job's nonce, printed on the score line (required)
    POSTTRAIN_HIDDEN_SPLIT_SEED     present in grader jobs only: the hidden split's seed
    POSTTRAIN_MODEL_DIR, POSTTRAIN_BASE_MODEL_DIR   override the two folders (set by tests and
                                    backends, never by an agent)

Score. The expected checkpoint holds every base tensor unchanged except `model.norm.weight`,
multiplied by 2 exactly in its own dtype. If the checkpoint's tensor names, dtypes or shapes
differ from the base model's at all, the score is 0. Otherwise

    score = 0.5 × [model.norm.weight is exactly doubled]
          + 0.5 × (fraction of the split's other tensors that are byte-identical to the base)

where the split is half of the other tensors (rounded up), chosen by a seed: a fixed public one
on the dev split, the grader's secret one on the hidden split (never the dev split's subset when
another exists). A correct checkpoint scores 1.0 on both; an unchanged copy of the base 0.5.
In the doubled tensor a NaN matches any NaN (libraries differ on NaN payloads).

Output: exactly one `POSTTRAIN_SCORE <nonce> {json}` line on stdout, exit status 0, for every
artifact. The JSON holds `score`, `split`, `artifact_valid` (false: the files are not valid
safetensors, or reading them crashed or ran out of memory: score 0), `reason` (why the score is
below 1), and counts. The artifact is read in a forked child with a memory cap, so whatever it
does to the reader is reported on that line. Faults that are not the artifact's (no nonce, an
unreadable base model, a missing /model, an I/O error of the mount, a child that fails before it
starts on the artifact) print no score line and exit with status 2, which the broker reports as
score_failed (DESIGN §9, "Grader faults").
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.evaluator_kit import (
    FLOAT_LAYOUTS,
    ON_ARTIFACT,
    ArtifactError,
    GraderFault,
    TensorInfo,
    choose_subset,
    close_files,
    final_line,
    grader_inputs,
    is_doubled,
    iter_chunks,
    open_files,
    read_bytes,
    read_error,
    read_tensor_set,
    run_grader,
    run_isolated,
    shorten,
    structure_problem,
    verdict,
)

DOUBLED = "model.norm.weight"
# Public by design: the dev split is what dev_evaluate checks.
DEV_SEED = "t0_artifact/dev/1"
DOUBLED_WEIGHT = 0.5
MAX_LISTED = 8


def checked_tensors(base_names: list[str], hidden_seed: str | None) -> list[str]:
    """The split's tensors besides the doubled one: half of them, chosen by the split's seed.

    The hidden split re-draws (deterministically) while it equals the dev split, so the two differ
    whenever more than one subset exists.
    """
    others = sorted(name for name in base_names if name != DOUBLED)
    k = (len(others) + 1) // 2
    dev = choose_subset(others, k, DEV_SEED)
    if hidden_seed is None:
        return dev
    chosen = dev
    for attempt in range(64):
        chosen = choose_subset(others, k, f"{hidden_seed}/{attempt}")
        if chosen != dev:
            break
    return chosen


def score_artifact(
    report: Callable[[str], None],
    base: dict[str, TensorInfo],
    model_dir: str,
    checked: list[str],
) -> dict[str, Any]:
    """Runs in the isolated child: the score payload (without split), or {"grader_fault": msg}."""
    report(ON_ARTIFACT)
    try:
        got = read_tensor_set(Path(model_dir))
    except ArtifactError as exc:
        return {"score": 0.0, "artifact_valid": False, "reason": str(exc)}
    except OSError as exc:
        return read_error(exc)
    files = sorted({Path(info.path).name for info in got.values()})
    payload: dict[str, Any] = {"files": [shorten(name) for name in files[:MAX_LISTED]]}
    problem = structure_problem(base, got)
    if problem:
        return {**payload, "score": 0.0, "artifact_valid": True, "reason": problem}

    fds: dict[str, int] = {}
    try:
        fds.update(open_files(base))
        fds.update(open_files(got))
        want, have = base[DOUBLED], got[DOUBLED]
        doubled = is_doubled(
            want.dtype, read_bytes(want, fds[want.path]), read_bytes(have, fds[have.path])
        )
        mismatched = [
            name
            for name in checked
            if not _same_bytes(base[name], got[name], fds[base[name].path], fds[got[name].path])
        ]
    except ArtifactError as exc:
        return {**payload, "score": 0.0, "artifact_valid": False, "reason": str(exc)}
    except OSError as exc:
        return read_error(exc)
    finally:
        close_files(fds)

    exact = len(checked) - len(mismatched)
    others_part = exact / len(checked) if checked else float(doubled)
    score = DOUBLED_WEIGHT * float(doubled) + (1 - DOUBLED_WEIGHT) * others_part
    reasons = []
    if not doubled:
        reasons.append(f"{DOUBLED} is not the base model's values multiplied by 2 exactly")
    if mismatched:
        reasons.append(f"{len(mismatched)} of {len(checked)} checked tensors differ from the base")
    return {
        **payload,
        "score": score,
        "artifact_valid": True,
        "reason": "; ".join(reasons),
        "doubled_exact": doubled,
        "checked": len(checked),
        "exact": exact,
        "mismatched": mismatched[:MAX_LISTED],
    }


def _same_bytes(want: TensorInfo, have: TensorInfo, want_fd: int, have_fd: int) -> bool:
    return all(
        a == b for a, b in zip(iter_chunks(want, want_fd), iter_chunks(have, have_fd), strict=True)
    )


def evaluate(environ: dict[str, str]) -> str:
    """The score line for this job's artifact; raises GraderFault for faults not the artifact's."""
    job = grader_inputs(environ)
    if DOUBLED not in job.base or job.base[DOUBLED].dtype not in FLOAT_LAYOUTS:
        raise GraderFault(f"the base model has no floating-point {DOUBLED}")
    started = time.monotonic()
    # The child's memory and CPU time are capped (the kit's defaults): whatever the artifact
    # makes the reader do, it ends quickly, as the artifact's fault (it says when it starts on
    # the artifact; a child that failed before that is the grader's).
    outcome = run_isolated(
        score_artifact,
        job.base,
        str(job.model_dir),
        checked_tensors(list(job.base), job.hidden_seed),
        stages=True,
    )
    # An answer without a score is a refusal: 0.
    return final_line(job, {"score": 0.0, **verdict(outcome, "the check")}, started)


if __name__ == "__main__":
    sys.exit(run_grader(evaluate, "t0_artifact evaluator"))
