"""Record the histories of real campaigns, for the replay test (tests/replay/test_replay.py).

    uv run python -m tests.replay.record_campaign_histories --label <what changed> [scenarios...]

As `record_histories.py` does for episodes: each scenario runs a campaign of scripted agents on
the fake backend against a real Temporal dev server, with the project's worker and an agent
worker (turns in processes of their own), and writes every workflow execution it leaves
(campaigns, rollouts, episodes, jobs, the watcher; every run of a workflow that continued as
new) as Temporal's JSON history, into `histories/<date>-campaigns-<label>/`. Keep the older
folders: they prove that campaigns started by that code keep running after an upgrade.

Scenarios:
- `campaign_continue_as_new`: 3 rollouts of 3 agents (one scores, one's grader fails, one stops
  at once), 3 at a time, with a history limit low enough that the campaign and its rollouts
  continue as new; a `retry --only unscored` is asked of the running campaign once the grader
  is mended.
- `campaign_cancel`: 2 rollouts with long jobs running when the campaign is cancelled (every
  rollout cancelled, every episode ended, every job cancelled).
- `campaign_reopen`: a finished campaign with an unscored rollout, started again by `campaign
  retry` (it rebuilds its counters from its records and runs only the retry).
- `campaign_outside_cancel`: a rollout's workflow and then the campaign's cancelled through
  Temporal (the UI's "Request Cancellation").
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.replay.record_histories import recorder_cli, settled
from tests.waiting import eventually

# In every folder this module records, and in no other (test_replay.py tells them apart).
FOLDER_TAG = "-campaigns-"
LIMIT = 40  # history events: the campaign and its longer rollouts continue as new
SOLVES = "print('SOLVES')\n"
GRADER_FAILS = "print('GRADER_FAILS')\n"
LONG = "print('LONG')\n"
LIVE = ("queued", "running", "cancelling")


def scripted(name: str, script: str, wait: bool = True) -> dict[str, Any]:
    submit = {"script": script, "flavor": "cpu-basic", "timeout_minutes": 5}
    calls: list[dict[str, Any]] = [{"tool": "jobs_submit", "arguments": submit}]
    calls += [{"wait": True}] if wait else []
    calls += [{"tool": "submit", "arguments": {"job_id": "$job"}}]
    return {"name": name, "agent": "scripted", "args": {"calls": calls}}


QUITTER = {"name": "quitter", "agent": "scripted", "args": {"calls": [{"tool": "task_info"}]}}


def scenario(*, grader_fails: bool = True, long: bool = False) -> Any:
    from activities.backends.fake.backend import FakeJobScript, FakeScenario
    from posttrain_common.contracts.jobs import JobRole

    jobs = [FakeJobScript(role=JobRole.agent, script_contains="LONG", queue_s=1, run_s=3600)]
    jobs += [FakeJobScript(role=JobRole.agent, queue_s=1, run_s=2)]
    if grader_fails:
        failing = FakeJobScript(
            role=JobRole.grader, evaluated_script_contains="GRADER_FAILS", outcome="failed"
        )
        jobs += [failing.model_copy(update={"queue_s": 1, "run_s": 1})]
    jobs += [FakeJobScript(role=JobRole.grader, score=0.75, queue_s=1, run_s=1)]
    return FakeScenario(jobs=jobs if long else jobs[1:])


class Stack:
    def __init__(self, client: Any, queue: str, agent_queue: str, backend: Any, root: Path):
        self.client, self.queue, self.agent_queue = client, queue, agent_queue
        self.backend, self.root = backend, root

    async def start(self, campaign_id: str, spec: dict[str, Any], **inputs: Any) -> Any:
        from posttrain_common.campaigns.spec import parse_spec
        from workflows.campaign.contract import CampaignInput
        from workflows.campaign.workflow import CampaignWorkflow
        from workflows.ids import campaign_workflow_id

        return await self.client.start_workflow(
            CampaignWorkflow.run,
            CampaignInput(
                campaign_id=campaign_id,
                spec=parse_spec(spec),
                agent_task_queue=self.agent_queue,
                answer_poll_s=5.0,
                **inputs,
            ),
            id=campaign_workflow_id(campaign_id),
            task_queue=self.queue,
        )


@contextlib.asynccontextmanager
async def campaign_stack(
    env: Any, workdir: Path, fake: Any, *, reaper_every_s: float = 600.0
) -> AsyncIterator[Stack]:
    from activities.backends.fake.backend import FakeBackend
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.agent_worker import build_agent_worker
    from posttrain_server.worker import build_worker
    from tests.campaigns.harness import agent_env
    from tests.workflows.harness import write_task

    tasks_dir = workdir / "tasks"
    write_task(tasks_dir)
    config = Settings(
        state_dir=workdir / "state",
        backend="fake",
        campaigns_dir=workdir / "campaigns",
        watch_interval_s=1.0,
        reaper_every_s=reaper_every_s,
    )
    backend = FakeBackend(config.state_dir / "fake", fake)
    queue, agent_queue = f"record-{uuid.uuid4().hex[:8]}", f"agents-{uuid.uuid4().hex[:8]}"
    key = ServerKey.load_or_create(config.server_key_path)
    worker = build_worker(
        env.client, config, backend, key=key, task_queue=queue, tasks_dir=tasks_dir
    )
    agents = build_agent_worker(env.client, config, agent_env(), task_queue=agent_queue)
    async with worker, agents:
        yield Stack(env.client, queue, agent_queue, backend, config.campaign_root)


async def run_ids(client: Any, workflow_id: str) -> set[str]:
    return {e.run_id async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")}


async def record_continue_as_new(out: Path, workdir: Path) -> list[Path]:
    from posttrain_common.campaigns.records import Outcome
    from tests.replay.record_histories import dev_server, save_all
    from workflows.campaign.contract import CampaignStatus, RetryRequest
    from workflows.campaign.workflow import CampaignWorkflow

    spec = {
        "name": "recorded",
        "tasks": ["t_test"],
        "agents": [scripted("solver", SOLVES), scripted("graderfail", GRADER_FAILS), QUITTER],
        "epochs": 1,
        "concurrency": 3,
        "budget_usd": 20.0,
    }
    env = await dev_server()
    async with env, campaign_stack(env, workdir, scenario()) as stack:
        handle = await stack.start("rec-can", spec, continue_as_new_events=LIMIT)

        async def unscored() -> bool:
            status: CampaignStatus = await handle.query(CampaignWorkflow.status)
            return status.counts[Outcome.unscored] >= 1

        await eventually(unscored, 300, "a rollout unscored", every_s=0.2)
        stack.backend.scenario = scenario(grader_fails=False)
        await handle.execute_update(CampaignWorkflow.retry, RetryRequest(only="unscored"))
        final = await handle.result()
        if final.phase.value != "completed" or len(await run_ids(env.client, handle.id)) < 2:
            raise RuntimeError(f"the campaign did not continue as new and complete: {final}")
        rollout_runs = await run_ids(env.client, "rollout/rec-can/t_test/solver/1/a1")
        if len(rollout_runs) < 2:
            raise RuntimeError("the solver's rollout did not continue as new")
        await settled(env.client)  # the watcher and the job workflows see the ends
        return await save_all(env.client, "campaign_continue_as_new", out)


async def record_cancel(out: Path, workdir: Path) -> list[Path]:
    from tests.replay.record_histories import dev_server, save_all
    from workflows.campaign.workflow import CampaignWorkflow

    spec = {
        "name": "cancelled",
        "tasks": ["t_test"],
        "agents": [scripted("slow", LONG)],
        "epochs": 3,
        "concurrency": 2,
        "budget_usd": 20.0,
    }
    env = await dev_server()
    async with env, campaign_stack(env, workdir, scenario(long=True)) as stack:
        handle = await stack.start("rec-cancel", spec)

        async def both_running() -> bool:
            views = stack.backend.views(datetime.datetime.now(datetime.UTC))
            return sum(v.state.value == "running" for v in views) == 2

        await eventually(both_running, 300, "two jobs running", every_s=0.2)
        await handle.execute_update(CampaignWorkflow.cancel)
        final = await handle.result()
        now = datetime.datetime.now(datetime.UTC)
        live = [v for v in stack.backend.views(now) if v.state.value in LIVE]
        if final.phase.value != "cancelled" or live:
            raise RuntimeError(f"the campaign did not end cancelled with no live job: {final}")
        await settled(env.client)
        return await save_all(env.client, "campaign_cancel", out)


async def record_reopen(out: Path, workdir: Path) -> list[Path]:
    from posttrain_common.campaigns.records import Outcome
    from posttrain_server.commands.campaign_retry import retry_campaign
    from tests.replay.record_histories import dev_server, save_all
    from workflows.campaign.workflow import CampaignWorkflow

    spec = {
        "name": "reopened",
        "tasks": ["t_test"],
        "agents": [scripted("graderfail", GRADER_FAILS)],
        "epochs": 1,
        "concurrency": 1,
        "budget_usd": 20.0,
    }
    env = await dev_server()
    async with env, campaign_stack(env, workdir, scenario()) as stack:
        handle = await stack.start("rec-reopen", spec)
        first = await handle.result()
        stack.backend.scenario = scenario(grader_fails=False)
        answer = await retry_campaign(
            env.client,
            "rec-reopen",
            "unscored",
            campaign_root=stack.root,
            task_queue=stack.queue,
            agent_task_queue=stack.agent_queue,
        )
        # The run `campaign retry` started (the same id, a new run).
        final = await env.client.get_workflow_handle_for(CampaignWorkflow.run, handle.id).result()
        unscored = first.counts[Outcome.unscored] == 1 and final.counts[Outcome.unscored] == 0
        if not unscored or answer.queued != 1 or final.phase.value != "completed":
            raise RuntimeError(f"the reopened campaign did not run its retry: {final}")
        await settled(env.client)
        return await save_all(env.client, "campaign_reopen", out)


async def record_outside_cancel(out: Path, workdir: Path) -> list[Path]:
    """Cancels through Temporal (the UI's "Request Cancellation"): one rollout's workflow (its
    episode ends, its attempt is recorded `cancelled`), then the campaign's."""
    from tests.replay.record_histories import dev_server, save_all
    from workflows.campaign.contract import CampaignPhase

    spec = {
        "name": "outside",
        "tasks": ["t_test"],
        "agents": [scripted("slow", LONG)],
        "epochs": 3,
        "concurrency": 2,
        "budget_usd": 20.0,
    }
    env = await dev_server()
    async with env, campaign_stack(env, workdir, scenario(long=True)) as stack:
        handle = await stack.start("rec-outside", spec)

        async def both_running() -> bool:
            views = stack.backend.views(datetime.datetime.now(datetime.UTC))
            return sum(v.state.value == "running" for v in views) == 2

        await eventually(both_running, 300, "two jobs running", every_s=0.2)
        query = "WorkflowType = 'RolloutWorkflow' AND ExecutionStatus = 'Running'"
        first = sorted([e.id async for e in stack.client.list_workflows(query)])[0]
        await stack.client.get_workflow_handle(first).cancel()
        await handle.cancel()
        final = await handle.result()
        now = datetime.datetime.now(datetime.UTC)
        live = [v for v in stack.backend.views(now) if v.state.value in LIVE]
        if final.phase is not CampaignPhase.cancelled or live:
            raise RuntimeError(f"the campaign did not end cancelled with no live job: {final}")
        await settled(env.client)
        return await save_all(env.client, "campaign_outside_cancel", out)


SCENARIOS = {
    "campaign_continue_as_new": record_continue_as_new,
    "campaign_cancel": record_cancel,
    "campaign_reopen": record_reopen,
    "campaign_outside_cancel": record_outside_cancel,
}


if __name__ == "__main__":
    recorder_cli((__doc__ or "").splitlines()[0], SCENARIOS, FOLDER_TAG)
