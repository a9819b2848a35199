"""The episode's last guard on what it hands to Temporal: an update's answer and the
continue-as-new input, measured as the data converter encodes them (DESIGN §10).

Both are bounded far below Temporal's 2 MiB payload limit by construction (every text is cut
where it enters, answers are cut to their limits, the carried answers have their budget). A
payload over that limit is not refused cleanly: the worker fails the workflow task in a loop and
the episode is wedged (FACTS.md). So, should a sum of bounded parts ever come near it, the
episode degrades instead, and says so in the worker's log:

- an answer over MAX_ANSWER_BYTES is replaced by a typed error (`limit_reached`), the call's
  effects standing;
- a continue-as-new input over MAX_CARRY_BYTES first drops its carried answers (oldest first;
  their requests stay answered, `already_answered`), then shortens the texts of its finished
  jobs (oldest first) to COMPACT_JOB_TEXT_CHARS and replaces their evaluator details by a note,
  then, if that is not enough, to MIN_JOB_TEXT_CHARS with only their errors' type and message,
  then shortens the texts of the contamination check's evidence (kept for the audit record).
  Ids, states, money and counts are never touched.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from posttrain_common.contracts.contamination import ContaminationReport
from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_common.contracts.episodes import EpisodeSetup
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    COMPACT_JOB_TEXT_CHARS,
    MAX_ANSWER_BYTES,
    MAX_CARRY_BYTES,
    MIN_JOB_TEXT_CHARS,
    cut_text,
)
from workflows.episode.recent import drop_oldest
from workflows.episode.recent import encoded_bytes as encoded
from workflows.episode.state import EpisodeCarry, JobRecord

# `{"setup":<setup>,"carry":<carry>}`: what the episode's input adds around its two parts.
_INPUT_OVERHEAD = len('{"setup":,"carry":}')


def bounded_answer(result: ToolResult, limit: int | None = None) -> ToolResult:
    """`result`, or, when it would take more than `limit` bytes (MAX_ANSWER_BYTES), the same
    answer (metadata, end, reward) whose data is a typed `limit_reached` error: an answer that
    large would wedge the episode instead of reaching its caller."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    size = encoded(result)
    if size <= limit:
        return result
    _warn(f"the answer to {result.tool} took {size} bytes encoded; replaced by an error")
    error = ToolError(
        ErrorType.limit_reached,
        f"the answer to {result.tool} took {size} bytes, more than the {limit} an answer may "
        "take; the call was made and its effects stand. Ask for less (jobs_status with a "
        "job_id, jobs_logs with a smaller tail).",
        answer_bytes=size,
    )
    return result.model_copy(update={"data": error.envelope()})


def carry_bytes(setup: EpisodeSetup, carry: EpisodeCarry) -> int:
    """Bytes of the continue-as-new input `EpisodeInput(setup, carry)`, encoded."""
    return _INPUT_OVERHEAD + encoded(setup) + encoded(carry)


def fit_carry(setup: EpisodeSetup, carry: EpisodeCarry, limit: int | None = None) -> int:
    """Shrink `carry` until the continue-as-new input takes at most `limit` bytes
    (MAX_CARRY_BYTES; see the module's docstring); the input's size then. Nothing changes when
    it already fits."""
    limit = MAX_CARRY_BYTES if limit is None else limit
    size = carry_bytes(setup, carry)
    if size <= limit:
        return size
    before, kept = size, len(carry.recent)
    while size > limit and carry.recent:
        # An estimate from below (the key and the hash left in `answered` are not counted):
        # measured again once it says the input fits.
        while size > limit and carry.recent:
            size -= drop_oldest(carry)
        size = carry_bytes(setup, carry)
    compacted = 0
    # Oldest finished jobs first, at COMPACT_JOB_TEXT_CHARS; then, should every one of them be
    # shortened and the input still not fit, again at MIN_JOB_TEXT_CHARS.
    for chars in (COMPACT_JOB_TEXT_CHARS, MIN_JOB_TEXT_CHARS):
        for record in carry.jobs.values():  # in the order the jobs were started
            if size <= limit:
                break
            if not record.final:
                continue
            was = encoded(record)
            compact(record, chars)
            size -= was - encoded(record)
            compacted += 1
    report = carry.contamination
    if size > limit and report is not None and report.evidence is not None:
        carry.contamination = ContaminationReport.model_validate(
            _compact_value(report.model_dump(mode="json"))
        )
    size = carry_bytes(setup, carry)
    _warn(
        f"the continue-as-new input took {before} bytes encoded, over {limit}: dropped "
        f"{kept - len(carry.recent)} carried answers and shortened {compacted} finished jobs' "
        f"texts; it takes {size} bytes now"
    )
    return size


def compact(record: JobRecord, chars: int = COMPACT_JOB_TEXT_CHARS) -> None:
    """Shorten a finished job's texts: its message, error and evaluator reason to `chars`
    characters, its evaluator details to a note. Below COMPACT_JOB_TEXT_CHARS, its error keeps
    only its type and message (the other fields quote what the agent sent)."""
    record.message = cut_text(record.message, chars)
    if record.error is not None:
        error = record.error
        if chars < COMPACT_JOB_TEXT_CHARS:
            error = _type_and_message(error)
        record.error = _compact_value(error, chars)
    if record.score is not None:
        details = record.score.details
        record.score = record.score.model_copy(
            update={
                "reason": cut_text(record.score.reason, chars),
                "details": {"details_cut": "shortened to keep the episode's state small"}
                if details
                else {},
            }
        )


def _compact_value(value: Any, chars: int = COMPACT_JOB_TEXT_CHARS) -> Any:
    if isinstance(value, str):
        return cut_text(value, chars)
    if isinstance(value, dict):
        return {cut_text(str(k), chars): _compact_value(v, chars) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact_value(v, chars) for v in value]
    return value


def _type_and_message(envelope: dict[str, Any]) -> dict[str, Any]:
    """A tool error's envelope (`{"error": {...}}`) with only its type and message."""
    inner = envelope.get("error")
    if not isinstance(inner, dict):
        return envelope
    return {"error": {k: v for k, v in inner.items() if k in ("type", "message")}}


def _warn(message: str) -> None:
    if workflow.in_workflow():
        workflow.logger.warning(message)
