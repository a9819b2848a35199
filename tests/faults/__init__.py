"""The fault matrix (`python -m tests.faults.matrix`). OpenEnv loads without its Gradio UI here,
as in the gateway and the demo (`mcp_gateway.openenv_slim`): seconds of start-up otherwise."""

from mcp_gateway import openenv_slim

openenv_slim.load()
