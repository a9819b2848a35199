"""Parse the nonce-bearing lines that the broker trusts in a job's log (DESIGN §9).

Two kinds of line carry a per-job nonce that the agent's process cannot read:

    POSTTRAIN_LAUNCHER <nonce> {"stage": ..., ...}   written by the launcher's supervisor
    POSTTRAIN_SCORE <nonce> {"score": ..., ...}      written by an evaluator

Lines without the job's nonce are ignored, whatever they claim, so agent output can never forge
either kind. Server side only; pure (standard library), so workflows may import it too.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# The environment variable that carries a job's nonce into the job (never into history).
NONCE_ENV = "POSTTRAIN_NONCE"
LAUNCHER_TAG = "POSTTRAIN_LAUNCHER"
SCORE_TAG = "POSTTRAIN_SCORE"
# A trusted line is short; anything longer is not one of ours (and is not worth parsing). The
# same as posttrain_env.limits.MAX_TRUSTED_LINE_CHARS: this package keeps its own copy (standard
# library only), and a test binds the two.
MAX_TRUSTED_LINE_CHARS = 16_384


def trusted_payloads(lines: Iterable[str], tag: str, nonce: str) -> list[dict[str, Any]]:
    """The JSON objects of every well-formed `<tag> <nonce> {json}` line, in order.

    Lines that are too long, carry another nonce, or whose payload is not a JSON object are
    skipped. The nonce is compared in constant time.
    """
    if not nonce:
        raise ValueError("a trusted-line nonce must not be empty")
    found: list[dict[str, Any]] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if len(line) > MAX_TRUSTED_LINE_CHARS or not line.startswith(tag + " "):
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3 or not hmac.compare_digest(parts[1].encode(), nonce.encode()):
            continue
        try:
            payload = json.loads(parts[2])
        except ValueError:
            continue
        if isinstance(payload, dict):
            found.append(payload)
    return found


def format_trusted_line(tag: str, nonce: str, payload: dict[str, Any]) -> str:
    return f"{tag} {nonce} {json.dumps(payload, separators=(',', ':'), sort_keys=True)}"


@dataclass(frozen=True)
class ScoreReading:
    """The outcome of reading an evaluator's log: a valid score, or why there is none."""

    score: float
    valid: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


NO_SCORE_LINE = "the evaluator printed no score line"  # ScoreReading.reason


def read_score(lines: Iterable[str], nonce: str) -> ScoreReading:
    """Exactly one valid score line with a finite `score` in [0, 1]; otherwise invalid, score 0."""
    payloads = trusted_payloads(lines, SCORE_TAG, nonce)
    if not payloads:
        return ScoreReading(0.0, False, NO_SCORE_LINE)
    if len(payloads) > 1:
        return ScoreReading(0.0, False, f"the evaluator printed {len(payloads)} score lines")
    payload = payloads[0]
    score = payload.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return ScoreReading(0.0, False, f"the score line's score is not a number: {score!r}")
    if not 0.0 <= score <= 1.0:
        return ScoreReading(0.0, False, f"the score {score} is outside [0, 1]")
    details = {k: v for k, v in payload.items() if k != "score"}
    return ScoreReading(float(score), True, "", details)
