"""The fake service the training tests play against: quick jobs (1 s of real time, billed one
minute of cpu-basic: $0.000167), a grader whose verdict the agent script's marker chooses, and a
job whose cancellation is never confirmed."""

from __future__ import annotations

from pathlib import Path

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.workflows.harness import write_task

TASK = "t_train"  # budget $1, 100 steps
TIGHT = "t_tight"  # budget $0.003: a 20-minute cpu-basic job ($0.00334) does not fit
SHORT = "t_short"  # 2 steps
DRIFT = "t_drift"  # budget $1; a test changes its evaluator after recording (a replay miss)
ONE_MINUTE_USD = 167 / 1_000_000

# What the grader answers, chosen by a marker in the agent's script.
SCORE_HIGH = "# SCORE_HIGH\nprint('train')\n"  # 0.75
SCORE_LOW = "# SCORE_LOW\nprint('train')\n"  # 0.25
GRADER_FAILS = "# GRADER_FAILS\nprint('train')\n"  # the grader job fails: score_failed, None
HOLD_CANCEL = "# HOLD_CANCEL\nprint('train')\n"  # runs an hour; a cancellation never confirmed
REWARDS = {SCORE_HIGH: 0.75, SCORE_LOW: 0.25, GRADER_FAILS: None}

SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(
            script_contains="HOLD_CANCEL", queue_s=0, run_s=3600, cancel_confirm_after_s=None
        ),
        FakeJobScript(
            role=JobRole.grader,
            evaluated_script_contains="GRADER_FAILS",
            queue_s=0,
            run_s=1,
            outcome="failed",
        ),
        FakeJobScript(
            role=JobRole.grader,
            evaluated_script_contains="SCORE_LOW",
            queue_s=0,
            run_s=1,
            score=0.25,
        ),
        FakeJobScript(role=JobRole.grader, queue_s=0, run_s=1, score=0.75),
        FakeJobScript(queue_s=0, run_s=1, score=0.5),
    ]
)


def write_tasks(tasks_dir: Path) -> Path:
    write_task(tasks_dir, TASK, budget_usd=1.0)
    write_task(tasks_dir, TIGHT, budget_usd=0.003)
    write_task(tasks_dir, SHORT, max_steps=2)
    write_task(tasks_dir, DRIFT, budget_usd=1.0)
    return tasks_dir


def submit(script: str, timeout_minutes: int = 10) -> dict[str, object]:
    """A scripted agent's `jobs_submit` step."""
    return {
        "tool": "jobs_submit",
        "arguments": {"script": script, "flavor": "cpu-basic", "timeout_minutes": timeout_minutes},
    }


def episode(script: str) -> list[dict[str, object]]:
    """Submit, wait, submit for grading: a whole scored (or unscored) episode."""
    return [submit(script), {"wait": True}, {"tool": "submit", "arguments": {"job_id": "$job"}}]


def replay_env(tasks_dir: Path, time_scale: float = 0.01) -> dict[str, str]:
    """A server's settings: the replay backend over the fake one, recording what falls
    through, with these tasks."""
    return {
        "POSTTRAIN_BACKEND": "replay",
        "POSTTRAIN_REPLAY_INNER": "fake",
        "POSTTRAIN_REPLAY_FALL_THROUGH": "true",
        "POSTTRAIN_REPLAY_TIME_SCALE": str(time_scale),
        "POSTTRAIN_TASKS_DIR": str(tasks_dir),
    }
