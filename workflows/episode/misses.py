"""A replay miss at `submit` or `dev_evaluate`, as the episode's end tells it (pure).

The replay backend refuses a job it has no recording for with `ToolError(not_recorded)`, whose
details name the key it looked for and the nearest recorded keys. An agent's own job refused
so is answered to the agent as data (it may try another script); an evaluation refused so ends
the episode `replay_miss`, reward None: the stand-in service cannot tell what the grader would
have said, and that is no grader's fault (`score_failed`) and no measurement.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import MAX_NEAREST_RECORDINGS, NearRecording, ReplayMiss


def replay_miss_of(
    err: ToolError, tool: Literal["submit", "dev_evaluate"], job_id: str
) -> ReplayMiss | None:
    """The miss `err` reports, for the evaluation of agent job `job_id` that `tool` asked for;
    None when `err` is no replay miss."""
    if err.type is not ErrorType.not_recorded:
        return None
    key = err.details.get("key")
    nearest: list[NearRecording] = []
    for near in err.details.get("nearest") or []:
        try:
            nearest.append(NearRecording.model_validate(near))
        except ValidationError:
            continue  # a backend's detail of another shape: the key still says what missed
        if len(nearest) == MAX_NEAREST_RECORDINGS:
            break
    return ReplayMiss(
        tool=tool,
        job_id=job_id,
        key=key if isinstance(key, str) else None,
        nearest=nearest,
        message=err.message,
    )
