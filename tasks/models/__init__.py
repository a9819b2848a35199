"""Base models generated on this machine, for the tasks that the local backend runs.

A task names one with `[base_model] local = "<name>"`; the module `tasks/models/<name>.py`
(`-` written `_`) generates it with `generate(folder)`, always the same bytes, and the local
backend imports it into its hub the first time a task asks (`tasks.registry.generated_model`).
Modules whose names start with `_` hold what the generators share and generate nothing.
"""
