"""Tasks: one folder per task, and at the root what every task shares.

    <task_id>/task.toml             the spec (TaskSpec): prompt, limits, base model, evaluation
    <task_id>/evaluator.py          the trusted grader script (DESIGN §9, "Evaluators")
    <task_id>/reference_solution.py a job script that solves the task (tests, the demo, and the
                                    `reference` agent submit it)
    registry.py                     loads and checks specs (list_tasks, load_task), assembles an
                                    evaluator (evaluator_script), finds generated models
    evaluator_kit.py                the evaluators' shared helpers, embedded into each evaluator
    models/                         base models generated on this machine for the local backend
    reference_agent.py              the `reference` agent, which submits a reference solution

A new task is those three files and nothing else: `list_tasks` finds every folder with a
task.toml, and the tests check each one it finds. task.toml names the folder's id and the base
model (`[base_model] repo_id` on Hugging Face; `local = "<name>"` for the local backend, a model
of models/ or one imported with `posttrain-env hub add-model`). The evaluator is a PEP 723 script
that imports the kit with one `from tasks.evaluator_kit import ...` statement and nothing else
of the project, reads the environment the kit's `grader_inputs` describes, and prints one score
line (`run_grader`). A member of a family (`family = "<task_id>"`) is a task.toml alone: it
shares the family's evaluator and reference solution, with its own `[evaluation]` parameters.
"""
