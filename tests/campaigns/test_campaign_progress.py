"""Live progress: the projections' definitions (pure), the rich panel on a terminal, and
`status --follow` picking up a campaign whose following CLI was killed, showing the numbers of
the `status` query (time-skipping server)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from posttrain_common.campaigns.records import Outcome
from posttrain_common.keys import ServerKey
from posttrain_server.commands.campaign import follow
from posttrain_server.commands.campaign_progress import display_for, figures, outlook
from posttrain_server.worker import build_worker
from tests.campaigns.harness import running_campaigns
from tests.campaigns.test_campaign_flow import CRASHES, GRADER_FAILS, SCENARIO, SOLVES, scripted
from workflows.campaign.contract import CampaignPhase, CampaignStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def status(**fields: object) -> CampaignStatus:
    base: dict[str, object] = {
        "campaign_id": "c",
        "name": "c",
        "phase": CampaignPhase.running,
        "rollouts": 10,
        "finished": 4,
        "in_flight": 2,
        "queued": 4,
        "not_run": 0,
        "counts": {o: 0 for o in Outcome} | {Outcome.scored: 3, Outcome.unscored: 1},
        "attempts": 7,  # one error retried: 5 attempts finished, 2 in flight
        "retried": 1,
        "mean_reward": 0.5,
        "averaged": 3,
        "budget_usd": 10.0,
        "spent_usd": 1.0,
        "env_usd": 0.8,
        "llm_usd": 0.2,
        "reserved_usd": 1.0,
        "left_usd": 8.0,
        "worst_case_usd": 0.5,
        "created_at": T0,
    }
    return CampaignStatus.model_validate(base | fields)


def test_projected_spend_and_eta_follow_their_definitions() -> None:
    o = outlook(status(), T0 + timedelta(minutes=20))
    # $1.00 over 5 finished attempts, for the 5 + 2 in flight + 4 queued that will have run.
    assert o.projected_usd == pytest.approx(1.0 / 5 * 11)
    assert o.ceiling_usd == pytest.approx(1.0 + 1.0 + 4 * 0.5)
    # 4 rollouts in 20 minutes; 6 left.
    assert o.eta_s == pytest.approx(6 / (4 / 1200))
    assert outlook(status(budget_usd=2.5), T0).ceiling_usd == 2.5
    fresh = outlook(status(finished=0, attempts=2, spent_usd=0.0), T0 + timedelta(minutes=1))
    assert fresh.projected_usd is None and fresh.eta_s is None


def test_the_line_and_the_panel_show_every_figure() -> None:
    s = status()
    line = figures(s, outlook(s, T0 + timedelta(minutes=20)))
    for part in (
        "4/10 done",
        "2 in flight",
        "4 queued",
        "mean reward 0.500",
        "unscored 1",
        "error 0",
        "projected $2.2000",
        "at most $4.0000",
        "ETA 30m00s",
    ):
        assert part in line, line

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    display = display_for(out)
    display.show(s)
    display.close()
    drawn = out.getvalue()
    assert "4/10 done, 2 in flight, 4 queued" in drawn and "━" in drawn
    assert "mean reward" in drawn and "ETA" in drawn and "projected" in drawn
    plain = io.StringIO()
    display_for(plain).show(s)
    assert "4/10 done" in plain.getvalue() and "━" not in plain.getvalue()


@pytest.mark.slow  # minutes of real turns, jobs or recordings: the slow set
@pytest.mark.timeout(600)
async def test_follow_after_the_following_cli_was_killed_shows_the_querys_numbers(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    spec = {
        "name": "followed",
        "tasks": ["t_a", "t_b"],
        "agents": [
            scripted("solver", SOLVES),
            scripted("crasher", CRASHES),
            scripted("graderfail", GRADER_FAILS),
        ],
        "epochs": 2,
        "concurrency": 3,
        "budget_usd": 100.0,
    }
    async with running_campaigns(time_skipping_env, tmp_path, SCENARIO) as c:
        campaign_id = await c.start(spec)
        handle = c.handle(campaign_id)
        first_out = io.StringIO()
        first = asyncio.create_task(follow(handle, first_out, every_s=0.2))
        midway = await c.skip_until(campaign_id, lambda s: s.finished >= 3)
        first.cancel()  # the terminal is closed: the campaign goes on
        with pytest.raises(asyncio.CancelledError):
            await first
        again_out = io.StringIO()
        again = asyncio.create_task(follow(handle, again_out, every_s=0.2))
        final = await c.run_until_final(campaign_id)
        code = await asyncio.wait_for(again, timeout=120)
        queried = await c.status(campaign_id)

    assert midway.phase is CampaignPhase.running
    assert final.phase is CampaignPhase.completed and code == 0
    lines = again_out.getvalue().splitlines()
    progress = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    # Picked up where the campaign stood (not from zero), and ended on the query's numbers.
    assert int(progress[0].split(": ", 1)[1].split("/")[0]) >= midway.finished
    assert progress[-1] == figures(queried, outlook(queried, datetime.now(UTC)))
    assert f"{queried.finished}/12 done, 0 in flight, 0 queued" in progress[-1]
    assert f"${queried.spent_usd:.6f} spent" in progress[-1]
    assert f"unscored {queried.counts[Outcome.unscored]}," in progress[-1]
    assert any(line.startswith(f"campaign {campaign_id} (followed): completed") for line in lines)
    assert first_out.getvalue().startswith("[")


async def test_follow_asks_again_while_no_worker_answers_and_ends_with_the_campaign(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """CI saw `status --follow` die of one unanswered query (the SDK's 30 s deadline, CANCELLED
    "Timeout expired") on a loaded machine. Here no worker serves the campaign's queue at first:
    every query goes unanswered, and follow keeps asking until a worker comes and the campaign
    ends. A query answered with an error (no such campaign) still ends it."""
    spec = {
        "name": "unserved",
        "tasks": ["t_a"],
        "agents": [scripted("solver", SOLVES)],
        "budget_usd": 10.0,
    }
    async with running_campaigns(time_skipping_env, tmp_path, SCENARIO) as c:
        unserved = dataclasses.replace(c, task_queue=f"unserved-{uuid.uuid4().hex[:12]}")
        campaign_id = await unserved.start(spec)
        c.handles.extend(unserved.handles)  # terminated with the others if the test fails
        out = io.StringIO()
        following = asyncio.create_task(
            follow(
                unserved.handle(campaign_id), out, every_s=0.1, ask_timeout=timedelta(seconds=0.5)
            )
        )
        await asyncio.sleep(3)  # at least four queries unanswered
        assert not following.done(), following
        assert out.getvalue() == ""
        key = ServerKey.load_or_create(c.settings.server_key_path)
        worker = build_worker(
            c.client,
            c.settings,
            c.backend,
            key=key,
            task_queue=unserved.task_queue,
            tasks_dir=tmp_path / "tasks",
        )
        async with worker:
            final = await unserved.run_until_final(campaign_id)
            code = await asyncio.wait_for(following, timeout=120)
        with pytest.raises(RPCError) as missing:
            await follow(c.handle("c-none"), io.StringIO(), ask_timeout=timedelta(seconds=5))

    assert final.phase is CampaignPhase.completed and code == 0
    lines = out.getvalue().splitlines()
    progress = [line for line in lines if line.startswith("[")]
    assert progress and "1/1 done, 0 in flight, 0 queued" in progress[-1], lines
    assert any(line.startswith(f"campaign {campaign_id} (unserved): completed") for line in lines)
    assert missing.value.status is RPCStatusCode.NOT_FOUND
