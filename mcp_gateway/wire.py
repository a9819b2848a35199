"""OpenEnv's wire types, the only openenv the gateway imports (without its web UI).

Every gateway module takes openenv's models from here, so that the process's first import of
openenv goes through `mcp_gateway.openenv_slim.load()` and Gradio is never loaded
(`import mcp_gateway.app` took ~6 s longer with it).
"""

from __future__ import annotations

from mcp_gateway import openenv_slim

openenv_slim.load()

# After load(): openenv is imported without Gradio, and these are ordinary imports.
from openenv.core.env_server.mcp_types import (  # noqa: E402
    CallToolAction,
    CallToolObservation,
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ListToolsObservation,
    Tool,
)
from openenv.core.env_server.types import (  # noqa: E402
    EnvironmentMetadata,
    Observation,
    SchemaResponse,
    State,
    WSErrorCode,
)

__all__ = [
    "CallToolAction",
    "CallToolObservation",
    "EnvironmentMetadata",
    "JsonRpcErrorCode",
    "JsonRpcRequest",
    "JsonRpcResponse",
    "ListToolsObservation",
    "Observation",
    "SchemaResponse",
    "State",
    "Tool",
    "WSErrorCode",
]
