"""Agents that play posttrain_env episodes, installable with the client (no server code).

An agent is any object with `async act(conversation) -> Turn` (`conversation.py`). Built in:
`scripted` (replays a list of calls), `reference` (the task's reference solution, for smoke
runs) and `openai` (a language model through any OpenAI-compatible endpoint). A campaign names
others as `module:attr`; `play.py` plays one episode with any of them against a running server.
"""

from posttrain_env.agents.conversation import (
    Agent,
    AgentCall,
    AgentError,
    Conversation,
    Message,
    TaskBrief,
    Turn,
    Usage,
)

__all__ = [
    "Agent",
    "AgentCall",
    "AgentError",
    "Conversation",
    "Message",
    "TaskBrief",
    "Turn",
    "Usage",
]
