"""A campaign at scale: N rollouts of a scripted agent on the fake backend, C in flight.

    uv run python bench/campaign_scale.py [--rollouts 1000] [--concurrency 100]

On a file-backed Temporal dev server started here, with the project's worker (fake backend:
each agent job queues 1 s and runs 2 s, each grading 1 s) and an agent worker (each turn a
process of its own, as in production), in this process. The agent is `scripted`: submit a job,
wait for it, submit it (three turns or more: `jobs_wait` returns on each state change).
Reported: wall time and rollouts per minute; history events per rollout (every rollout's
workflow, all its runs) and per campaign run (each run until it continued as new); CPU seconds
of this process (the workers) and of the turn processes, and the workers' peak memory. The
Temporal server's own CPU is not counted (a process of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario  # noqa: E402
from posttrain_common.campaigns.spec import parse_spec  # noqa: E402
from posttrain_common.contracts.jobs import JobRole  # noqa: E402
from posttrain_common.keys import ServerKey  # noqa: E402
from posttrain_common.settings import Settings  # noqa: E402
from posttrain_server.agent_worker import build_agent_worker  # noqa: E402
from posttrain_server.worker import build_worker  # noqa: E402
from workflows.campaign.contract import CampaignInput, CampaignStatus  # noqa: E402
from workflows.campaign.workflow import CampaignWorkflow  # noqa: E402
from workflows.ids import campaign_workflow_id, rollout_workflow_id  # noqa: E402
from workflows.operations.search_attributes import SEARCH_ATTRIBUTES  # noqa: E402

SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.agent, queue_s=1, run_s=2),
        FakeJobScript(role=JobRole.grader, queue_s=0.5, run_s=1, score=0.5),
    ]
)
CALLS = [
    {
        "tool": "jobs_submit",
        "arguments": {"script": "print('hi')\n", "flavor": "cpu-basic", "timeout_minutes": 5},
    },
    {"wait": True},
    {"tool": "submit", "arguments": {"job_id": "$job"}},
]


async def events_of_runs(client: Client, workflow_id: str, first_run_id: str | None) -> list[int]:
    """History events of each run of a workflow, following continue-as-new from its first."""
    counts: list[int] = []
    run_id = first_run_id
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        counts.append(len(history.events))
        last = history.events[-1]
        if not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            return counts
        attrs = last.workflow_execution_continued_as_new_event_attributes
        run_id = attrs.new_execution_run_id


async def bench(rollouts: int, concurrency: int, turns_at_once: int) -> dict[str, Any]:
    temporal = shutil.which("temporal")
    if temporal is None:
        raise SystemExit("temporal is not on PATH: run with `uv run`")
    workdir = Path(tempfile.mkdtemp(prefix="campaign-scale-"))
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal,
        dev_server_database_filename=str(workdir / "temporal.db"),
        dev_server_log_level="error",
        # Episodes upsert the operator's search attributes: an unknown one fails their tasks.
        search_attributes=SEARCH_ATTRIBUTES,
    )
    try:
        client = env.client
        settings = Settings(
            state_dir=workdir / "state",
            backend="fake",
            campaigns_dir=workdir / "campaigns",
            watch_interval_s=1,
            agent_turns_at_once=turns_at_once,
        )
        backend = FakeBackend(settings.state_dir / "fake", SCENARIO)
        queue, agent_queue = f"bench-{uuid.uuid4().hex[:8]}", f"agents-{uuid.uuid4().hex[:8]}"
        key = ServerKey.load_or_create(settings.server_key_path)
        worker = build_worker(client, settings, backend, key=key, task_queue=queue)
        environ = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
        agents = build_agent_worker(client, settings, environ, task_queue=agent_queue)
        spec = parse_spec(
            {
                "name": "scale",
                "tasks": ["t0_artifact"],
                "agents": [{"name": "s", "agent": "scripted", "args": {"calls": CALLS}}],
                "epochs": rollouts,
                "concurrency": concurrency,
                "budget_usd": rollouts * 1.0,
            }
        )
        campaign_id = f"scale-{uuid.uuid4().hex[:8]}"
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        async with worker, agents:
            started = time.monotonic()
            handle = await client.start_workflow(
                CampaignWorkflow.run,
                CampaignInput(campaign_id=campaign_id, spec=spec, agent_task_queue=agent_queue),
                id=campaign_workflow_id(campaign_id),
                task_queue=queue,
            )
            status: CampaignStatus = await handle.result()
            wall = time.monotonic() - started
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            campaign_runs = await events_of_runs(client, handle.id, handle.first_execution_run_id)
            per_rollout = []
            for epoch in range(1, rollouts + 1):
                rollout_id = f"{campaign_id}/t0_artifact/s/{epoch}"
                wid = rollout_workflow_id(rollout_id, 1)
                per_rollout.append(sum(await events_of_runs(client, wid, None)))
    finally:
        await env.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "rollouts": rollouts,
        "concurrency": concurrency,
        "phase": status.phase.value,
        "counts": {k.value: v for k, v in status.counts.items()},
        "wall_s": round(wall, 1),
        "rollouts_per_minute": round(rollouts / wall * 60, 1),
        "rollout_events_median": statistics.median(per_rollout),
        "rollout_events_max": max(per_rollout),
        "campaign_runs": len(campaign_runs),
        "campaign_events_per_run": campaign_runs,
        "worker_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
        "turn_processes_cpu_s": round(
            kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime, 1
        ),
        "worker_peak_rss_mib": round(cpu1.ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--turns-at-once", type=int, default=16)
    args = parser.parse_args()
    result = asyncio.run(bench(args.rollouts, args.concurrency, args.turns_at_once))
    for key, value in result.items():
        print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
