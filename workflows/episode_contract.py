"""What the gateway, the session and a rollout say to an episode, and what it answers.

The models live in the ground (`posttrain_env.contracts.episode_calls`) so that activities (a
rollout's tool-call activity) speak the same contract without importing workflow code; they are
re-exported here for the workflows and the gateway, which have always imported them from here.
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
    ToolPath,
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
    "ToolPath",
    "ToolResult",
    "episode_over",
    "tool_call",
]
