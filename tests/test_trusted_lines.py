"""Reading trusted log lines: only the job's nonce counts, exactly one valid score line."""

from __future__ import annotations

import pytest

from job_launcher.trusted_lines import (
    LAUNCHER_TAG,
    MAX_TRUSTED_LINE_CHARS,
    SCORE_TAG,
    format_trusted_line,
    read_score,
    trusted_payloads,
)

NONCE = "n" * 32


def score_line(score: object, nonce: str = NONCE) -> str:
    return format_trusted_line(SCORE_TAG, nonce, {"score": score, "split": "hidden"})


def test_one_valid_score_line_is_the_score_with_its_details() -> None:
    reading = read_score(["training done", score_line(0.625)], NONCE)
    assert reading.valid and reading.score == 0.625 and reading.details == {"split": "hidden"}


def test_a_score_line_without_the_jobs_nonce_is_ignored() -> None:
    reading = read_score([score_line(1.0, nonce="forged")], NONCE)
    assert not reading.valid and reading.score == 0.0 and "no score line" in reading.reason
    assert read_score([score_line(1.0, nonce="forged"), score_line(0.5)], NONCE).score == 0.5


def test_two_valid_score_lines_are_invalid_and_score_0() -> None:
    reading = read_score([score_line(0.5), score_line(0.5)], NONCE)
    assert not reading.valid and reading.score == 0.0 and "2 score lines" in reading.reason


@pytest.mark.parametrize("score", [1.5, -0.1, float("nan"), float("inf"), "0.9", True, None])
def test_a_score_outside_0_1_or_not_a_number_is_invalid(score: object) -> None:
    reading = read_score([score_line(score)], NONCE)
    assert not reading.valid and reading.score == 0.0


def test_the_bounds_0_and_1_are_valid_scores() -> None:
    assert read_score([score_line(0)], NONCE).valid
    assert read_score([score_line(1)], NONCE).score == 1.0


def test_garbage_and_overlong_lines_are_not_trusted() -> None:
    long_line = score_line(0.5) + " " * MAX_TRUSTED_LINE_CHARS
    lines = [
        f"{SCORE_TAG} {NONCE} not-json",
        f"{SCORE_TAG} {NONCE} [0.5]",
        long_line,
        f"prefix {score_line(0.5)}",
    ]
    assert trusted_payloads(lines, SCORE_TAG, NONCE) == []


def test_launcher_and_score_lines_are_told_apart() -> None:
    lines = [
        format_trusted_line(LAUNCHER_TAG, NONCE, {"stage": "exit", "exit_code": 0}),
        score_line(0.25),
    ]
    assert trusted_payloads(lines, LAUNCHER_TAG, NONCE) == [{"stage": "exit", "exit_code": 0}]
    assert read_score(lines, NONCE).score == 0.25


def test_an_empty_nonce_is_refused() -> None:
    with pytest.raises(ValueError):
        trusted_payloads([score_line(0.5, nonce="")], SCORE_TAG, "")
