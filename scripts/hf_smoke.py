"""Live smoke test of the Hugging Face backend: one `t0_artifact` episode on cpu-basic.

    HF_TOKEN=hf_... uv run python scripts/hf_smoke.py [--namespace NS] [--skip-dev-evaluate]
    HF_TOKEN=hf_... uv run python scripts/hf_smoke.py --check-billing [--namespace NS]

NEEDS A TOKEN AND SPENDS REAL MONEY, under $0.01: an agent job (the task's reference solution,
about a minute of cpu-basic at $0.000167/min), one dev evaluation (charged the same way) and the
grader job (not charged to the episode, but billed to the namespace: also about a minute). The
token's user, or `--namespace`, must have Jobs enabled and credits. The token needs write
access to Jobs and to buckets in that namespace (each job's script is uploaded to its
`jobs-artifacts` bucket).

It starts an embedded in-memory Temporal dev server and a worker with the `hf` backend, plays the
episode through the same workflow updates the gateway sends (task_info, jobs_submit, jobs_wait,
dev_evaluate, submit), and prints the settled spend beside the Hub's own durations for every
job, so a person can check that what we billed is `price × ceil(running_secs / 60)`.

`--check-billing` instead runs ONE cpu-basic job (well under $0.01: two minutes at most) whose
script sleeps past its one-minute timeout, and prints the Hub's own record of it (stage, message,
scheduling/running/total seconds) beside what the episode settled. It answers what the Hub does
not document: how a timed-out job is reported, whether its timeout clock includes scheduling,
and (compared with the billing page) which of its seconds are billed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain_server.shutdown import exit_now

if TYPE_CHECKING:
    from huggingface_hub import JobInfo

    from activities.backends.hf.backend import HfBackend
    from posttrain_common.contracts.episode_calls import ToolResult

TASK_ID = "t0_artifact"
FLAVOR = "cpu-basic"
SPEND_LIMIT_USD = 0.01
ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "tasks" / TASK_ID / "reference_solution.py"
BILLING_URL = "https://huggingface.co/settings/billing"
# --check-billing: a job that outlives its timeout, so the Hub's timeout report shows too.
BILLING_TIMEOUT_MINUTES = 1
BILLING_SCRIPT = (
    "import time\n"
    "print('posttrain billing check: sleeping 100 s under a 60 s timeout', flush=True)\n"
    "time.sleep(100)\n"
    "print('not reached if the timeout holds', flush=True)\n"
)

Call = Callable[..., Awaitable["ToolResult"]]


@asynccontextmanager
async def episode(
    namespace: str | None, workdir: Path
) -> AsyncIterator[tuple[HfBackend, str, Call]]:
    """A worker with the hf backend on an embedded dev server, and one fresh episode of
    TASK_ID: (the backend, the episode id, a function calling one of its tools)."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from activities.backends.hf.backend import HfBackend
    from activities.backends.hf.factory import build as hf_backend
    from posttrain_common.contracts.episode_calls import ToolCall
    from posttrain_common.keys import ServerKey
    from posttrain_common.settings import Settings
    from posttrain_server.worker import build_worker
    from workflows.episode.session import ResetRequest, SessionState, SessionWorkflow
    from workflows.episode.workflow import EpisodeWorkflow
    from workflows.operations.search_attributes import SEARCH_ATTRIBUTES

    settings = Settings(backend="hf", state_dir=workdir / "state", namespace=namespace)
    key = ServerKey.load_or_create(settings.server_key_path)
    backend = hf_backend(settings, key)
    assert isinstance(backend, HfBackend)
    print(f"namespace {await backend.namespace()}, deployment label {backend.deployment}")
    temporal = shutil.which("temporal")
    if temporal is None:
        raise SystemExit("the temporal CLI is not on PATH; run with `uv run`")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal,
        data_converter=pydantic_data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
    )
    try:
        client, queue = env.client, f"smoke-{uuid.uuid4().hex[:8]}"
        async with build_worker(client, settings, backend, key=key, task_queue=queue):
            session = await client.start_workflow(
                SessionWorkflow.run,
                SessionState(),
                id=f"session-{uuid.uuid4().hex}",
                task_queue=queue,
            )
            reset = await session.execute_update(
                SessionWorkflow.reset, ResetRequest(task_id=TASK_ID)
            )
            handle = client.get_workflow_handle_for(EpisodeWorkflow.run, reset.workflow_id)
            print(f"episode {reset.episode_id}: base model {reset.setup.base_model}")

            async def call(tool: str, **arguments: Any) -> ToolResult:
                rid = uuid.uuid4().hex
                result = await handle.execute_update(
                    EpisodeWorkflow.call_tool,
                    ToolCall(request_id=rid, tool=tool, arguments=arguments),
                    id=f"{reset.episode_id}:{rid}",
                )
                print(f"  {tool}: {_short(result.data)}")
                return result

            yield backend, reset.episode_id, call
    finally:
        await env.shutdown()


async def wait_for_end(call: Call, job_id: str, view: dict[str, Any]) -> dict[str, Any]:
    while view.get("state") in ("queued", "running", "cancelling"):
        view = (await call("jobs_wait", job_id=job_id, timeout_s=300)).data
    return view


async def smoke(namespace: str | None, dev_evaluate: bool, workdir: Path) -> int:
    async with episode(namespace, workdir) as (backend, episode_id, call):
        submitted = await call(
            "jobs_submit", script=SOLUTION.read_text(), flavor=FLAVOR, timeout_minutes=10
        )
        if "error" in submitted.data:
            return 1
        job_id = submitted.data["job_id"]
        await wait_for_end(call, job_id, submitted.data)
        if dev_evaluate:
            await call("dev_evaluate", job_id=job_id)
        final = await call("submit", job_id=job_id)
        spend = final.metadata.service_spend
        print(f"reward {final.reward}, end {final.metadata.episode_end}")
        print(f"settled spend: ${spend.settled.usd:.6f} {spend.model_dump(mode='json')}")
        await _hub_durations(backend, episode_id)
        settled = spend.settled.usd
        return 0 if final.reward is not None and settled < SPEND_LIMIT_USD else 1


async def check_billing(namespace: str | None, workdir: Path) -> int:
    async with episode(namespace, workdir) as (backend, episode_id, call):
        submitted = await call(
            "jobs_submit",
            script=BILLING_SCRIPT,
            flavor=FLAVOR,
            timeout_minutes=BILLING_TIMEOUT_MINUTES,
        )
        if "error" in submitted.data:
            return 1
        view = await wait_for_end(call, submitted.data["job_id"], submitted.data)
        info = await _hub_record(backend, episode_id)
        prices = {p.name: p.micro_usd_per_minute for p in await backend.hardware()}
        for line in billing_report(view, info, prices.get(FLAVOR, 0)):
            print(line)
        return 0 if float(view.get("cost_usd", 1)) < SPEND_LIMIT_USD else 1


async def _hub_record(backend: HfBackend, episode_id: str) -> JobInfo:
    """The episode's one job as the Hub lists it (its listing may lag a little)."""
    for _ in range(20):
        jobs = await backend.episode_jobs(episode_id)
        if jobs:
            return jobs[0]
        await asyncio.sleep(3)
    raise SystemExit(f"the Hub does not list the job of episode {episode_id}")


def billing_report(view: dict[str, Any], info: JobInfo, price: int) -> list[str]:
    """The Hub's record of the billing-check job beside what the episode settled for it, and
    what that tells about the Hub's timeout and billing."""
    from activities.backends.hf.stages import running_seconds
    from workflows.episode.ledger import billed_minutes

    d = info.durations
    scheduling = d.scheduling_secs if d else None
    running = d.running_secs if d else None
    total = d.total_secs if d else None
    timeout_s = BILLING_TIMEOUT_MINUTES * 60
    ours_s = running_seconds(info, info.finished_at or datetime.now(UTC))
    minutes = billed_minutes(ours_s)
    lines = [
        f"Billing check: Hugging Face job {info.id} on {info.flavor} ({price} micro-USD/min),",
        f"  a script sleeping 100 s under a {timeout_s} s timeout.",
        f"The Hub: stage {info.status.stage}, message {info.status.message!r}",
        f"  created {info.created_at}, started {info.started_at}, finished {info.finished_at}",
        f"  durations: scheduling {scheduling} s, running {running} s, total {total} s",
        f"Ours: state {view.get('state')}, running {view.get('running_s')} s -> {minutes} min "
        f"billed -> ${view.get('cost_usd', 0):.6f} (reserved "
        f"${BILLING_TIMEOUT_MINUTES * price / 1e6:.6f}), "
        f"price x ceil(running_secs / 60) = ${minutes * price / 1e6:.6f}",
    ]
    if view.get("state") != "timed_out":
        lines.append(
            "  !! the job was not recognised as timed out: activities/backends/hf/stages.py "
            "must learn how the Hub reports a timeout (the stage and message above)"
        )
    if running is not None and total is not None:
        if abs(running - timeout_s) <= abs(total - timeout_s):
            lines.append("  The timeout counted running time only (running_secs ~ timeout).")
        else:
            lines.append(
                "  The timeout counted from creation (total_secs ~ timeout): scheduling "
                "is inside the timeout clock."
            )
    lines.append(
        f"Compare with {BILLING_URL}: if the namespace was billed for more than {minutes} "
        f"minute(s) of {info.flavor} for this job, the Hub bills more than running_secs "
        "(e.g. scheduling or a start-up phase), and settlement must follow it."
    )
    return lines


async def _hub_durations(backend: HfBackend, episode_id: str) -> None:
    """Every job of the episode as the Hub itself reports it, with what it should cost."""
    from activities.backends.hf.stages import running_seconds
    from workflows.episode.ledger import billed_minutes

    prices = {p.name: p.micro_usd_per_minute for p in await backend.hardware()}
    jobs = await backend.episode_jobs(episode_id)
    print("Hub's own durations (running_secs -> billed minutes x price):")
    for info in sorted(jobs, key=lambda j: str(j.created_at)):
        d = info.durations
        running = running_seconds(info, info.finished_at or datetime.now(UTC))
        minutes = billed_minutes(running)
        price = prices.get(str(info.flavor), 0)
        print(
            f"  {(info.labels or {}).get('posttrain-role')} {info.id} {info.status.stage}: "
            f"scheduling {d.scheduling_secs if d else '?'} s, "
            f"running {d.running_secs if d else '?'} s, total {d.total_secs if d else '?'} s "
            f"-> {minutes} min x {price} micro-USD = "
            f"${minutes * price / 1e6:.6f}"
        )


def _short(data: dict[str, Any]) -> str:
    keep = ("error", "job_id", "state", "running_s", "cost_usd", "score", "message")
    return str({k: data[k] for k in keep if k in data} or data)[:300]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(
            "Live smoke test of the hf backend: one t0_artifact episode on cpu-basic. "
            "Needs HF_TOKEN (the broker's token) and spends real money, under $0.01."
        )
    )
    parser.add_argument("--namespace", help="HF namespace for the jobs (default: the token's user)")
    parser.add_argument(
        "--skip-dev-evaluate", action="store_true", help="no dev evaluation (one job fewer)"
    )
    parser.add_argument(
        "--check-billing",
        action="store_true",
        help=(
            "instead: run one cpu-basic job past its 1-minute timeout and print the Hub's "
            "stage, message and durations beside our settlement (needs HF_TOKEN; under $0.01)"
        ),
    )
    args = parser.parse_args()
    if not os.environ.get("HF_TOKEN", "").strip():
        print("hf_smoke: set HF_TOKEN to the broker's Hugging Face token", file=sys.stderr)
        sys.exit(2)
    status = 1
    with tempfile.TemporaryDirectory(prefix="hf-smoke-") as tmp:
        try:
            if args.check_billing:
                status = asyncio.run(check_billing(args.namespace, Path(tmp)))
            else:
                status = asyncio.run(smoke(args.namespace, not args.skip_dev_evaluate, Path(tmp)))
        except SystemExit as exc:
            print(exc.code, file=sys.stderr)
    exit_now(status)


if __name__ == "__main__":
    main()
