"""A campaign on the LOCAL backend survives SIGKILLed workers: the file-backed dev server
(`posttrain-env server --no-worker`), `posttrain-env worker` on the local backend (real jobs in
bubblewrap on this machine) and `posttrain-env agent-worker`, a campaign of reference-solution
agents on `t0_artifact`. While a rollout has played two turns and has a local job running, both
workers are SIGKILLed and restarted: every rollout ends exactly once with full marks, each job
has one job folder, the rollout in flight went on with its conversation, and no job is left
running.

Each episode of the reference agent has three jobs, each with its own folder under
`<state>/local/jobs/` (one per idempotency key, `activities/backends/local/store.py`) and each
named in
the rollout's record (`job_ids`, from the episode's status): the agent's job, its dev evaluation
and the grader of its submission."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from activities.backends.local import jobfiles as jf
from activities.backends.local.store import REF, JobStore
from posttrain_common.campaigns.records import Outcome, read_records
from tests.campaigns.dev_stack import Workers, campaign_stack, campaign_status, cli, rollout_status
from tests.processes import live_pids_of_uid
from workflows.campaign.contract import CampaignPhase
from workflows.campaign.rollout import RolloutWorkflow
from workflows.campaign.rollout_contract import RolloutStatus
from workflows.campaign.workflow import CampaignWorkflow
from workflows.ids import campaign_workflow_id, rollout_workflow_id

# Three rollouts of real (small) local jobs, two at a time, on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CAMPAIGN = "local-kill"
ROLLOUTS = 3
SPEC = f"""
name = "{CAMPAIGN}"
tasks = ["t0_artifact"]
epochs = {ROLLOUTS}
concurrency = 2
budget_usd = 5.0

[[agents]]
name = "reference"
agent = "reference"
args = {{ timeout_minutes = 5 }}
"""
# Per episode: the agent's job, its dev evaluation, the grader of the submission.
JOBS_PER_EPISODE = Counter({"agent": 1, "dev": 1, "grader": 1})


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Workers]:
    if os.geteuid() != 0:
        raise RuntimeError("the local backend tests run as root (CI does); see tests/local")
    local = {
        "POSTTRAIN_BACKEND": "local",
        "POSTTRAIN_JOB_PYTHON": "/usr/bin/python3",
        # The reference solution and the evaluator need no packages: no find-links.
        "POSTTRAIN_LOCAL_FIND_LINKS": "",
    }
    with campaign_stack(tmp_path, extra_env=local) as workers:
        yield workers


def jobs_dir(workers: Workers) -> Path:
    return workers.server.state_dir / "local" / "jobs"


def job_specs(workers: Workers) -> dict[str, dict[str, Any]]:
    """job.json of every job folder, by folder name (the backend's job ref)."""
    root = jobs_dir(workers)
    if not root.is_dir():
        return {}
    specs = {}
    for folder in root.iterdir():
        spec = jf.read_json(folder / jf.JOB) if REF.fullmatch(folder.name) else None
        if spec is not None:
            specs[folder.name] = spec
    return specs


def episode_of(spec: dict[str, Any]) -> str:
    # The job's key is its workflow id, `episode-<episode id>/job/<n>` (workflows/ids.py).
    return spec["key"].removeprefix("episode-").split("/job/")[0]


async def playing_with_a_running_job(
    workers: Workers, timeout_s: float
) -> tuple[str, RolloutStatus, str, float]:
    """A reference rollout in flight that has played ≥ 2 turns and has a local job running
    (its folder has status.json and no result.json yet): its id, status, the job's ref, and a
    time (after the queries) at which the job was still running.

    t0_artifact's jobs run for about a second each (install and run phases of half a second on
    the tiny model), so this looks at the job folders every 0.1 s and asks Temporal only when
    one is running; a job that ended during the queries is passed over."""
    client = await Client.connect(
        workers.server.temporal_address, data_converter=pydantic_data_converter
    )
    campaign = client.get_workflow_handle_for(CampaignWorkflow.run, campaign_workflow_id(CAMPAIGN))
    root = jobs_dir(workers)
    deadline = time.monotonic() + timeout_s
    while True:
        running = {
            episode_of(spec): ref
            for ref, spec in job_specs(workers).items()
            if (root / ref / jf.STATUS).exists() and not (root / ref / jf.RESULT).exists()
        }
        if running:
            status = await campaign.query(CampaignWorkflow.status)
            for rollout_id in status.in_flight_ids:
                rollout = client.get_workflow_handle_for(
                    RolloutWorkflow.run, rollout_workflow_id(rollout_id, 1)
                )
                try:
                    now = await rollout.query(RolloutWorkflow.status)
                except RPCError as err:  # in flight from the moment the campaign starts it
                    if err.status is RPCStatusCode.NOT_FOUND:
                        continue
                    raise
                if now.turns >= 2 and now.play_end is None and now.episode_id in running:
                    ref = running[now.episode_id]
                    checked_at = time.time()
                    if not (root / ref / jf.RESULT).exists():
                        return rollout_id, now, ref, checked_at
        assert time.monotonic() < deadline, "no rollout was seen mid-play with a running job"
        await asyncio.sleep(0.1)


def test_local_campaign_survives_sigkilled_workers_with_one_folder_per_job(
    stack: Workers, tmp_path: Path
) -> None:
    spec = tmp_path / "campaign.toml"
    spec.write_text(SPEC)
    stack.start()
    started = cli(stack, "run", str(spec), "--id", CAMPAIGN, "--detach")
    assert started.returncode == 0, started
    assert f"campaign {CAMPAIGN}: {ROLLOUTS} rollouts" in started.stdout

    found = asyncio.run(playing_with_a_running_job(stack, timeout_s=300))
    rollout_id, before, running, still_running_at = found
    stack.kill()
    # Not a wait: the outage is the scenario. The workers stay down a few seconds while the
    # campaign is mid-play (and a query needs a worker: nothing could be asked meanwhile).
    time.sleep(3)
    stack.start()
    followed = cli(stack, "status", CAMPAIGN, "--follow", timeout=900)
    assert followed.returncode == 0, (followed, stack.server.log())
    final = campaign_status(stack, CAMPAIGN)
    records = read_records(stack.campaigns / CAMPAIGN)
    after = rollout_status(stack, rollout_id)
    specs = job_specs(stack)

    assert final.phase is CampaignPhase.completed, final
    assert final.finished == ROLLOUTS and final.attempts == ROLLOUTS
    # Every rollout ended exactly once, with full marks.
    assert sorted(r.rollout_id for r in records) == sorted({r.rollout_id for r in records})
    assert len(records) == ROLLOUTS and {r.attempt for r in records} == {1}
    assert {(r.outcome, r.end_reason, r.reward) for r in records} == {
        (Outcome.scored, "submitted", 1.0)
    }
    # One job folder per job: the folders' job ids are exactly those the records name, none
    # twice; each episode has one agent job, one dev evaluation and one grader.
    named = [job for r in records for job in r.job_ids]
    assert len(named) == len(set(named)) == ROLLOUTS * sum(JOBS_PER_EPISODE.values()), named
    assert sorted(s["job_id"] for s in specs.values()) == sorted(named)
    for record in records:
        mine = [s for s in specs.values() if s["job_id"] in record.job_ids]
        assert {episode_of(s) for s in mine} == {record.episode_id}
        assert Counter(s["role"] for s in mine) == JOBS_PER_EPISODE, mine
    leftovers = [p.name for p in jobs_dir(stack).iterdir() if p.name not in specs]
    assert leftovers == []
    # The job running just before the kill ran on to its end (its supervisor is in a session
    # of its own, outside the worker's process group), and the rollout went on from where it
    # was.
    result = jf.read_json(jobs_dir(stack) / running / jf.RESULT)
    assert result is not None and result["finished_at"] > still_running_at, (running, result)
    killed = next(r for r in records if r.rollout_id == rollout_id)
    assert after.turns == killed.turns >= before.turns >= 2
    assert killed.steps_used == killed.turns
    # No job is left running: each ended (succeeded), its supervisor and sandbox are gone, the
    # backend counts no live job, and no process runs as a job's uid.
    root = jobs_dir(stack)
    for ref, job in specs.items():
        result = jf.read_json(root / ref / jf.RESULT)
        log = jf.tail_lines(root / ref / jf.LOG, 30)
        assert result is not None and result["state"] == "succeeded", (
            ref,
            job["role"],
            result,
            log,
        )
        assert not jf.is_alive(jf.read_json(root / ref / jf.SUPERVISOR)), ref
        assert not jf.is_alive(jf.read_json(root / ref / jf.SANDBOX)), ref
        assert live_pids_of_uid(int(job["uid"])) == [], ref
    assert JobStore(root, "/usr/bin/python3").live_uids() == set()
