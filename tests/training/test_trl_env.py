"""The TRL adapter without TRL: the environment TRL's `environment_factory` makes, driven as
TRL drives it (reset with the row's columns, tool methods, then the reward function with the
rollouts' environments), against the real gateway on the replay backend."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from posttrain_env.training.trl_env import (
    PostTrainTRL,
    PostTrainTRLEnv,
    TRLVersionError,
    check_trl_version,
)
from tests.gateway.server import ServerProcess
from tests.training.scenario import DRIFT, GRADER_FAILS, ONE_MINUTE_USD, SCORE_HIGH, TASK

TOOLS = [
    "dev_evaluate",
    "jobs_cancel",
    "jobs_logs",
    "jobs_status",
    "jobs_submit",
    "jobs_wait",
    "list_hardware",
    "submit",
    "task_info",
]


class Logs:
    def __init__(self) -> None:
        self.extra: dict[str, list[Any]] = {}
        self.metrics: dict[str, float] = {}

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.extra.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name] = value


def play(env: PostTrainTRLEnv, script: str) -> None:
    submitted = json.loads(env.jobs_submit(script=script, flavor="cpu-basic", timeout_minutes=10))
    assert submitted["state"] in ("queued", "running", "succeeded"), submitted
    while json.loads(env.jobs_wait(timeout_s=60))["state"] in ("queued", "running"):
        pass
    env.submit()


def test_tools_are_the_environments_public_methods_as_trl_discovers_them() -> None:
    # TRL lists `inspect.getmembers(type(env), inspect.isfunction)`: `reset` (and a
    # `get_reward`, which this environment leaves to the reward function) aside, every public
    # one is a tool, with its docstring's `Args:` as the schema.
    public = [
        name
        for name, _ in inspect.getmembers(PostTrainTRLEnv, predicate=inspect.isfunction)
        if not name.startswith("_") and name != "reset"
    ]
    assert public == TOOLS
    for name in TOOLS:
        doc = getattr(PostTrainTRLEnv, name).__doc__ or ""
        params = [p for p in inspect.signature(getattr(PostTrainTRLEnv, name)).parameters][1:]
        assert all(f"    {p}: " in doc for p in params), (name, doc)


def test_rollouts_are_rewarded_with_none_kept_and_their_costs_logged(
    server: ServerProcess,
) -> None:
    seen: list[tuple[Any, list[float | None], list[float] | None]] = []

    class Recorder:
        def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
            seen.append((task, list(rewards), list(costs)))

    posttrain = PostTrainTRL(server.base_url, sampler=Recorder(), message_timeout_s=120)
    try:
        envs = [posttrain.environment() for _ in range(3)]
        prompts = [env.reset(task_id=TASK, prompt=[]) for env in envs]
        assert prompts == ["Write a checkpoint to /data/outputs."] * 3
        play(envs[0], SCORE_HIGH)
        play(envs[1], GRADER_FAILS)
        # envs[2]: the policy made no call; the reward function ends its episode (abandoned, 0).
        logs = Logs()
        rewards = posttrain.reward(
            environments=envs,
            log_extra=logs.log_extra,
            log_metric=logs.log_metric,
            task_id=[TASK] * 3,
        )
        assert rewards == [0.75, None, 0.0]  # None stays None: TRL leaves it out of the baseline
        assert seen == [(TASK, [0.75, None, 0.0], [ONE_MINUTE_USD, ONE_MINUTE_USD, 0.0])]
        assert logs.extra["cost_usd"] == [ONE_MINUTE_USD, ONE_MINUTE_USD, 0.0]
        assert logs.extra["end_reason"] == ["submitted", "score_failed", "abandoned"]
        assert logs.extra["spend_final"] == [True, True, True]
        assert logs.metrics["rollouts/unscored"] == 1.0
        assert logs.metrics["cost_usd/mean"] == pytest.approx(2 * ONE_MINUTE_USD / 3)
        assert [o.episode_id for o in posttrain.outcomes] == [
            env._episodes.episode_id for env in envs
        ]
        # A tool call after the end is refused; TRL answers the model with the message.
        with pytest.raises(ValueError, match="the episode is over"):
            envs[0].jobs_status()
        # TRL reuses instances: the next reset starts a new episode.
        assert envs[0].reset(task_id=TASK) is not None
        assert json.loads(envs[0].task_info())["prompt"].startswith("Write a checkpoint")
    finally:
        posttrain.close()
    assert len(posttrain.outcomes) == 3


def test_a_job_id_is_needed_before_any_job_and_a_task_before_any_reset(
    server: ServerProcess,
) -> None:
    posttrain = PostTrainTRL(server.base_url, message_timeout_s=120)
    try:
        env = posttrain.environment()
        with pytest.raises(ValueError, match="no task"):
            env.reset(prompt=[])
        env.reset(task_id=TASK)
        with pytest.raises(ValueError, match="call jobs_submit first"):
            env.jobs_wait()
        with pytest.raises(ValueError, match="no environments"):
            posttrain.reward(environments=[])
    finally:
        posttrain.close()


@pytest.mark.parametrize("version", ["1.5.1", "0.29.0", "nonsense"])
def test_a_trl_that_scores_none_as_0_is_refused(version: str) -> None:
    with pytest.raises(TRLVersionError, match=r"1\.6\.0"):
        check_trl_version(version)


@pytest.mark.parametrize("version", ["1.6.0", "1.16.0", "2.0.0.dev0"])
def test_a_trl_that_leaves_none_out_of_the_baseline_is_taken(version: str) -> None:
    check_trl_version(version)


def test_a_replay_miss_is_rewarded_none_warned_and_counted_apart_from_the_unscored(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """The grading of a recorded script replays while its task's evaluator is the recorded one;
    once the evaluator drifted, the replayed job's grading has no recording (and cannot fall
    through: the job it grades never ran), so the rollout is no measurement."""
    posttrain = PostTrainTRL(server.base_url, message_timeout_s=120)
    evaluator = Path(server.extra_env["POSTTRAIN_TASKS_DIR"]) / DRIFT / "evaluator.py"
    try:
        first = posttrain.environment()
        first.reset(task_id=DRIFT)
        play(first, SCORE_HIGH)  # recorded: the job and its grading fall through and are kept
        evaluator.write_text("print('a newer evaluator')\n")
        second = posttrain.environment()
        second.reset(task_id=DRIFT)
        play(second, SCORE_HIGH)  # the job replays; its grading has no recording
        logs = Logs()
        with caplog.at_level("WARNING", logger="posttrain_env.training.outcome"):
            rewards = posttrain.reward(
                environments=[first, second],
                log_extra=logs.log_extra,
                log_metric=logs.log_metric,
            )
    finally:
        posttrain.close()
    assert rewards == [0.75, None]
    assert logs.extra["end_reason"] == ["submitted", "replay_miss"]
    assert logs.extra["not_a_measurement"] == [False, True]
    assert logs.metrics["rollouts/replay_misses"] == 1.0
    assert logs.metrics["rollouts/unscored"] == 0.0  # a miss is not the grader's failure
    assert posttrain.bridge.totals.replay_misses == 1
    assert posttrain.bridge.totals.unscored == 0
    missed = posttrain.outcomes[1]
    assert missed.end is not None and missed.end.replay_miss is not None
    assert missed.end.replay_miss.tool == "submit"
    assert missed.end.replay_miss.key is not None
    assert missed.end.replay_miss.nearest[0].differs == ["script_sha256"]
    assert any("not a measurement" in r.getMessage() for r in caplog.records)
