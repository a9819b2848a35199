"""The task's reference solution as an agent, for smoke runs: submit the reference script as a
job, wait for it, dev-evaluate it, submit it. A campaign of these measures the machinery (every
rollout should score its task's reference reward), not an agent. It lives beside the tasks it
reads (`agent = "reference"` names it), not in `posttrain_env.agents`, which sits below them.

    {agent = "reference", args = {flavor = "cpu-basic", timeout_minutes = 10}}
"""

from __future__ import annotations

from pathlib import Path

from posttrain_env.agents.conversation import AgentError, Conversation, Turn
from posttrain_env.agents.scripted import JOB, ScriptedAgent, ScriptStep

REFERENCE_FILE = "reference_solution.py"
DEFAULT_TIMEOUT_MINUTES = 10


def reference_script(task_folder: str, tasks_dir: Path | None = None) -> str:
    """The reference solution of the task whose folder is `task_folder`. Raises AgentError."""
    if tasks_dir is None:
        from tasks.registry import TASKS_DIR

        tasks_dir = TASKS_DIR
    path = tasks_dir / task_folder / REFERENCE_FILE
    if not task_folder.replace("_", "").isalnum() or not path.is_file():
        raise AgentError(f"task folder {task_folder!r} has no {REFERENCE_FILE}")
    return path.read_text(encoding="utf-8")


class ReferenceAgent:
    def __init__(
        self, flavor: str | None = None, timeout_minutes: int = DEFAULT_TIMEOUT_MINUTES
    ) -> None:
        if timeout_minutes <= 0:
            raise ValueError("timeout_minutes must be positive")
        self.flavor = flavor
        self.timeout_minutes = timeout_minutes

    async def act(self, conversation: Conversation) -> Turn:
        brief = conversation.brief
        flavors = [f["name"] for f in brief.limits.get("flavors", []) if "name" in f]
        flavor = self.flavor or (flavors[0] if flavors else "cpu-basic")
        minutes = min(self.timeout_minutes, int(brief.limits.get("max_timeout_minutes", 10**6)))
        script = reference_script(brief.reference_task)
        steps = [
            ScriptStep(
                tool="jobs_submit",
                arguments={"script": script, "flavor": flavor, "timeout_minutes": minutes},
            ),
            ScriptStep(wait=True),
            ScriptStep(tool="dev_evaluate", arguments={"job_id": JOB}),
            ScriptStep(tool="submit", arguments={"job_id": JOB}),
        ]
        return await ScriptedAgent(steps).act(conversation)
