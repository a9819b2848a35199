"""Tasks: `<task_id>/task.toml`, its evaluator and reference solution; the shared evaluator kit,
the registry that loads specs, and the generated tiny models of the local backend."""
