"""posttrain_env: the client of the environment (`from posttrain_env import PostTrainEnv`).

`PostTrainEnv` is imported lazily so that server modules importing `posttrain_env.models` do
not load the OpenEnv client, and importing the client loads no server module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrain_env.client import PostTrainEnv

__all__ = ["PostTrainEnv"]


def __getattr__(name: str) -> Any:
    if name == "PostTrainEnv":
        from posttrain_env.client import PostTrainEnv

        return PostTrainEnv
    raise AttributeError(f"module 'posttrain_env' has no attribute {name!r}")
