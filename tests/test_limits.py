"""The limits that keep every payload below Temporal's (DESIGN §10): each one, without Temporal."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pydantic_core
import pytest

from job_launcher.requirements import validate_script
from mcp_gateway.bounds import MalformedJson, parse_json
from mcp_gateway.episode_calls import tool_call
from mcp_gateway.sessions import SessionIds
from posttrain_env.contracts.jobs import BackendJob, ScoreResult
from posttrain_env.errors import ErrorType, SessionError, ToolError
from posttrain_env.keys import ServerKey
from posttrain_env.limits import (
    MAX_ARGUMENTS_BYTES,
    MAX_JOBS_PER_EPISODE,
    MAX_JSON_DEPTH,
    MAX_LOG_ANSWER_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_SCORE_DETAILS_BYTES,
    MAX_SCRIPT_BYTES,
    MAX_STEPS,
    RECENT_RESULTS_BYTES,
    TEMPORAL_PAYLOAD_LIMIT_BYTES,
    bound_log_lines,
    cut_text,
    json_size,
)
from posttrain_env.models import EndReason, EpisodeEnd, JobState, TaskSpec
from posttrain_env.tools import oversized_error, parse_tool_args
from tasks.registry import load_task
from workflows.episode_contract import StepMetadata, ToolResult
from workflows.episode_state import EpisodeCarry, JobRecord
from workflows.ledger import Ledger
from workflows.recent import remember, request_hash, was_dropped

NOW = datetime(2026, 12, 1, tzinfo=UTC)


# -- jobs_logs ------------------------------------------------------------------------------------


def test_a_5_mb_line_and_2000_lines_of_4_kb_are_answered_within_the_log_limits() -> None:
    lines = ["x" * 5_000_000] + [f"{i:04d}" + "y" * 4_000 for i in range(2000)]
    tail = bound_log_lines(lines, 2000)
    assert json_size(json.dumps(tail.lines)) > 0
    assert len(json.dumps(tail.lines, ensure_ascii=False).encode()) <= MAX_LOG_ANSWER_BYTES
    assert all(json_size(line) <= MAX_LOG_LINE_BYTES for line in tail.lines)
    # The newest lines are the ones kept; the rest of the 2,000 asked for are counted as dropped.
    assert tail.lines[-1].startswith("1999")
    assert tail.dropped_lines == 2000 - len(tail.lines) and tail.dropped_lines > 0
    # The 5 MB line is outside the last 2,000 lines: nothing of a kept line was cut.
    assert tail.cut_bytes == 0


def test_a_long_line_is_cut_and_the_cut_is_counted() -> None:
    tail = bound_log_lines(["short", "z" * 1_000_000], 10)
    assert tail.lines[0] == "short"
    assert json_size(tail.lines[1]) <= MAX_LOG_LINE_BYTES
    assert tail.cut_bytes == 1_000_000 - len(tail.lines[1])
    assert tail.dropped_lines == 0


def test_control_characters_in_a_log_line_count_as_the_json_they_become() -> None:
    tail = bound_log_lines(["\x01" * 4_000], 1)
    # Each \x01 takes six bytes as JSON: far fewer than 4,000 of them fit in a line.
    assert json_size(tail.lines[0]) <= MAX_LOG_LINE_BYTES
    assert len(tail.lines[0]) < 700


# -- messages, reasons and details ---------------------------------------------------------------


def test_text_is_cut_to_its_limit_with_a_marker() -> None:
    long = "a" * (MAX_MESSAGE_CHARS * 1000)
    cut = cut_text(long)
    assert len(cut) == MAX_MESSAGE_CHARS and "cut from" in cut
    assert cut_text("short") == "short"


def test_a_backend_message_of_megabytes_is_cut_where_it_enters() -> None:
    job = BackendJob(
        ref="r", key="k", state=JobState.failed, created_at=NOW, message="m" * 5_000_000
    )
    assert len(job.message) == MAX_MESSAGE_CHARS


def test_an_evaluators_reason_and_large_details_are_bounded() -> None:
    big = {"per_item": ["q" * 100] * 200}
    result = ScoreResult(score=0.5, valid=True, reason="r" * 100_000, details=big)
    assert len(result.reason) == MAX_MESSAGE_CHARS
    assert set(result.details) == {"details_cut"}
    assert len(json.dumps(result.details)) < MAX_SCORE_DETAILS_BYTES
    small = ScoreResult(score=0.5, valid=True, details={"n": 10})
    assert small.details == {"n": 10}


def test_a_tool_error_message_quoting_agent_input_is_cut() -> None:
    error = ToolError(ErrorType.unknown_job, "no job " + "j" * 1_000_000)
    assert len(error.message) == MAX_MESSAGE_CHARS
    with pytest.raises(ToolError) as info:
        parse_tool_args("task_info", {"k" * 100_000: 1})
    assert len(json.dumps(info.value.envelope())) < 2 * MAX_MESSAGE_CHARS


# -- tool arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"script": "x=1\n" * 600_000, "flavor": "cpu-basic", "timeout_minutes": 5}, "script"),
        ({"script": "x" * 20_000_000, "flavor": "cpu-basic", "timeout_minutes": 5}, "script"),
        (
            {
                "script": "print(1)\n",
                "flavor": "cpu-basic",
                "timeout_minutes": 5,
                "dependencies": ["six" * 100] * 7_000,
            },
            "dependencies",
        ),
    ],
)
def test_arguments_over_the_limit_are_replaced_by_a_small_stand_in(
    arguments: dict[str, object], field: str
) -> None:
    call = tool_call("r1", "jobs_submit", arguments, "step")
    assert call.arguments == {}
    assert call.oversized is not None and call.oversized.field == field
    assert call.oversized.total_bytes > MAX_ARGUMENTS_BYTES
    assert len(call.model_dump_json()) < 1_000
    error = oversized_error(call.tool, field, call.oversized.bytes, call.oversized.total_bytes)
    expected = ErrorType.invalid_script if field == "script" else ErrorType.invalid_argument
    assert error.type is expected and field in error.message


def test_arguments_at_the_limit_are_sent_as_they_are() -> None:
    script = "#" * (MAX_ARGUMENTS_BYTES - 100)
    arguments = {"script": script}
    assert len(pydantic_core.to_json(arguments)) <= MAX_ARGUMENTS_BYTES
    call = tool_call("r1", "jobs_submit", arguments, "mcp")
    assert call.oversized is None and call.arguments["script"] == script


def test_a_tool_name_too_long_for_any_tool_is_answered_without_sending_it() -> None:
    call = tool_call("r1", "t" * 5_000_000, {}, "step")
    assert call.oversized is not None and call.oversized.field == "tool_name"
    assert len(call.tool) <= 64
    error = oversized_error(call.tool, "tool_name", call.oversized.bytes, 0)
    assert error.type is ErrorType.invalid_argument


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("\x01" * MAX_SCRIPT_BYTES, "control character"),
        ("print(1)\x1b[31m\n", "control character"),
        ("", "empty"),
        (" \n\t\r\n  ", "empty"),
    ],
)
def test_blank_scripts_and_control_characters_are_invalid_scripts(script: str, needle: str) -> None:
    with pytest.raises(ToolError) as info:
        validate_script(script)
    assert info.value.type is ErrorType.invalid_script and needle in info.value.message


def test_tab_form_feed_and_carriage_return_are_allowed_in_a_script() -> None:
    validate_script("x = 1\t# tab\r\n\x0c\ny = 2\n")


def test_a_script_of_control_characters_would_encode_far_above_its_byte_limit() -> None:
    # Why control characters are refused: 256 KiB of them is 1.5 MB as JSON.
    assert len(pydantic_core.to_json("\x01" * MAX_SCRIPT_BYTES)) > 6 * MAX_SCRIPT_BYTES - 10


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("jobs_status", {"job_id": "j" * 65}, ErrorType.invalid_argument),
        ("jobs_submit", {"script": "x", "flavor": "f" * 65, "timeout_minutes": 1}, None),
        (
            "jobs_submit",
            {"script": "x", "flavor": "cpu-basic", "timeout_minutes": 1, "datasets": ["o/" * 101]},
            ErrorType.dataset_not_allowed,
        ),
        (
            "jobs_submit",
            {
                "script": "x",
                "flavor": "cpu-basic",
                "timeout_minutes": 1,
                "dependencies": ["a" * 257],
            },
            ErrorType.invalid_dependency,
        ),
    ],
)
def test_argument_strings_that_errors_would_quote_are_bounded(
    tool: str, arguments: dict[str, object], error: ErrorType | None
) -> None:
    with pytest.raises(ToolError) as info:
        parse_tool_args(tool, arguments)
    assert info.value.type is (error or ErrorType.flavor_not_allowed)


def test_a_task_may_not_allow_more_steps_than_the_episode_can_remember() -> None:
    spec = load_task("t0_artifact").model_dump()
    assert TaskSpec.model_validate({**spec, "max_steps": MAX_STEPS}).max_steps == MAX_STEPS
    with pytest.raises(ValueError, match="less than or equal"):
        TaskSpec.model_validate({**spec, "max_steps": MAX_STEPS + 1})


# -- JSON nesting --------------------------------------------------------------------------------


def test_json_deeper_than_the_limit_is_malformed_and_never_a_recursion_error() -> None:
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(MalformedJson, match="nested deeper"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(MalformedJson, match="nested deeper"):
        parse_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MalformedJson, match="nested deeper"):
        parse_json('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(MalformedJson, match="invalid JSON"):
        parse_json(b"\xff{")


# -- session ids ---------------------------------------------------------------------------------


def test_only_session_ids_this_deployment_minted_are_accepted() -> None:
    ids = SessionIds(ServerKey(b"k" * 32))
    minted = ids.mint()
    assert ids.check(minted) == minted and len(minted) == 64
    assert ids.mint() != minted
    for invented in ["A" * 22, "0" * 64, minted[:32] + "0" * 32, minted.upper(), 42, None]:
        with pytest.raises(SessionError) as info:
            ids.check(invented)
        assert info.value.code == "INVALID_SESSION"
    other_deployment = SessionIds(ServerKey(b"o" * 32))
    with pytest.raises(SessionError):
        other_deployment.check(minted)


# -- what an episode carries ---------------------------------------------------------------------


def _result(n: int, size: int) -> ToolResult:
    metadata = StepMetadata(episode_id="ep-0", steps_used=n, steps_left=1, time_left_s=1.0)
    return ToolResult(tool="jobs_logs", data={"lines": ["l" * size], "n": n}, metadata=metadata)


def test_recent_results_stay_within_their_budget_and_dropped_ones_are_remembered() -> None:
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    for n in range(20):
        remember(carry, f"r{n}", _result(n, 64 * 1024))
    assert sum(carry.recent_sizes.values()) <= RECENT_RESULTS_BYTES
    assert "r19" in carry.recent and "r0" not in carry.recent
    assert was_dropped(carry, "r0") and not was_dropped(carry, "r19")
    assert not was_dropped(carry, "never-sent")
    assert request_hash("r0") in carry.answered and len(carry.answered) == 20 - len(carry.recent)


def test_the_largest_episode_carry_stays_far_below_temporals_payload_limit() -> None:
    """Every part of the carry is bounded; at their limits together they still fit."""
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    for n in range(MAX_JOBS_PER_EPISODE):
        carry.jobs[f"job-{n:012x}"] = JobRecord(
            job_id=f"job-{n:012x}",
            workflow_id=f"episode-ep-{'0' * 16}/job/{n}",
            role="agent",
            flavor="a10g-small",
            timeout_minutes=240,
            message="m" * 1_000_000,  # cut where it enters
            error=ToolError(ErrorType.hf_error, "e" * 1_000_000).envelope(),
            created_at=NOW,
            started_at=NOW,
            finished_at=NOW,
            evaluated_job_id=f"job-{n:012x}",
        )
    for n in range(MAX_STEPS):
        remember(carry, f"{n:0200d}", _result(n, 60 * 1024))
    carry.end = EpisodeEnd(
        reason=EndReason.submitted, reward=0.5, invalid_score="i" * MAX_MESSAGE_CHARS
    )
    size = len(carry.model_dump_json())
    assert size < TEMPORAL_PAYLOAD_LIMIT_BYTES * 0.75, size
