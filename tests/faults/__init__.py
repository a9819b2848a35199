"""The fault matrix (`python -m tests.faults.matrix`). OpenEnv loads without its Gradio UI here,
as in the gateway and the demo (`posttrain_env.openenv_slim`): seconds of start-up otherwise."""

from posttrain_env import openenv_slim

openenv_slim.load()
