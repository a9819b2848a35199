"""`posttrain-env campaign run | status | list | cancel | resume | retry | report`, anywhere.

Everything lives in Temporal and the campaign's folder, so a terminal that is closed (or killed)
loses nothing: `status` and `cancel` work from any other, at any time. A spec is checked before
anything starts (`run` exits 2 naming the problem).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from posttrain_env.errors import GatewayCode

if TYPE_CHECKING:  # imported where used: `posttrain-env --help` stays quick
    from temporalio.client import Client, WorkflowHandle

    from posttrain_common.settings import Settings
    from workflows.campaign.contract import CampaignStatus

FOLLOW_EVERY_S = 2.0
# A status query unanswered this long is asked again (the SDK's own deadline is 30 s).
FOLLOW_ASK_TIMEOUT = timedelta(seconds=10)
# Exit statuses of a campaign that ended so (0 otherwise).
FAILED = {"invalid": 2, "cancelled": 1}


def add_campaign_commands(sub: Any) -> None:
    campaign = sub.add_parser("campaign", help="evaluation campaigns: run, status, list, ...")
    commands = campaign.add_subparsers(dest="campaign_command", required=True)
    run = commands.add_parser("run", help="start a campaign from a spec (TOML) and follow it")
    run.add_argument("spec", type=Path)
    run.add_argument("--id", help="the campaign's id (default: the spec's name + 8 hex)")
    run.add_argument("--epochs", type=int)
    run.add_argument("--concurrency", type=int)
    run.add_argument("--budget-usd", type=float)
    run.add_argument("--detach", action="store_true", help="start it and return at once")
    status = commands.add_parser("status", help="where a campaign stands")
    status.add_argument("id")
    status.add_argument("--json", action="store_true", help="the status query as JSON")
    status.add_argument("--follow", action="store_true", help="until the campaign ends")
    commands.add_parser("list", help="every campaign this Temporal namespace knows")
    cancel = commands.add_parser("cancel", help="cancel a campaign: every rollout and job")
    cancel.add_argument("id")
    cancel.add_argument("--no-wait", action="store_true", help="do not wait for the end")
    resume = commands.add_parser("resume", help="go on with a campaign whose workers were down")
    resume.add_argument("id")
    retry = commands.add_parser("retry", help="run a campaign's unscored or error rollouts again")
    retry.add_argument("id")
    retry.add_argument("--only", choices=["unscored", "errors"], required=True)
    retry.add_argument("--detach", action="store_true", help="queue them and return at once")
    from posttrain_server.commands.campaign_report import add_report_command

    add_report_command(commands)


def run_campaign_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    return asyncio.run(_dispatch(args, out))


async def _dispatch(args: argparse.Namespace, out: TextIO) -> int:
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from activities.campaigns.activities import check_tasks
    from posttrain_common.campaigns.spec import CAMPAIGN_ID, SpecError, load_spec
    from posttrain_common.settings import Settings
    from posttrain_server.temporal.client import connect
    from tasks.registry import TASKS_DIR
    from workflows.campaign.contract import CampaignInput
    from workflows.campaign.workflow import CampaignWorkflow
    from workflows.ids import campaign_workflow_id

    settings = Settings()
    command = args.campaign_command
    if command == "report":
        from posttrain_server.commands.campaign_report import report_command

        return report_command(args, settings.campaign_root, out)
    if command == "run":
        try:
            spec = load_spec(
                args.spec,
                epochs=args.epochs,
                concurrency=args.concurrency,
                budget_usd=args.budget_usd,
            )
            check_tasks(spec, settings.tasks_dir or TASKS_DIR)
        except SpecError as exc:
            print(f"posttrain-env campaign: {exc}", file=sys.stderr)
            return 2
        campaign_id = args.id or f"{spec.name}-{secrets.token_hex(4)}"
        if not CAMPAIGN_ID.fullmatch(campaign_id):
            print(f"posttrain-env campaign: invalid id {campaign_id!r}", file=sys.stderr)
            return 2
        client = await connect(settings)
        try:
            handle = await client.start_workflow(
                CampaignWorkflow.run,
                CampaignInput(
                    campaign_id=campaign_id,
                    spec=spec,
                    agent_task_queue=settings.agent_task_queue,
                ),
                id=campaign_workflow_id(campaign_id),
                task_queue=settings.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            print(f"posttrain-env campaign: {campaign_id} exists already", file=sys.stderr)
            return 2
        print(
            f"campaign {campaign_id}: {spec.rollouts} rollouts ({len(spec.tasks)} tasks x "
            f"{len(spec.agents)} agents x {spec.epochs} epochs), {spec.concurrency} at once, "
            f"budget ${spec.budget_usd}; records in {settings.campaign_root / campaign_id}",
            file=out,
        )
        if args.detach:
            return 0
        return await follow(handle, out)
    client = await connect(settings)
    if command == "list":
        return await list_campaigns(client, out)
    handle = client.get_workflow_handle_for(CampaignWorkflow.run, campaign_workflow_id(args.id))
    try:
        if command == "status":
            if args.follow:
                return await follow(handle, out)
            current = await handle.query(CampaignWorkflow.status)
            print(current.model_dump_json(indent=2) if args.json else describe(current), file=out)
            return 0
        if command == "cancel":
            await handle.execute_update(CampaignWorkflow.cancel)
            print(f"campaign {args.id}: cancelling every rollout in flight", file=out)
            return 0 if args.no_wait else await follow(handle, out)
        if command == "resume":
            return await resume(client, handle, settings, out)
        if command == "retry":
            return await retry(client, args, settings, out)
    except RPCError as err:
        print(f"posttrain-env campaign: {args.id}: {err.message}", file=sys.stderr)
        return 1
    raise AssertionError(command)


async def retry(client: Client, args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from posttrain_server.commands.campaign_retry import RetryRefused, retry_campaign
    from workflows.campaign.workflow import CampaignWorkflow
    from workflows.ids import campaign_workflow_id

    try:
        answer = await retry_campaign(
            client,
            args.id,
            args.only,
            campaign_root=settings.campaign_root,
            task_queue=settings.task_queue,
            agent_task_queue=settings.agent_task_queue,
        )
    except RetryRefused as exc:
        print(f"posttrain-env campaign: {exc}", file=sys.stderr)
        return 1
    print(
        f"campaign {args.id}: {answer.queued} {args.only} rollouts get a new attempt"
        + (" (more are left: run `retry` again)" if answer.more else ""),
        file=out,
    )
    for rollout_id in answer.rollout_ids:
        print(f"  {rollout_id}", file=out)
    if args.detach or not answer.queued:
        return 0
    handle = client.get_workflow_handle_for(CampaignWorkflow.run, campaign_workflow_id(args.id))
    return await follow(handle, out)


async def follow(
    handle: WorkflowHandle[Any, Any],
    out: TextIO,
    every_s: float = FOLLOW_EVERY_S,
    ask_timeout: timedelta = FOLLOW_ASK_TIMEOUT,
) -> int:
    """Show the campaign's progress (live on a terminal, a line per change otherwise) until it
    ends; the exit status. It only reads the `status` query: stopping it changes nothing.

    A query that gets no answer within `ask_timeout` (a busy or stopped worker, a restarting
    server: anything `temporal_failure` calls transient) is asked again; an answer that says
    something is wrong (no such campaign) ends it with that error."""
    from temporalio.service import RPCError

    from posttrain_common.failures import temporal_failure
    from posttrain_server.commands.campaign_progress import display_for
    from workflows.campaign.workflow import CampaignWorkflow

    display = display_for(out)
    try:
        while True:
            try:
                current: CampaignStatus = await handle.query(
                    CampaignWorkflow.status, rpc_timeout=ask_timeout
                )
            except RPCError as err:
                # The client's own deadline ends a query as CANCELLED "Timeout expired", the
                # server's as DEADLINE_EXCEEDED: both mean no answer yet, never a wrong one.
                if temporal_failure(err).code is not GatewayCode.unavailable:
                    raise
                await asyncio.sleep(every_s)
                continue
            display.show(current)
            if current.phase.final:
                break
            await asyncio.sleep(every_s)
    finally:
        display.close()
    print(describe(current), file=out, flush=True)
    return FAILED.get(current.phase.value, 0)


def progress(s: CampaignStatus) -> str:
    counts = " ".join(f"{o.value}={n}" for o, n in s.counts.items() if n)
    mean = "-" if s.mean_reward is None else f"{s.mean_reward:.3f}"
    return (
        f"[{time.strftime('%H:%M:%S')}] {s.phase.value}: {s.finished}/{s.rollouts} done, "
        f"{s.in_flight} in flight, {s.queued} queued; mean reward {mean}; {counts or '-'}; "
        f"${s.spent_usd:.6f} spent of ${s.budget_usd}"
    )


def describe(s: CampaignStatus) -> str:
    lines = [
        f"campaign {s.campaign_id} ({s.name}): {s.phase.value}",
        f"  rollouts  {s.finished}/{s.rollouts} finished, {s.in_flight} in flight, "
        f"{s.queued} queued, {s.not_run} not run; {s.attempts} attempts ({s.retried} retries)",
        "  outcomes  " + ", ".join(f"{o.value} {n}" for o, n in s.counts.items()),
        f"  reward    mean {'-' if s.mean_reward is None else f'{s.mean_reward:.4f}'} over "
        f"{s.averaged} scored and limit rollouts",
        f"  money     ${s.spent_usd:.6f} spent (environment ${s.env_usd:.6f}, LLM "
        f"${s.llm_usd:.6f}), ${s.reserved_usd:.6f} reserved, ${s.left_usd:.6f} left of "
        f"${s.budget_usd}",
    ]
    if s.budget_stop is not None:
        stop = s.budget_stop
        lines.append(
            f"  stopped   at {stop.rollout_id}: its worst case ${stop.needed_usd} is more than "
            f"the ${stop.left_usd} left"
        )
    if s.error:
        lines.append(f"  error     {s.error}")
    for task, commit in s.base_models.items():
        lines.append(f"  base      {task} at {commit}")
    return "\n".join(lines)


async def list_campaigns(client: Client, out: TextIO) -> int:
    from temporalio.service import RPCError

    from workflows.campaign.workflow import CampaignWorkflow

    found = 0
    async for execution in client.list_workflows('WorkflowType="CampaignWorkflow"'):
        found += 1
        campaign_id = execution.id.removeprefix("campaign/")
        state = execution.status.name.lower() if execution.status else "?"
        line = f"{campaign_id}  {state}"
        handle = client.get_workflow_handle_for(CampaignWorkflow.run, execution.id)
        try:
            current = await handle.query(CampaignWorkflow.status)
            line = f"{campaign_id}  {progress(current).split('] ', 1)[1]}"
        except RPCError:
            pass
        print(line, file=out)
    if not found:
        print("no campaign", file=out)
    return 0


async def resume(
    client: Client, handle: WorkflowHandle[Any, Any], settings: Settings, out: TextIO
) -> int:
    """A running campaign goes on by itself once workers poll its queues: say which are
    missing. One that was stopped from outside (terminated) cannot be resumed here."""
    from temporalio.api.enums.v1 import WorkflowExecutionStatus

    from workflows.campaign.workflow import CampaignWorkflow

    description = await handle.describe()
    if description.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
        print(
            f"campaign {handle.id.removeprefix('campaign/')} is not running "
            f"({description.status.name.lower() if description.status else '?'}): "
            "`campaign status` shows how it ended",
            file=out,
        )
        return 1
    missing = []
    for queue, command in (
        (settings.task_queue, "posttrain-env worker (or `server`)"),
        (settings.agent_task_queue, "posttrain-env agent-worker"),
    ):
        if not await _has_pollers(client, queue):
            missing.append(f"{queue!r}: start `{command}`")
    current = await handle.query(CampaignWorkflow.status)
    print(describe(current), file=out)
    if missing:
        print("no worker polls " + "; ".join(missing), file=out)
        print("it goes on (nothing finished runs again) as soon as they do", file=out)
        return 1
    print("its workers are polling: it goes on by itself", file=out)
    return 0


async def _has_pollers(client: Client, queue: str) -> bool:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    kinds = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
    for kind in kinds:
        answer = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=kind,
            )
        )
        if answer.pollers:
            return True
    return False
