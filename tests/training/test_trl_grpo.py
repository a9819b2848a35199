"""The proof: a few steps of TRL's GRPO on CPU, with a tiny policy this test generates, against
the real gateway (file-backed Temporal dev server, worker) on the replay backend, through
`PostTrainTRL` (TRL's `environment_factory` and a reward function).

One of the policy's three scripts makes the grader fail, so some rollouts end unscored on
purpose. Asserted: the trainer ran its steps; every unscored rollout reached the sampler update
as None with its cost, got advantage 0, and its group's baseline is the mean and standard
deviation of the scored rollouts alone (not of a 0 in its place); every rollout's spend was
logged beside its reward; and a rollout's latency fits an asynchronous trainer's staleness
window (TRL's AsyncGRPO `max_staleness`, 4 by default) at this test's step time.

torch (CPU, from pip's find-links on these machines: FACTS.md), trl and transformers are not
project dependencies: the test builds a venv of its own with them and posttrain-env."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from posttrain_common.pip_config import pip_find_links
from posttrain_env import PostTrainEnv
from posttrain_env.agents.scripted import ScriptedAgent
from posttrain_env.training.rollout import rollout
from posttrain_env.training.staleness import fits_staleness, staleness_steps
from tests.gateway.server import ServerProcess
from tests.training.scenario import (
    GRADER_FAILS,
    ONE_MINUTE_USD,
    REWARDS,
    SCORE_HIGH,
    SCORE_LOW,
    TASK,
    episode,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("trl_grpo_run.py")
# Versions that exist on PyPI and resolve together (checked with `uv pip install --dry-run`);
# torch is the CPU build pip's find-links hold (FACTS.md, "torch on these machines").
PINS = ["torch==2.13.0", "trl==1.16.0", "transformers==5.25.0"]
SCRIPTS = [SCORE_HIGH, SCORE_LOW, GRADER_FAILS]
STEPS = 3
GROUP = 6
# TRL's AsyncGRPOConfig.max_staleness default (trl/experimental/async_grpo/async_grpo_config.py).
MAX_STALENESS = 4


def build_venv(folder: Path) -> Path:
    links = [arg for path in pip_find_links() for arg in ("--find-links", path)]
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(python), *links, *PINS, str(ROOT)],
        check=True,
        timeout=900,
    )
    return python


async def record(server: ServerProcess) -> None:
    """Play each script once, so that the training rollouts are replayed (a first run falls
    through to the fake backend and is recorded)."""
    for script in SCRIPTS:
        async with PostTrainEnv(base_url=server.base_url, message_timeout_s=300) as env:
            reward, _, _ = await rollout(env, ScriptedAgent(episode(script)), TASK)
        assert reward == REWARDS[script]


def group_advantages(rewards: list[float | None]) -> list[float]:
    """GRPO's advantages as TRL 1.6+ computes them for one group (scale_rewards="group"): an
    unscored rollout is left out of the mean and standard deviation and gets 0."""
    scored = [r for r in rewards if r is not None]
    mean = statistics.fmean(scored)
    std = statistics.stdev(scored) if len(scored) > 1 else 0.0
    return [0.0 if r is None else (r - mean) / (std + 1e-4) for r in rewards]


async def test_trl_grpo_trains_on_the_replayed_service_with_unscored_rollouts_left_out(
    server: ServerProcess, tmp_path: Path
) -> None:
    python = await asyncio.to_thread(build_venv, tmp_path / "venv")
    await record(server)
    (tmp_path / "scripts.json").write_text(json.dumps(SCRIPTS))
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "VIRTUAL_ENV"))}
    done = await asyncio.to_thread(
        subprocess.run,
        [
            str(python),
            str(RUNNER),
            *("--base-url", server.base_url, "--task", TASK),
            *("--scripts", str(tmp_path / "scripts.json"), "--out", str(out)),
            *("--work", str(tmp_path), "--steps", str(STEPS), "--group", str(GROUP)),
        ],
        env={**env, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    result: dict[str, Any] = json.loads(out.read_text())

    # The trainer ran its steps, each on one group of GROUP rollouts.
    assert result["global_step"] == STEPS
    batches = result["batches"]
    assert len(batches) == STEPS and all(len(b["rewards"]) == GROUP for b in batches)
    outcomes = result["outcomes"]
    assert len(outcomes) == STEPS * GROUP

    # Every rollout played a whole episode on the replayed service: submitted, replayed, its
    # spend final and charged what the recorded run cost.
    for outcome in outcomes:
        assert outcome["end"]["reason"] in ("submitted", "score_failed"), outcome
        assert outcome["replayed"] and outcome["spend"]["final"], outcome
        assert outcome["spend"]["settled"]["usd"] == ONE_MINUTE_USD, outcome

    # Unscored on purpose: None, never 0, with its cost, and out of its group's baseline.
    unscored = [o for o in outcomes if o["reward"] is None]
    assert unscored, "the policy never chose the script whose grader fails"
    assert all(o["end"]["reason"] == "score_failed" for o in unscored)
    # The sampler got one RFC 013 update per step (one task, one group): the rewards as the
    # trainer got them, None kept, and one cost per rollout, the unscored ones' included.
    updates = result["sampler_updates"]
    assert [u["task"] for u in updates] == [TASK] * STEPS
    assert [u["rewards"] for u in updates] == [b["rewards"] for b in batches]
    assert all(u["costs"] == [ONE_MINUTE_USD] * GROUP for u in updates)
    assert sum(u["rewards"].count(None) for u in updates) == len(unscored)
    mixed = 0
    for batch in batches:
        rewards, advantages = batch["rewards"], batch["advantages"]
        assert set(rewards) <= {0.75, 0.25, None}
        assert advantages == pytest.approx(group_advantages(rewards), abs=1e-4)
        for reward, advantage in zip(rewards, advantages, strict=True):
            if reward is None:
                assert advantage == 0.0
        scored = {r for r in rewards if r is not None}
        if None in rewards and len(scored) == 2:
            mixed += 1
            # The same group with a 0 in place of None would have had other advantages: the
            # None did not enter the baseline.
            zeroed = group_advantages([0.0 if r is None else r for r in rewards])
            assert advantages != pytest.approx(zeroed, abs=1e-4)
    assert mixed, "no group held an unscored rollout beside two different rewards"

    # Every rollout's spend was logged beside its reward (TRL's metrics, one row per step).
    logged = [row for row in result["log_history"] if "cost_usd/mean" in row]
    assert len(logged) == STEPS
    for row in logged:
        assert row["cost_usd/mean"] == pytest.approx(ONE_MINUTE_USD)
    assert sum(row["rollouts/unscored"] for row in logged) == len(unscored)

    # Staleness: a rollout's own time on the service (TRL runs the group's tool calls one after
    # another, so a rollout's wall time also holds its siblings' calls and the generation)
    # against the training part of a step (the step without its rollouts), at TRL AsyncGRPO's
    # default window.
    train_s = [s - b["seconds"] for s, b in zip(result["step_s"], batches, strict=True)]
    step_s = statistics.median(train_s)
    slowest = max(o["service_s"] for o in outcomes)
    print(
        f"steps {STEPS}: step {statistics.median(result['step_s']):.2f} s, of which training "
        f"{step_s:.2f} s (medians); a rollout's service time median "
        f"{statistics.median(o['service_s'] for o in outcomes):.2f} s, max {slowest:.2f} s "
        f"({staleness_steps(slowest, step_s)} step(s)); its wall time in TRL's loop median "
        f"{statistics.median(o['latency_s'] for o in outcomes):.2f} s"
    )
    assert all(0 < o["service_s"] <= o["latency_s"] for o in outcomes)
    assert fits_staleness(slowest, step_s, MAX_STALENESS)
