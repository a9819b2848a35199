"""The nine tools as an agent discovers them: name, description, JSON schema of the arguments.

One catalogue for every path (OpenEnv `step`, OpenEnv `/mcp`, the standard MCP endpoint), so the
descriptions an agent reads never drift apart. The descriptions are written for the agent.
"""

from __future__ import annotations

from typing import Any

from posttrain_env.limits import (
    MAX_LOG_ANSWER_BYTES,
    MAX_LOG_LINE_BYTES,
    MAX_LOG_TAIL,
    MAX_SCRIPT_BYTES,
    MAX_WAIT_TIMEOUT_S,
)
from posttrain_env.models import TOOL_ARGS

TOOL_DESCRIPTIONS: dict[str, str] = {
    "task_info": (
        "The task: its prompt, the base model (repo and pinned revision) and the limits of this "
        "episode (max_steps, time_limit_s, budget_usd, max_timeout_minutes, score_timeout_s, "
        "allowed flavors with their price per minute)."
    ),
    "list_hardware": (
        "The hardware flavors you may use, with their price per minute in USD and micro-USD "
        "and their accelerator."
    ),
    "jobs_submit": (
        "Start a training job running your Python script. The job has no network: the base model "
        "is mounted read-only at /base_model, each dataset you name at /datasets/<repo_id>, and "
        "whatever the script writes under /data/outputs/ becomes the job's artifact. The price of "
        "flavor x timeout_minutes is reserved from your budget until the job ends; you then pay "
        "for the minutes it really ran. `dependencies` are plain PyPI requirements installed as "
        "wheels before the script starts. The script is UTF-8 Python of at most "
        f"{MAX_SCRIPT_BYTES // 1024} KiB. Returns the job (job_id, state, reserved_usd, ...)."
    ),
    "jobs_wait": (
        "Wait until the job's state changes or `timeout_s` seconds pass (at most "
        f"{MAX_WAIT_TIMEOUT_S}), then return the job with `changed` telling which happened. "
        "Waiting costs a step but no money."
    ),
    "jobs_status": "The current state of one job, or of every job of this episode (no job_id).",
    "jobs_logs": (
        f"The last `tail` lines (at most {MAX_LOG_TAIL}) of a job's output, installer included. "
        f"Each line is cut to {MAX_LOG_LINE_BYTES // 1024} KiB and the answer to "
        f"{MAX_LOG_ANSWER_BYTES // 1024} KiB, oldest lines dropped first; `truncated` "
        "(`lines`, `bytes`) says what was cut. Print less, or write details to a file in "
        "/data/outputs."
    ),
    "jobs_cancel": (
        "Cancel a job. Returns it once the cancellation is confirmed, settled at the minutes "
        "it ran."
    ),
    "dev_evaluate": (
        "Score a succeeded job's artifact on the public dev split (an evaluation job charged to "
        "your budget; the number of dev evaluations per episode is limited). Use it to check your "
        "work before you submit."
    ),
    "submit": (
        "Submit a succeeded job's artifact. It is scored on a hidden split; that score is your "
        "reward and the episode ends. You can submit only once."
    ),
}


def tool_catalog() -> list[dict[str, Any]]:
    """Every tool as `{"name", "description", "input_schema"}`, in a fixed order."""
    return [
        {
            "name": name,
            "description": TOOL_DESCRIPTIONS[name],
            "input_schema": args.model_json_schema(),
        }
        for name, args in TOOL_ARGS.items()
    ]
