"""Ground, installed with the client: agents that play posttrain_env episodes (no server code).

An agent is any object with `async act(conversation) -> Turn` (`conversation.py`). Built in:
`scripted` (replays a list of calls), `reference` (the task's reference solution, for smoke
runs; in `tasks/reference_agent.py`) and `openai` (a language model through any OpenAI-compatible
endpoint). A campaign names others as `module:attr` (`registry.py`, which imports an agent's
module only when it is built); `play.py` plays one episode with any of them against a running
server; `prompts.py` is how a conversation reads to a language model; `runner.py` is one turn in
a process of its own, which the agent worker's activity starts (never beside the server's
secrets). Imports only `posttrain_env` (tests/test_layers.py checks the graph).
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
