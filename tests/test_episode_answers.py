"""An episode's answers are the same on every path; the edge words them for its own
(`ToolResult.worded_for`): after the end, what to do next there."""

from __future__ import annotations

import pytest

from posttrain_common.contracts.episode_calls import ToolResult, episode_over, next_step
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import EndReason, EpisodeEnd, StepMetadata, ToolPath

END = EpisodeEnd(reason=EndReason.submitted, reward=0.5)
META = StepMetadata(episode_id="ep-1", steps_used=3, steps_left=0, time_left_s=0.0, episode_end=END)


def answer(data: dict) -> ToolResult:
    return ToolResult(tool="task_info", data=data, done=True, reward=0.5, metadata=META)


def test_the_episode_says_how_it_ended_and_names_no_path() -> None:
    assert episode_over(END).message == "the episode is over (it ended: submitted)"
    assert episode_over(None).message == "the episode is over"


@pytest.mark.parametrize(
    ("path", "hint"),
    [
        ("step", "call reset to start another"),
        ("openenv_mcp", "call reset to start another"),
        (
            "mcp",
            "GET /episodes/<episode_id> shows its end and spend; POST /episodes starts another",
        ),
        ("rollout", "the rollout is over"),
    ],
)
def test_an_episode_over_answer_ends_with_what_to_do_next_on_its_path(
    path: ToolPath, hint: str
) -> None:
    worded = answer(episode_over(END).envelope()).worded_for(path)
    assert worded.data["error"] == {
        "type": "episode_over",
        "message": f"the episode is over (it ended: submitted); {hint}",
    }
    assert next_step(path) == hint
    assert (worded.done, worded.reward, worded.metadata) == (True, 0.5, META)


def test_every_episode_over_error_gets_the_hint_and_keeps_its_details() -> None:
    interrupted = ToolError(ErrorType.episode_over, "the episode ended while it ran", job_id="j")
    worded = answer(interrupted.envelope()).worded_for("step").data["error"]
    assert worded == {
        "type": "episode_over",
        "message": "the episode ended while it ran; call reset to start another",
        "job_id": "j",
    }


def test_other_answers_leave_the_edge_as_the_episode_gave_them() -> None:
    for data in (
        {"task_id": "t0"},
        ToolError(ErrorType.limit_reached, "the step limit is reached").envelope(),
        {"error": "not an envelope"},
    ):
        assert answer(data).worded_for("mcp").data == data


def test_an_answer_worded_by_an_older_episode_is_not_worded_twice() -> None:
    """Before the wording moved to the edge the episode added the hint itself; such an answer
    (recorded, and answered again for a retried update id) passes unchanged."""
    old = {
        "error": {
            "type": "episode_over",
            "message": "the episode is over (it ended: submitted); call reset to start another",
        }
    }
    assert answer(old).worded_for("step").data == old
