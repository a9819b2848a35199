"""The contract's argument limits (DESIGN §9): each limit accepted at the edge, refused past it."""

from __future__ import annotations

import pytest

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import (
    MAX_DATASETS,
    MAX_DEPENDENCIES,
    MAX_LOG_TAIL,
    MAX_SCRIPT_BYTES,
    MAX_WAIT_TIMEOUT_S,
)
from posttrain_env.tools import parse_tool_args

SUBMIT = {"script": "pass\n", "flavor": "cpu-basic", "timeout_minutes": 5}


def error_type(tool: str, arguments: dict) -> ErrorType:
    with pytest.raises(ToolError) as refused:
        parse_tool_args(tool, arguments)
    assert refused.value.message
    return refused.value.type


@pytest.mark.parametrize(
    ("field", "at_limit", "past_limit", "expected"),
    [
        (
            "script",
            "#" * (MAX_SCRIPT_BYTES - 1) + "\n",
            "#" * MAX_SCRIPT_BYTES + "\n",
            ErrorType.invalid_script,
        ),
        (
            "dependencies",
            ["six"] * MAX_DEPENDENCIES,
            ["six"] * (MAX_DEPENDENCIES + 1),
            ErrorType.invalid_dependency,
        ),
        (
            "datasets",
            ["o/d"] * MAX_DATASETS,
            ["o/d"] * (MAX_DATASETS + 1),
            ErrorType.dataset_not_allowed,
        ),
    ],
)
def test_jobs_submit_limits(
    field: str, at_limit: object, past_limit: object, expected: ErrorType
) -> None:
    parse_tool_args("jobs_submit", {**SUBMIT, field: at_limit})
    assert error_type("jobs_submit", {**SUBMIT, field: past_limit}) is expected


def test_the_script_limit_counts_utf8_bytes_not_characters() -> None:
    script = "#" + "é" * (MAX_SCRIPT_BYTES // 2)  # fewer characters than the limit, more bytes
    assert error_type("jobs_submit", {**SUBMIT, "script": script}) is ErrorType.invalid_script


def test_jobs_wait_and_logs_limits() -> None:
    parse_tool_args("jobs_wait", {"job_id": "job-1", "timeout_s": MAX_WAIT_TIMEOUT_S})
    assert (
        error_type("jobs_wait", {"job_id": "job-1", "timeout_s": MAX_WAIT_TIMEOUT_S + 1})
        is ErrorType.invalid_argument
    )
    parse_tool_args("jobs_logs", {"job_id": "job-1", "tail": MAX_LOG_TAIL})
    assert (
        error_type("jobs_logs", {"job_id": "job-1", "tail": MAX_LOG_TAIL + 1})
        is ErrorType.invalid_argument
    )


def test_defaults_and_unknown_keys() -> None:
    wait = parse_tool_args("jobs_wait", {"job_id": "job-1"})
    assert wait.model_dump() == {"job_id": "job-1", "timeout_s": 300}
    assert parse_tool_args("jobs_logs", {"job_id": "job-1"}).model_dump()["tail"] == 200
    assert error_type("task_info", {"x": 1}) is ErrorType.invalid_argument
    assert (
        error_type("jobs_submit", {**SUBMIT, "timeout_minutes": "5 min"})
        is ErrorType.timeout_not_allowed
    )
    assert error_type("nope", {}) is ErrorType.invalid_argument


def test_the_error_envelope_round_trips() -> None:
    error = ToolError(ErrorType.unknown_job, "no such job", job_id="job-1")
    assert error.envelope() == {
        "error": {"type": "unknown_job", "message": "no such job", "job_id": "job-1"}
    }
    again = ToolError.from_envelope(error.envelope())
    assert (again.type, again.message, again.details) == (error.type, error.message, error.details)


def test_the_error_enum_is_the_specs_twelve_plus_our_three() -> None:
    # Ours: invalid_argument, already_answered, not_recorded (the replay backend).
    assert {t.value for t in ErrorType} == {
        "budget_exhausted",
        "flavor_not_allowed",
        "timeout_not_allowed",
        "invalid_script",
        "invalid_dependency",
        "dataset_not_allowed",
        "limit_reached",
        "not_ready",
        "unknown_job",
        "not_allowed",
        "episode_over",
        "hf_error",
        "invalid_argument",
        "already_answered",
        "not_recorded",
    }
