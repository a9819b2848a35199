"""Third-party agents for the tests, named as a campaign names them (`tests.campaigns.agents:X`)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from posttrain_env.agents.conversation import Conversation, Turn
from posttrain_env.limits import MAX_AGENT_TURN_BYTES


class Snoop:
    """Reports what its turn's process can see: its environment and working folder."""

    def __init__(self, api_key: str | None = None) -> None:
        self.has_key = api_key is not None

    async def act(self, conversation: Conversation) -> Turn:
        seen = {
            "env": sorted(os.environ),
            "cwd_files": sorted(p.name for p in Path.cwd().iterdir()),
            "messages": len(conversation.messages),
            "task": conversation.brief.task_id,
            "has_key": self.has_key,
        }
        return Turn.stop(content=json.dumps(seen))


class Chatty:
    """Answers a turn larger than a turn may be."""

    async def act(self, conversation: Conversation) -> Turn:
        return Turn.stop(content="x" * (MAX_AGENT_TURN_BYTES + 1))


class Busy:
    """Answers a turn with `calls` calls."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def act(self, conversation: Conversation) -> Turn:
        return Turn(
            kind="calls",
            calls=[
                {"id": f"c{i}", "tool": "task_info", "arguments": {}} for i in range(self.calls)
            ],  # type: ignore[misc]
        )


class Slow:
    """Thinks for `seconds` (as a model's reply takes its time), then stops."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def act(self, conversation: Conversation) -> Turn:
        await asyncio.sleep(self.seconds)
        return Turn.stop(content="done thinking")
