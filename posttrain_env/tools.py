"""The tools: the one registry of what an agent can call (name, arguments, description).

Every path (OpenEnv `step`, OpenEnv `/mcp`, the standard MCP endpoint) lists and validates tools
from here, so what an agent reads never drifts apart; the episode binds a handler to each entry
(`workflows/episode/tools.py`, checked by a test). The descriptions are written for the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    DEFAULT_JOBS_PAGE,
    MAX_ARGUMENTS_BYTES,
    MAX_JOBS_PAGE,
    MAX_LOG_ANSWER_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_LOG_TAIL,
    MAX_SCRIPT_BYTES,
    MAX_WAIT_TIMEOUT_S,
    cut_text,
)
from posttrain_env.models import (
    JobIdArgs,
    JobsLogsArgs,
    JobsStatusArgs,
    JobsSubmitArgs,
    JobsWaitArgs,
    NoArgs,
    ToolArgs,
)

A = TypeVar("A", bound=ToolArgs)


@dataclass(frozen=True)
class Tool(Generic[A]):
    name: str
    args: type[A]
    description: str


TASK_INFO = Tool(
    "task_info",
    NoArgs,
    (
        "The task: its prompt, the base model (repo and pinned revision) and the limits of this "
        "episode (max_steps, time_limit_s, budget_usd, max_timeout_minutes, score_timeout_s, "
        "allowed flavors with their price per minute). Where the backend reports them, "
        "job_limits: what one job of each flavor may use (vcpus, memory_bytes, processes, "
        "disk_bytes for /data, /tmp and its packages, files) and any limit not enforced here."
    ),
)
LIST_HARDWARE = Tool(
    "list_hardware",
    NoArgs,
    (
        "The hardware flavors you may use, with their price per minute in USD and micro-USD "
        "and their accelerator."
    ),
)
JOBS_SUBMIT = Tool(
    "jobs_submit",
    JobsSubmitArgs,
    (
        "Start a training job running your Python script. The job has no network: the base model "
        "is mounted read-only at /base_model, each dataset you name at /datasets/<repo_id>, and "
        "whatever the script writes under /data/outputs/ becomes the job's artifact. The price of "
        "flavor x timeout_minutes is reserved from your budget until the job ends; you then pay "
        "for the minutes it really ran. `dependencies` are plain PyPI requirements installed as "
        "wheels before the script starts. The script is UTF-8 Python of at most "
        f"{MAX_SCRIPT_BYTES // 1024} KiB. Returns the job (job_id, state, reserved_usd, ...)."
    ),
)
JOBS_WAIT = Tool(
    "jobs_wait",
    JobsWaitArgs,
    (
        "Wait until the job's state changes or `timeout_s` seconds pass (at most "
        f"{MAX_WAIT_TIMEOUT_S}), then return the job with `changed` telling which happened. "
        "Waiting costs a step but no money. If your client gives up on a tool call sooner than "
        "`timeout_s` (some stop waiting after 5 or 60 s), pass a smaller `timeout_s` and wait "
        "again: the job runs on either way."
    ),
)
JOBS_STATUS = Tool(
    "jobs_status",
    JobsStatusArgs,
    (
        "The current state of one job (job_id), or a page of this episode's jobs, oldest first: "
        f"`limit` jobs at most ({DEFAULT_JOBS_PAGE} unless given, at most {MAX_JOBS_PAGE}). "
        "A page answers `jobs`, `total` (jobs so far) and `next_cursor`: pass it as `cursor` "
        "for the next page; it is null on the last page."
    ),
)
JOBS_LOGS = Tool(
    "jobs_logs",
    JobsLogsArgs,
    (
        f"The last `tail` lines (at most {MAX_LOG_TAIL}) of a job's output, installer included. "
        f"Each line is cut to {MAX_LOG_LINE_BYTES // 1024} KiB and the answer to "
        f"{MAX_LOG_ANSWER_BYTES // 1024} KiB, oldest lines dropped first; `truncated` "
        "(`lines`, `bytes`) says what was cut. Print less, or write details to a file in "
        "/data/outputs."
    ),
)
JOBS_CANCEL = Tool(
    "jobs_cancel",
    JobIdArgs,
    ("Cancel a job. Returns it once the cancellation is confirmed, settled at the minutes it ran."),
)
DEV_EVALUATE = Tool(
    "dev_evaluate",
    JobIdArgs,
    (
        "Score a succeeded job's artifact on the public dev split (an evaluation job charged to "
        "your budget; the number of dev evaluations per episode is limited). Use it to check your "
        "work before you submit. The call lasts as long as the evaluation job (minutes); if your "
        "client gives up sooner, the evaluation goes on: call dev_evaluate again with the same "
        "job_id to wait for its result (that call is no step). A job is evaluated and charged "
        "once."
    ),
)
SUBMIT = Tool(
    "submit",
    JobIdArgs,
    (
        "Submit a succeeded job's artifact. It is scored on a hidden split; that score is your "
        "reward and the episode ends. You can submit only once. The call lasts as long as the "
        "grading job (minutes); if your client gives up sooner, the grading goes on: call "
        "submit again with the same job_id to wait for its result (it is graded once, and that "
        "call is no step, even when no step is left)."
    ),
)

TOOLS: dict[str, Tool[Any]] = {
    tool.name: tool
    for tool in (
        TASK_INFO,
        LIST_HARDWARE,
        JOBS_SUBMIT,
        JOBS_WAIT,
        JOBS_STATUS,
        JOBS_LOGS,
        JOBS_CANCEL,
        DEV_EVALUATE,
        SUBMIT,
    )
}


def tool_catalog() -> list[dict[str, Any]]:
    """Every tool as `{"name", "description", "input_schema"}`, in a fixed order."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.args.model_json_schema(),
        }
        for tool in TOOLS.values()
    ]


def parse_tool_args(tool: str, arguments: dict[str, Any]) -> ToolArgs:
    """Validate a tool call's arguments. Raises ToolError typed by the first failing field."""
    spec = TOOLS.get(tool)
    if spec is None:
        known = ", ".join(TOOLS)
        raise ToolError(ErrorType.invalid_argument, f"unknown tool {tool!r}; tools: {known}")
    model = spec.args
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        first = exc.errors()[0]
        # An unknown key is named in the error: an agent chose it, so it is cut.
        field = cut_text(str(first["loc"][0]), 100) if first["loc"] else ""
        error_type = model.field_error_types.get(field, ErrorType.invalid_argument)
        where = f"argument {field!r}" if field else "arguments"
        raise ToolError(error_type, f"{tool}: {where}: {first['msg']}", field=field) from None


def unencodable_error(tool: str, field: str) -> ToolError:
    """The answer to a call whose argument `field` holds a lone surrogate (a `\\ud800`-style JSON
    escape with no partner): not UTF-8, so the edge could not send it. Typed as that argument's
    errors are (a script: invalid_script)."""
    spec = TOOLS.get(tool)
    error_type = ErrorType.invalid_argument
    if spec is not None:
        error_type = spec.args.field_error_types.get(field, ErrorType.invalid_argument)
    where = f"argument {field!r}" if field else "the arguments"
    return ToolError(
        error_type,
        f"{tool}: {where} holds a lone surrogate (a \\ud800-\\udfff escape without its pair), "
        "which is not UTF-8 text; send the text as UTF-8",
        field=field,
    )


def oversized_error(tool: str, field: str, size: int, total: int) -> ToolError:
    """The answer to a call whose arguments the edge refused to send for their size."""
    if field == "tool_name":
        return ToolError(
            ErrorType.invalid_argument,
            f"the tool name is {size} bytes long; no tool has a name that long",
            field=field,
        )
    if tool == JOBS_SUBMIT.name and field == "script":
        return ToolError(
            ErrorType.invalid_script,
            f"the script is {size} bytes as sent; the limit is {MAX_SCRIPT_BYTES} bytes of "
            "UTF-8. Put large data in a dataset instead of the script.",
            field=field,
            bytes=size,
        )
    return ToolError(
        ErrorType.invalid_argument,
        f"{tool}: the arguments are {total} bytes as sent (argument {field!r}: {size} bytes); "
        f"a tool call's arguments may take at most {MAX_ARGUMENTS_BYTES} bytes",
        field=field,
        bytes=size,
    )
