"""The campaign CLI end to end on the file-backed dev server: `posttrain-env server --no-worker`
(embedded Temporal and the gateway), `posttrain-env worker` and `posttrain-env agent-worker` as
processes of their own, a campaign of reference-solution agents on `t0_artifact` (the fake
backend, with quick jobs). Both workers are SIGKILLed mid-campaign and restarted: every rollout
ends exactly once, with one agent job each, and a rollout in flight went on with its
conversation (its turns did not start over)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.campaigns.records import Outcome, read_records
from posttrain_common.contracts.jobs import JobRole
from posttrain_server.commands.campaign import describe
from tests.campaigns.dev_stack import (
    REPO,
    Workers,
    campaign_stack,
    campaign_status,
    cli,
    rollout_status,
    started_rollout_status,
)
from tests.gateway.server import command
from tests.waiting import wait_until
from workflows.campaign.contract import CampaignPhase, CampaignStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

QUICK = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=1, run_s=6),
        FakeJobScript(role=JobRole.dev, queue_s=0.5, run_s=1, score=1.0),
        FakeJobScript(role=JobRole.grader, queue_s=0.5, run_s=1, score=1.0),
    ]
)
CAMPAIGN = "cli-smoke"
LIVE = ("queued", "running", "cancelling")
ROLLOUTS = 6


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Workers]:
    with campaign_stack(tmp_path, scenario=QUICK) as workers:
        yield workers


def status_of(workers: Workers) -> CampaignStatus:
    return campaign_status(workers, CAMPAIGN)


def test_campaign_cli_survives_sigkilled_workers_and_runs_every_rollout_once(
    stack: Workers, tmp_path: Path
) -> None:
    stack.start()
    # The example of docs/campaigns.md, one epoch more (a flag overrides the spec).
    started = cli(
        stack, "run", "examples/campaign.toml", "--id", CAMPAIGN, "--detach", "--epochs", "3"
    )
    assert started.returncode == 0, started
    assert f"campaign {CAMPAIGN}: {ROLLOUTS} rollouts" in started.stdout

    # Mid-campaign: a reference rollout in flight has played some turns.
    deadline = time.monotonic() + 240
    while True:
        status = status_of(stack)
        playing = [
            (rid, started_rollout_status(stack, rid))
            for rid in status.in_flight_ids
            if "/reference/" in rid
        ]
        playing = [(rid, s) for rid, s in playing if s and s.turns >= 2 and s.play_end is None]
        if playing:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    rollout_id, before = playing[0]
    # A terminal following the campaign is SIGKILLed with the workers; nothing is lost.
    follower = subprocess.Popen(
        [*command(), "campaign", "status", CAMPAIGN, "--follow"],
        env=stack.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert follower.stdout is not None
    first_line = follower.stdout.readline().decode()
    assert f"/{ROLLOUTS} done" in first_line, first_line
    follower.send_signal(signal.SIGKILL)
    follower.wait(timeout=30)
    stack.kill()
    listed = cli(stack, "list")
    assert listed.returncode == 0 and CAMPAIGN in listed.stdout, listed
    # Not a wait: the outage is the scenario. The workers stay down a few seconds while the
    # campaign is mid-play (and a query needs a worker: nothing could be asked meanwhile).
    time.sleep(3)

    stack.start()
    resumed = cli(stack, "resume", CAMPAIGN)
    assert "nothing finished runs again" in resumed.stdout or resumed.returncode == 0, resumed
    followed = cli(stack, "status", CAMPAIGN, "--follow", timeout=600)
    assert followed.returncode == 0, followed
    final = status_of(stack)
    # The follow that picked the campaign up again ends with the query's own numbers.
    assert describe(final) in followed.stdout, (describe(final), followed.stdout[-2000:])
    records = read_records(stack.campaigns / CAMPAIGN)
    requests = stack.server.requests(JobRole.agent)
    after = rollout_status(stack, rollout_id)

    assert final.phase is CampaignPhase.completed, final
    assert final.finished == ROLLOUTS and final.attempts == ROLLOUTS
    # Every rollout ended exactly once, each with one attempt and one agent job (the quitters
    # submit none): no attempt ran twice, no job was started twice.
    assert sorted(r.rollout_id for r in records) == sorted({r.rollout_id for r in records})
    assert len(records) == ROLLOUTS and {r.attempt for r in records} == {1}
    reference = [r for r in records if r.agent.name == "reference"]
    quitters = [r for r in records if r.agent.name == "quitter"]
    assert {(r.outcome, r.end_reason, r.reward) for r in reference} == {
        (Outcome.scored, "submitted", 1.0)
    }
    assert {(r.outcome, r.end_reason, r.reward) for r in quitters} == {
        (Outcome.limit, "abandoned", 0.0)
    }
    assert len(requests) == len(reference) == 3
    assert len({r.key for r in requests}) == 3
    # One job per job id: the records name every job of their episode (the agent's and its
    # dev evaluation), none twice, none shared between rollouts.
    named = [job for r in reference for job in r.job_ids]
    assert len(named) == len(set(named)) >= len(reference), [r.job_ids for r in reference]
    assert all(r.job_ids == [] for r in quitters)
    # The rollout killed mid-play went on from where it was: the reference agent's fixed
    # play (submit, waits, dev_evaluate, submit) took as many turns as the others'.
    killed = next(r for r in reference if r.rollout_id == rollout_id)
    assert after.turns == killed.turns >= before.turns
    assert killed.steps_used == killed.turns
    assert final.mean_reward == 0.5 and final.averaged == ROLLOUTS
    shown = cli(stack, "status", CAMPAIGN)
    assert "completed" in shown.stdout and "scored 3" in shown.stdout, shown
    assert json.loads(cli(stack, "status", CAMPAIGN, "--json").stdout)["finished"] == ROLLOUTS
    # An operator lists the campaign's episodes by its search attribute (`PtCampaign`);
    # visibility lags the workflows a little.
    deadline = time.monotonic() + 60
    while True:
        episodes = subprocess.run(
            [*command(), "episodes", "list", "--campaign", CAMPAIGN, "--json"],
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert episodes.returncode == 0, episodes
        found = sorted(row["episode_id"] for row in json.loads(episodes.stdout))
        if found == sorted(str(r.episode_id) for r in records) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert found == sorted(str(r.episode_id) for r in records)
    # The retry and report commands of docs/campaigns.md on this campaign: nothing is unscored or an
    # error, so nothing runs again (and the campaign is not started again); the report counts
    # every rollout once.
    for only in ("unscored", "errors"):
        retried = cli(stack, "retry", CAMPAIGN, "--only", only)
        assert retried.returncode == 0, retried
        assert f"0 {only} rollouts get a new attempt" in retried.stdout, retried
    assert status_of(stack).attempts == ROLLOUTS
    reported = cli(stack, "report", CAMPAIGN)
    assert reported.returncode == 0, reported
    assert "| t0_artifact | reference | 3 (3 attempts) | 1.000 (n=3) |" in reported.stdout
    assert (stack.campaigns / CAMPAIGN / "report" / "summary.md").stat().st_size > 0

    # `campaign cancel` from the command line: it waits for the end; no job is left live.
    other = cli(stack, "run", "examples/campaign.toml", "--id", "cli-cancel", "--detach")
    assert other.returncode == 0, other
    wait_until(
        lambda: len(stack.server.requests(JobRole.agent)) > len(requests),
        120,
        "the second campaign's first agent job",
        every_s=0.5,
    )
    cancelled = cli(stack, "cancel", "cli-cancel", timeout=300)
    assert cancelled.returncode == 1 and "cancelled" in cancelled.stdout, cancelled
    backend = FakeBackend(stack.server.state_dir / "fake", QUICK)
    live = [job for job in backend.views(datetime.now(UTC)) if job.state.value in LIVE]
    assert live == []
