"""What the gateway, the session and a rollout say to an episode, and what it answers (pure).

Ground code (`posttrain_env` only): the gateway, the workflows and the activities all use these
(a rollout's tool calls are sent by an activity), and none of them loads another layer's code for
it. Every field added later gets a default, so that histories and carried state of running
episodes still decode (docs/development.md, "Changing workflow code").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pydantic_core
from pydantic import BaseModel, Field

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    DEFAULT_JOBS_PAGE,
    MAX_ARGUMENTS_BYTES,
    MAX_CURSOR_CHARS,
    MAX_JOBS_PAGE,
    MAX_REQUEST_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
)
from posttrain_env.models import EndReason, EpisodeEnd, ServiceSpend, StepMetadata, ToolPath


def episode_over(end: EpisodeEnd | None) -> ToolError:
    """The answer to a call after the end, as the episode gives it: how it ended. The edge adds
    what to do next on its path (`worded_for`)."""
    ended = f" (it ended: {end.reason.value})" if end is not None else ""
    return ToolError(ErrorType.episode_over, f"the episode is over{ended}")


def next_step(path: ToolPath) -> str:
    """What to do once the episode is over, on `path` (an MCP-only client has no reset)."""
    if path == "mcp":
        return "GET /episodes/<episode_id> shows its end and spend; POST /episodes starts another"
    if path == "rollout":
        return "the rollout is over"
    return "call reset to start another"


class Oversized(BaseModel):
    """Stands in for arguments the edge refused to send for their size (DESIGN §10)."""

    field: str = Field(max_length=MAX_TOOL_NAME_CHARS)  # the largest argument, or "tool_name"
    bytes: int  # its size as JSON
    total_bytes: int  # all the arguments' size as JSON


class ToolCall(BaseModel):
    """One tool call, from any path. The update id is `<episode_id>:<request_id>`.

    Built by the edge (`tool_call` below), which measures the arguments: over
    MAX_ARGUMENTS_BYTES they are replaced by `oversized` and the episode answers a typed error,
    so no update ever comes near Temporal's payload limit. Arguments that are not UTF-8 (a lone
    surrogate, which JSON's `\\ud800` escape can carry) cannot be sent at all: they are replaced
    by `unencodable`, the argument that holds one, and the episode answers a typed error too."""

    request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS)
    tool: str = Field(max_length=MAX_TOOL_NAME_CHARS)
    arguments: dict[str, Any] = Field(default_factory=dict)
    path: ToolPath = "step"
    oversized: Oversized | None = None
    unencodable: str | None = Field(default=None, max_length=MAX_TOOL_NAME_CHARS)
    # A workflow to signal (`ToolAnswered`) once the call is answered: a rollout, which reads the
    # answer through `result_of` instead of holding an activity open for a whole `jobs_wait`.
    # Unset for every other caller, so recorded histories replay unchanged.
    reply_to: str | None = None


class ToolAnswered(BaseModel):
    """Sent to a call's `reply_to` when the episode has answered it."""

    request_id: str


class ToolResult(BaseModel):
    tool: str
    data: dict[str, Any]  # the tool's answer, or {"error": {...}}
    done: bool = False
    reward: float | None = None  # the episode's reward once it is done (step path only)
    metadata: StepMetadata

    def worded_for(self, path: ToolPath) -> ToolResult:
        """This answer as `path` gives it: an `episode_over` error ends with what to do next on
        that path. An answer the episode gave before this wording moved to the edge (recorded,
        and answered again for a retried update) already ends with it and is left as it is."""
        error = self.data.get("error")
        if not (isinstance(error, dict) and error.get("type") == ErrorType.episode_over.value):
            return self
        hint = next_step(path)
        message = str(error.get("message", ""))
        if message.endswith(hint):
            return self
        worded = {**error, "message": f"{message}; {hint}"}
        return self.model_copy(update={"data": {**self.data, "error": worded}})


class EndRequest(BaseModel):
    # reset or cancelled (reward None); abandoned (reward 0): a rollout's agent stopped without
    # submitting, ran out of turns or passed its LLM cap.
    reason: EndReason
    # The session to tell when every job is final, or when cancel_confirm_s passed without it.
    reply_to: str | None = None


class EpisodeClosed(BaseModel):
    """Sent to the session: the episode ended; `unconfirmed` names jobs still not cancelled."""

    episode_id: str
    end: EpisodeEnd
    service_spend: ServiceSpend
    unconfirmed: list[str] = []


class JobsPage(BaseModel):
    """Which page of an episode's jobs the `status` query answers: the first without a cursor,
    else the one the last page's `jobs_next_cursor` names."""

    cursor: str | None = Field(default=None, max_length=MAX_CURSOR_CHARS)
    limit: int = Field(default=DEFAULT_JOBS_PAGE, ge=1, le=MAX_JOBS_PAGE)


class EpisodeStatus(BaseModel):
    episode_id: str
    task_id: str
    steps_used: int
    steps_left: int
    time_left_s: float
    done: bool
    end: EpisodeEnd | None
    service_spend: ServiceSpend
    # A page of the episode's jobs (evaluations included), oldest first: the first unless the
    # query named another (`JobsPage`). Every job until workers paged it (issue 27): a status
    # from such a worker has no `jobs_total`.
    jobs: list[dict[str, Any]]
    cancelling: list[str]
    metadata: StepMetadata | None = None  # what an answer given now would carry
    # When the episode ends by its clock (None once it ended, or from a worker older than this
    # field). `status` is a query, and a query's `workflow.now()` is the time of the workflow's
    # last task, not now: `time_left_s` is then stale, and a reader takes `as_of(now)`.
    deadline: datetime | None = None
    # Jobs of the episode in all, and the cursor of the next page (None on the last page).
    jobs_total: int | None = None
    jobs_next_cursor: str | None = None

    def as_of(self, now: datetime) -> EpisodeStatus:
        """This status with the time left as of `now` (the reader's clock). Unchanged when the
        episode is done or its deadline is unknown."""
        if self.done or self.deadline is None:
            return self
        left = max(0.0, (self.deadline - now).total_seconds())
        metadata = self.metadata
        if metadata is not None:
            metadata = metadata.model_copy(update={"time_left_s": round(left, 3)})
        return self.model_copy(update={"time_left_s": left, "metadata": metadata})


def tool_call(
    request_id: str,
    tool: str,
    arguments: dict[str, Any],
    path: ToolPath,
    reply_to: str | None = None,
) -> ToolCall:
    """The call as the episode receives it. Arguments over MAX_ARGUMENTS_BYTES (measured as the
    data converter encodes them: JSON) are replaced by a small stand-in, so the episode counts
    the step and answers a typed error while nothing large ever reaches Temporal."""
    if not _encodes(tool):  # no tool has such a name: the episode answers "unknown tool"
        tool = tool.encode("utf-8", "backslashreplace").decode("utf-8")
    name_bytes = len(tool.encode("utf-8", "replace"))
    if len(tool) > MAX_TOOL_NAME_CHARS:
        return ToolCall(
            request_id=request_id,
            tool=tool[:MAX_TOOL_NAME_CHARS],
            path=path,
            reply_to=reply_to,
            oversized=Oversized(field="tool_name", bytes=name_bytes, total_bytes=name_bytes),
        )
    try:
        total = len(pydantic_core.to_json(arguments))
    except pydantic_core.PydanticSerializationError:  # a lone surrogate: not UTF-8
        return ToolCall(
            request_id=request_id,
            tool=tool,
            path=path,
            reply_to=reply_to,
            unencodable=_unencodable_argument(arguments)[:MAX_TOOL_NAME_CHARS],
        )
    if total <= MAX_ARGUMENTS_BYTES:
        return ToolCall(
            request_id=request_id, tool=tool, arguments=arguments, path=path, reply_to=reply_to
        )
    sizes = {key: len(pydantic_core.to_json(value)) for key, value in arguments.items()}
    largest = max(sizes, key=lambda key: sizes[key])
    return ToolCall(
        request_id=request_id,
        tool=tool,
        path=path,
        reply_to=reply_to,
        oversized=Oversized(
            field=largest[:MAX_TOOL_NAME_CHARS], bytes=sizes[largest], total_bytes=total
        ),
    )


def _encodes(text: str) -> bool:
    """True when `text` is UTF-8 encodable (holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unencodable_argument(arguments: dict[str, Any]) -> str:
    """The first argument of `arguments` (which do not encode) that holds a lone surrogate, in
    its key (then named with the surrogate escaped) or anywhere in its value."""
    for key, value in arguments.items():
        if not _encodes(key):
            return key.encode("utf-8", "backslashreplace").decode("utf-8")
        try:
            pydantic_core.to_json(value)
        except pydantic_core.PydanticSerializationError:
            return key
    return ""  # no single argument failed: the arguments as a whole
