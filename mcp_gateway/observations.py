"""The OpenEnv wire shapes of our answers, built with openenv's own pydantic models.

Every observation carries its metadata twice: inside the observation (openenv-core 0.3 clients
read it only there) and at the top level of the reply (openenv 0.10 reads it there first). A
tool call's `result` keeps the shape clients read, `result["data"]` being the tool's answer;
tool errors are data inside it, and `observation.error` stays for transport failures.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_gateway.wire import CallToolObservation, ListToolsObservation, Observation, Tool
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolResult
from posttrain_env.errors import is_error
from posttrain_env.models import ServiceSpend
from posttrain_env.tools import tool_catalog
from workflows.episode.session import ResetResult


def tool_result_body(result: ToolResult) -> dict[str, Any]:
    """A tool's answer as a `tools/call` result of OpenEnv's `/mcp` (`data` is what OpenEnv
    clients read); no reward or spend on this path."""
    return {
        "content": [{"type": "text", "text": json.dumps(result.data, separators=(",", ":"))}],
        "structured_content": result.data,
        "data": result.data,
        "is_error": is_error(result.data),
        "meta": result.metadata.view("openenv_mcp"),
    }


def wire(observation: Observation) -> dict[str, Any]:
    """`{"observation", "reward", "done", "metadata"}` as openenv's serializer shapes it, but
    with the metadata kept inside the observation as well."""
    return {
        "observation": observation.model_dump(mode="json", exclude={"reward", "done"}),
        "reward": observation.reward,
        "done": observation.done,
        "metadata": observation.metadata,
    }


def tool_observation(result: ToolResult) -> dict[str, Any]:
    """A `step`'s observation: the answer with its reward and everything the episode reports."""
    metadata = result.metadata.view("step")
    return wire(
        CallToolObservation(
            tool_name=result.tool,
            result={**tool_result_body(result), "meta": metadata},
            done=result.done,
            reward=result.reward,
            metadata=metadata,
        )
    )


def tools_observation() -> dict[str, Any]:
    return wire(ListToolsObservation(tools=[Tool(**tool) for tool in tool_catalog()]))


def reset_metadata(
    reset: ResetResult, *, session_id: str | None, episode_token: str, mcp_url: str
) -> dict[str, Any]:
    setup = reset.setup
    task = setup.task
    metadata: dict[str, Any] = {
        "episode_id": reset.episode_id,
        "prompt": task.prompt,
        "task": task.limits_view(setup.prices),
        "base_model": setup.base_model.model_dump(),
        "episode_token": episode_token,
        "mcp_url": mcp_url,
        "steps_used": 0,
        "steps_left": task.max_steps,
        "time_left_s": float(task.time_limit_s),
        "service_spend": ServiceSpend().model_dump(mode="json"),
    }
    if setup.prices_simulated:
        metadata["prices_simulated"] = True
    if session_id is not None:  # HTTP /reset: the caller needs it for /step and /state
        metadata["session_id"] = session_id
    return metadata


def reset_observation(metadata: dict[str, Any]) -> dict[str, Any]:
    return wire(Observation(metadata=metadata))


def state_body(status: EpisodeStatus | None) -> dict[str, Any]:
    """OpenEnv `State` (episode_id, step_count) plus what the episode reports about itself."""
    if status is None:
        return {"episode_id": None, "step_count": 0}
    return {
        "episode_id": status.episode_id,
        "step_count": status.steps_used,
        "task_id": status.task_id,
        "steps_left": status.steps_left,
        "time_left_s": status.time_left_s,
        "done": status.done,
        "episode_end": status.end.view() if status.end else None,
        "service_spend": status.service_spend.model_dump(mode="json"),
        # The first page of the jobs (jobs_status pages through the rest).
        "jobs": status.jobs,
        "jobs_total": status.jobs_total,
    }
