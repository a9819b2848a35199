"""`posttrain-env episodes retry-cancel | confirm-cancelled | end | cancel`: an operator's repairs.

    posttrain-env episodes retry-cancel <episode_id> [--reason TEXT] [--by NAME]
    posttrain-env episodes confirm-cancelled <episode_id> <job_id> --reason TEXT [--minutes N]
    posttrain-env episodes end <episode_id> --reason TEXT
    posttrain-env episodes cancel <episode_id> [--reason TEXT]      (= end, with a stock reason)

Each is the episode's `operator_action` update: a worker must be running. The episode refuses a
repair that does not apply (the command then exits 1 and says why, and nothing is recorded);
one that applies lands in the episode's audit record with who asked and why. Each is safe to
run again: a second `confirm-cancelled` or `end` is refused, a second `retry-cancel` asks again.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from temporalio.client import Client

    from posttrain_common.contracts.operator import OperatorRequest

# How long a repair waits for a worker to take it.
REPAIR_TIMEOUT = timedelta(seconds=30)
CANCEL_REASON = "cancelled with `posttrain-env episodes cancel`"
RETRY_REASON = "the cancellation is taking too long"


def default_operator() -> str:
    """Who asks, when --by is not given: the login name and host."""
    try:
        user = getpass.getuser()
    except OSError:  # no login name (a container without one)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def add_repair_commands(commands: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    retry = commands.add_parser(
        "retry-cancel",
        help="ask the backend again, now, to cancel the episode's jobs whose cancellation is "
        "not confirmed (skips the backoff)",
    )
    retry.add_argument("episode_id")
    retry.add_argument("--reason", default=RETRY_REASON, help="why (kept in the audit record)")
    confirm = commands.add_parser(
        "confirm-cancelled",
        help="attest that a job is gone (checked on the provider's console): settle it at its "
        "worst case, or at --minutes, and stop waiting for it",
    )
    confirm.add_argument("episode_id")
    confirm.add_argument("job_id")
    confirm.add_argument("--reason", required=True, help="what you checked (kept in the record)")
    confirm.add_argument(
        "--minutes", type=int, help="billed minutes the provider shows (default: the worst case)"
    )
    end = commands.add_parser(
        "end", help="end a running episode now (reason cancelled_by_operator, reward None)"
    )
    end.add_argument("episode_id")
    end.add_argument("--reason", required=True, help="why (kept in the audit record)")
    cancel = commands.add_parser(
        "cancel", help="end a running episode now, as `end` with a stock reason"
    )
    cancel.add_argument("episode_id")
    cancel.add_argument("--reason", default=CANCEL_REASON, help="why (kept in the audit record)")
    for parser in (retry, confirm, end, cancel):
        parser.add_argument("--by", help="who asks (default: login name @ host)")


REPAIRS = {
    "retry-cancel": "retry_cancel",
    "confirm-cancelled": "confirm_cancelled",
    "end": "end",
    "cancel": "end",
}


def repair_request(args: argparse.Namespace) -> OperatorRequest:
    """The update's argument; raises ValidationError on a bad --reason, --by or --minutes."""
    from posttrain_common.contracts.operator import OperatorRequest

    return OperatorRequest.model_validate(
        {
            "action": REPAIRS[args.episodes_command],
            "by": args.by or default_operator(),
            "reason": args.reason,
            "job_id": getattr(args, "job_id", None),
            "minutes": getattr(args, "minutes", None),
        }
    )


async def run_repair(client: Client, args: argparse.Namespace) -> int:
    """Send the repair; 0 when it was done, 1 when refused or not reachable, 2 for bad input."""
    from temporalio.client import (
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
    )
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError

    from workflows.episode.workflow import EpisodeWorkflow
    from workflows.ids import episode_workflow_id

    name = f"posttrain-env episodes {args.episodes_command}"
    try:
        request = repair_request(args)
    except ValidationError as err:
        problems = "; ".join(
            f"--{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            for e in err.errors()
        )
        print(f"{name}: {problems}", file=sys.stderr)
        return 2
    episode_id = args.episode_id
    handle = client.get_workflow_handle_for(EpisodeWorkflow.run, episode_workflow_id(episode_id))
    closed = await closed_status(client, episode_id)
    if closed is not None:
        print(f"{name}: {closed}", file=sys.stderr)
        return 1
    try:
        outcome = await handle.execute_update(
            EpisodeWorkflow.operator_action, request, rpc_timeout=REPAIR_TIMEOUT
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        why = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
        print(f"{name}: refused: {why}", file=sys.stderr)
        return 1
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        print(
            f"{name}: no worker took the request within {REPAIR_TIMEOUT.seconds} s "
            "(is a worker running?); nothing was done",
            file=sys.stderr,
        )
        return 1
    except RPCError as err:
        closed = await closed_status(client, episode_id)
        print(f"{name}: {closed or err.message}", file=sys.stderr)
        return 1
    print(f"episode {episode_id}: {outcome.message} (recorded: by {request.by}: {request.reason})")
    return 0


async def closed_status(client: Client, episode_id: str) -> str | None:
    """Why no repair can reach the episode's workflow (None: it runs)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from workflows.ids import episode_workflow_id

    try:
        described = await client.get_workflow_handle(episode_workflow_id(episode_id)).describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return f"no episode {episode_id!r} in this namespace"
        raise
    status = described.status
    if status is WorkflowExecutionStatus.RUNNING:
        return None
    if status is not None and status in (
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    ):
        return (
            f"episode {episode_id}'s workflow was {status.name.lower().replace('_', ' ')}: the "
            "reconciler starts it again to end it within one period (POSTTRAIN_REAPER_EVERY_S); "
            "nothing was done"
        )
    name = status.name.lower() if status else "closed"
    return f"episode {episode_id} is closed ({name}): nothing to repair"
