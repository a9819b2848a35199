"""What the gateway, the session and a rollout say to an episode, and what it answers.

The models live in the ground (`posttrain_env.contracts.episode_calls`) so that activities (a
rollout's tool-call activity) speak the same contract without importing workflow code; they are
re-exported here for the workflows and the gateway, which have always imported them from here.
`ToolPath` is not among them: the workflows never branch on a call's path (the edge words its
answers for its transport, `ToolResult.worded_for`).
"""

from __future__ import annotations

from posttrain_env.contracts.episode_calls import (
    EndRequest,
    EpisodeClosed,
    EpisodeStatus,
    Oversized,
    StepMetadata,
    ToolAnswered,
    ToolCall,
    ToolResult,
    episode_over,
    tool_call,
)

__all__ = [
    "EndRequest",
    "EpisodeClosed",
    "EpisodeStatus",
    "Oversized",
    "StepMetadata",
    "ToolAnswered",
    "ToolCall",
    "ToolResult",
    "episode_over",
    "tool_call",
]
