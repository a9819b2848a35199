"""An agent that replays a list of tool calls (tests, smoke runs, baselines).

    {agent = "scripted", args = {calls = [
        {tool = "jobs_submit", arguments = {script = "...", flavor = "cpu-basic",
                                            timeout_minutes = 5}},
        {wait = true},                          # jobs_wait on $job until it ended
        {tool = "submit", arguments = {job_id = "$job"}},
    ]}}

The string `"$job"` anywhere in arguments stands for the job id of the latest `jobs_submit`
answer. `{wait = true}` repeats `jobs_wait` on that job until it is no longer queued or running;
`{stop = true}` stops (as does the end of the list); `{fail = "why"}` fails the turn, as a
crashing agent would. The agent keeps no state: where it is in its list is read back from the
conversation, so a turn replayed after a crash makes the same call.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain_env.agents.conversation import AgentError, Conversation, Message, Turn

JOB = "$job"
LIVE_STATES = frozenset({"queued", "running", "cancelling"})
WAIT_TIMEOUT_S = 600


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    wait: bool = False
    stop: bool = False
    fail: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptStep:
        kinds = [self.tool is not None, self.wait, self.stop, self.fail is not None]
        if sum(kinds) != 1:
            raise ValueError("a step is exactly one of: tool (with arguments), wait, stop, fail")
        return self


class ScriptedAgent:
    def __init__(self, calls: list[dict[str, Any]] | list[ScriptStep]) -> None:
        self.steps = [ScriptStep.model_validate(step) for step in calls]

    async def act(self, conversation: Conversation) -> Turn:
        position, job_id = self._replay(conversation)
        number = len(conversation.turns()) + 1
        if position >= len(self.steps):
            return Turn.stop("the script is over")
        step = self.steps[position]
        if step.stop:
            return Turn.stop("the script stops here")
        if step.fail is not None:
            raise AgentError(step.fail)
        if step.wait:
            if job_id is None:
                raise AgentError("a wait step before any jobs_submit")
            arguments = {"job_id": job_id, "timeout_s": WAIT_TIMEOUT_S}
            return Turn.call("jobs_wait", arguments, f"call-{number}")
        assert step.tool is not None
        return Turn.call(step.tool, _substitute(step.arguments, job_id), f"call-{number}")

    def _replay(self, conversation: Conversation) -> tuple[int, str | None]:
        """Where the script stands after the conversation so far, and the latest job id."""
        answers = {m.call_id: m for m in conversation.answers()}
        position, job_id = 0, None
        for turn in conversation.turns():
            for call in turn.calls:
                answer = answers.get(call.id)
                job_id = _job_id(call.tool, answer) or job_id
                step = self.steps[position] if position < len(self.steps) else None
                if step is not None and step.wait and _still_live(answer):
                    continue  # the wait goes on
                position += 1
        return position, job_id


def _job_id(tool: str, answer: Message | None) -> str | None:
    if tool != "jobs_submit" or answer is None or not answer.data:
        return None
    job_id = answer.data.get("job_id")
    return job_id if isinstance(job_id, str) else None


def _still_live(answer: Message | None) -> bool:
    if answer is None or answer.done or not answer.data or "error" in answer.data:
        return False
    return answer.data.get("state") in LIVE_STATES


def _substitute(value: Any, job_id: str | None) -> Any:
    if value == JOB:
        if job_id is None:
            raise AgentError("the script names $job before any jobs_submit answered one")
        return job_id
    if isinstance(value, dict):
        return {key: _substitute(item, job_id) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, job_id) for item in value]
    return value
