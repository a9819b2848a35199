"""The limits that keep every payload below Temporal's (DESIGN §10): each one, without Temporal."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pydantic_core
import pytest

from activities.jobs.launcher_report import read_launcher_lines
from job_launcher import trusted_lines
from job_launcher.requirements import merged_dependencies, validate_script
from job_launcher.trusted_lines import LAUNCHER_TAG, format_trusted_line
from mcp_gateway.bounds import MalformedJson, parse_json
from mcp_gateway.episode_calls import tool_call
from mcp_gateway.sessions import SessionIds, request_id_of
from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_common.contracts.episodes import Caps, EpisodeSetup
from posttrain_common.contracts.jobs import BackendJob, RepoRef, ScoreResult
from posttrain_common.contracts.retention import cut as retention_cut
from posttrain_common.keys import ServerKey
from posttrain_env.errors import ErrorType, SessionError, ToolError
from posttrain_env.limits import (
    CARRY_BUDGET_BYTES,
    KIB,
    MAX_ANSWER_BYTES,
    MAX_ARGUMENTS_BYTES,
    MAX_CARRY_BYTES,
    MAX_ERROR_DETAIL_CHARS,
    MAX_FLAVOR_CHARS,
    MAX_JOBS_PER_EPISODE,
    MAX_JSON_DEPTH,
    MAX_LAUNCHER_PACKAGES,
    MAX_LOG_ANSWER_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_REQUEST_ID_CHARS,
    MAX_RETENTION_MESSAGE_CHARS,
    MAX_SCORE_DETAILS_BYTES,
    MAX_SCRIPT_BYTES,
    MAX_STEPS,
    MAX_TRUSTED_LINE_CHARS,
    RECENT_RESULTS_BYTES,
    TEMPORAL_PAYLOAD_LIMIT_BYTES,
    bound_log_lines,
    cut_text,
    json_size,
)
from posttrain_env.models import (
    ContaminationSummary,
    EndReason,
    EpisodeEnd,
    FlavorPrice,
    JobState,
    StepMetadata,
    TaskSpec,
)
from posttrain_env.tools import oversized_error, parse_tool_args
from tasks.registry import load_task
from workflows.episode.ledger import Ledger, Reservation, Settlement
from workflows.episode.payload_guard import bounded_answer, carry_bytes, fit_carry
from workflows.episode.recent import recent_bytes, remember, request_hash, was_dropped
from workflows.episode.state import EpisodeCarry, JobRecord

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


def test_a_dependency_of_240_kb_in_a_script_header_is_refused_with_a_small_answer() -> None:
    script = f'# /// script\n# dependencies = ["{"a" * 240_000}"]\n# ///\nprint(1)\n'
    validate_script(script)  # a legal script: its header is the problem
    with pytest.raises(ToolError) as info:
        merged_dependencies(script, [])
    error = info.value
    assert error.type is ErrorType.invalid_dependency
    assert "longer than 256 characters" in error.message  # the reason survives the cut
    assert len(error.details["requirement"]) == MAX_ERROR_DETAIL_CHARS
    assert len(pydantic_core.to_json(error.envelope())) < 2 * KIB


def test_a_tool_error_message_quoting_agent_input_is_cut() -> None:
    error = ToolError(ErrorType.unknown_job, "no job " + "j" * 1_000_000)
    assert len(error.message) == MAX_MESSAGE_CHARS
    with pytest.raises(ToolError) as info:
        parse_tool_args("task_info", {"k" * 100_000: 1})
    assert len(json.dumps(info.value.envelope())) < 2 * MAX_MESSAGE_CHARS


def test_the_launchers_trusted_line_limit_is_the_one_in_the_limits() -> None:
    # job_launcher is self-contained (standard library only): it keeps its own copy.
    assert trusted_lines.MAX_TRUSTED_LINE_CHARS == MAX_TRUSTED_LINE_CHARS


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


def test_a_request_id_is_at_most_200_printable_ascii_characters() -> None:
    assert request_id_of("r" * MAX_REQUEST_ID_CHARS) == "r" * MAX_REQUEST_ID_CHARS
    for bad in ["r" * (MAX_REQUEST_ID_CHARS + 1), "with space", "é"]:
        with pytest.raises(SessionError) as info:
            request_id_of(bad)
        assert info.value.code == "INVALID_REQUEST_ID" and "1-200" in info.value.message


# -- what an operator meets ----------------------------------------------------------------------


def test_a_retention_sweeps_messages_are_cut() -> None:
    assert len(retention_cut("m" * 100_000)) == MAX_RETENTION_MESSAGE_CHARS
    assert retention_cut("short") == "short"


def test_a_job_keeps_at_most_512_installed_versions_for_the_audit() -> None:
    nonce = "n" * 32
    lines = [
        format_trusted_line(
            LAUNCHER_TAG,
            nonce,
            {"stage": "installed", "packages": {f"p{b}-{i}": "1" for i in range(300)}},
        )
        for b in range(3)
    ]
    report = read_launcher_lines(lines, nonce)
    assert len(report.installed) == MAX_LAUNCHER_PACKAGES


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

EMOJI = "\U0001f600"  # four bytes in UTF-8, one character


def _result(n: int, size: int, char: str = "l") -> ToolResult:
    metadata = StepMetadata(episode_id="ep-0", steps_used=n, steps_left=1, time_left_s=1.0)
    return ToolResult(tool="jobs_logs", data={"lines": [char * size], "n": n}, metadata=metadata)


def _setup() -> EpisodeSetup:
    return EpisodeSetup(
        episode_id="ep-0000000000000000",
        task=load_task("t0_artifact"),
        base_model=RepoRef(repo_id="org/model", revision="a" * 40),
        prices={"cpu-basic": FlavorPrice(name="cpu-basic", micro_usd_per_minute=167)},
        watcher_workflow_id="w",
        caps=Caps(account_workflow_id="a"),
    )


def test_recent_results_stay_within_their_budget_and_dropped_ones_are_remembered() -> None:
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    for n in range(20):
        remember(carry, f"r{n}", _result(n, 64 * 1024))
    assert sum(carry.recent_bytes.values()) == recent_bytes(carry) <= RECENT_RESULTS_BYTES
    assert "r19" in carry.recent and "r0" not in carry.recent
    assert was_dropped(carry, "r0") and not was_dropped(carry, "r19")
    assert not was_dropped(carry, "never-sent")
    assert request_hash("r0") in carry.answered and len(carry.answered) == 20 - len(carry.recent)


def test_recent_results_are_counted_in_encoded_bytes_not_characters() -> None:
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    for n in range(60):
        remember(carry, f"r{n}", _result(n, 16 * 1024, EMOJI))  # 64 KiB of UTF-8 each
    kept = sum(len(pydantic_core.to_json(result)) for result in carry.recent.values())
    assert kept <= RECENT_RESULTS_BYTES
    assert len(carry.recent) == RECENT_RESULTS_BYTES // (64 * 1024 + 200)
    assert carry.recent_bytes == {
        rid: len(pydantic_core.to_json(result)) for rid, result in carry.recent.items()
    }


def test_an_answer_larger_than_the_whole_budget_is_answered_once_but_never_kept() -> None:
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    remember(carry, "small", _result(0, 100))
    remember(carry, "huge", _result(1, RECENT_RESULTS_BYTES))
    assert "huge" not in carry.recent and was_dropped(carry, "huge")  # already_answered
    assert "small" in carry.recent  # what was kept before stays


def test_a_carry_from_a_run_that_counted_characters_decodes_and_is_recounted_in_bytes() -> None:
    old = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    old.recent["r0"] = _result(0, 1000, EMOJI)
    recorded = old.model_dump(mode="json", exclude={"recent_bytes"})
    recorded["recent_sizes"] = {"r0": 1000}  # characters, as the earlier code counted
    carry = EpisodeCarry.model_validate(recorded)
    assert carry.recent["r0"] == old.recent["r0"] and carry.recent_bytes == {}
    assert recent_bytes(carry) == len(pydantic_core.to_json(old.recent["r0"])) > 4000


def _worst_case_carry() -> EpisodeCarry:
    """Every part of the carry at its limit, every text in four-byte characters."""
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    details = {"per_item": [EMOJI * 10] * 40}  # just under MAX_SCORE_DETAILS_BYTES as JSON
    for n in range(MAX_JOBS_PER_EPISODE):
        job_id = f"job-{n:012x}"
        final = n >= 4  # a few are live, with their reservations in the ledger
        carry.jobs[job_id] = JobRecord(
            job_id=job_id,
            workflow_id=f"episode-ep-{'0' * 16}/job/{n}",
            role="dev",
            flavor="f" * MAX_FLAVOR_CHARS,
            timeout_minutes=240,
            state=JobState.failed if final else JobState.running,
            final=final,
            message=EMOJI * 1_000_000,  # cut where it enters
            error=ToolError(
                ErrorType.invalid_dependency, EMOJI * 1_000_000, requirement=EMOJI * 240_000
            ).envelope(),
            score=ScoreResult(score=0.5, valid=True, reason=EMOJI * 100_000, details=details)
            if final
            else None,
            settlement=Settlement(
                key=job_id,
                kind="dev",
                running_s=60.0,
                billed_minutes=1,
                cost_micro_usd=1,
                reserved_micro_usd=1,
                overrun_micro_usd=0,
            )
            if final
            else None,
            created_at=NOW,
            started_at=NOW,
            finished_at=NOW,
            evaluated_job_id=job_id,
        )
        if not final:
            carry.ledger.reservations[job_id] = Reservation(
                key=job_id, kind="dev", flavor="f" * 64, micro_usd_per_minute=1, timeout_minutes=1
            )
    for n in range(MAX_STEPS):
        remember(carry, f"{n:0200d}", _result(n, 15_000, EMOJI))  # 60 KB answers
    carry.end = EpisodeEnd(reason=EndReason.submitted, reward=0.5, invalid_score=EMOJI * 10_000)
    return carry


def test_the_largest_episode_carry_is_brought_far_below_temporals_payload_limit() -> None:
    """Every part of the carry is bounded, and the continue-as-new guard makes their sum fit:
    the carried answers go first, then the finished jobs' texts; ids, states and money stay."""
    setup, carry = _setup(), _worst_case_carry()
    assert json_size(carry.jobs["job-000000000000"].message) <= 4 * MAX_MESSAGE_CHARS + 2
    assert recent_bytes(carry) <= RECENT_RESULTS_BYTES
    before = carry_bytes(setup, carry)
    jobs_before = {job_id: (r.state, r.settlement) for job_id, r in carry.jobs.items()}
    answered = {rid for rid in carry.recent}
    after = fit_carry(setup, carry)
    encoded = len(pydantic_core.to_json({"setup": setup, "carry": carry}))
    print(f"worst-case continue-as-new input: {before} bytes before the guard, {encoded} after")
    assert before > TEMPORAL_PAYLOAD_LIMIT_BYTES  # the guard is what makes it fit
    assert encoded == after <= MAX_CARRY_BYTES == CARRY_BUDGET_BYTES
    assert {job_id: (r.state, r.settlement) for job_id, r in carry.jobs.items()} == jobs_before
    assert all(rid in carry.recent or was_dropped(carry, rid) for rid in answered)
    assert carry.ledger.reservations and carry.end is not None


def test_an_ordinary_carry_is_left_as_it_is_by_the_guard() -> None:
    setup = _setup()
    carry = EpisodeCarry(started_at=NOW, ledger=Ledger(budget_micro_usd=1))
    for n in range(MAX_JOBS_PER_EPISODE):
        carry.jobs[f"job-{n}"] = JobRecord(
            job_id=f"job-{n}",
            workflow_id=f"w/{n}",
            role="agent",
            flavor="cpu-basic",
            timeout_minutes=5,
            final=True,
            message="the script exited with status 1 " + "m" * 200,
        )
    for n in range(100):
        remember(carry, f"r{n}", _result(n, 60_000))
    recorded = carry.model_dump()
    assert fit_carry(setup, carry) == carry_bytes(setup, carry) <= MAX_CARRY_BYTES
    assert carry.model_dump() == recorded


def test_an_answer_too_large_to_send_is_replaced_by_a_typed_error_with_its_metadata() -> None:
    small = _result(3, 1000)
    assert bounded_answer(small) is small
    huge = _result(3, MAX_ANSWER_BYTES, EMOJI)
    answer = bounded_answer(huge)
    assert answer.data["error"]["type"] == "limit_reached"
    assert answer.data["error"]["answer_bytes"] == len(pydantic_core.to_json(huge))
    assert answer.metadata == huge.metadata and answer.tool == "jobs_logs"
    assert len(pydantic_core.to_json(answer)) < 4 * KIB


def test_an_answers_metadata_is_bounded_whatever_the_end_says() -> None:
    """An answer is its data (bounded per tool) and this metadata, bounded here."""
    metadata = StepMetadata(
        episode_id="ep-" + "0" * 16,
        steps_used=MAX_STEPS,
        steps_left=MAX_STEPS,
        time_left_s=1e12,
        prices_simulated=True,
        episode_end=EpisodeEnd(
            reason=EndReason.score_failed,
            reward=0.0,
            invalid_score=EMOJI * 1_000_000,
            contamination=ContaminationSummary(
                checked=True, flagged=True, matched_items=10**9, skipped="check_failed"
            ),
        ),
    )
    assert len(pydantic_core.to_json(metadata)) < 4 * MAX_MESSAGE_CHARS + 1 * KIB
