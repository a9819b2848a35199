"""`posttrain-env key`: the deployment's server key (docs/security.md, "One key per deployment").

    posttrain-env key new PATH          a new key file (0600, 32 random bytes); its fingerprint
    posttrain-env key show              this process's key (where from, fingerprint) and the
                                        fingerprint the deployment recorded
    posttrain-env key forget [--force]  forget the recorded fingerprint, so that the next process
                                        to start records its key's: the step of a key rotation
                                        between stopping every process and starting them again

`forget` refuses while an episode or a job of the task queue is running (their nonces, tokens
and session ids derive from the old key: a grader's score line would no longer verify) unless
`--force`. On the embedded Temporal (no TEMPORAL_ADDRESS) it starts the state dir's Temporal
for the moment it needs it, so the server must be stopped (its port busy: refused).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain_common.keys import ServerKeyError, write_new_key

if TYPE_CHECKING:
    from temporalio.client import Client

    from posttrain_common.settings import Settings

KEY_HELP = "the deployment's server key: make one, show its fingerprint, forget the recorded one"
_QUEUE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")


def add_key_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    key = subparsers.add_parser("key", help=KEY_HELP, description=KEY_HELP)
    commands = key.add_subparsers(dest="key_command", required=True)
    new = commands.add_parser("new", help="write a new key file (0600), never over one")
    new.add_argument("path", type=Path)
    commands.add_parser("show", help="this key's fingerprint and the deployment's")
    forget = commands.add_parser(
        "forget", help="forget the deployment's fingerprint (every process stopped first)"
    )
    forget.add_argument(
        "--force",
        action="store_true",
        help="even while episodes or jobs run (their score lines will not verify)",
    )


def run_key(args: argparse.Namespace) -> int:
    """Run a parsed `key` command; the exit status (2: a bad key setting, 1: refused)."""
    from posttrain_common.settings import Settings

    try:
        if args.key_command == "new":
            key = write_new_key(args.path)
            print(f"{args.path}: a new server key, fingerprint {key.fingerprint()}")
            return 0
        settings = Settings()
        if args.key_command == "show":
            return asyncio.run(_show(settings))
        return asyncio.run(_forget(settings, force=args.force))
    except ServerKeyError as exc:
        print(f"posttrain-env key: {exc}", file=sys.stderr)
        return 2


class TemporalBusy(RuntimeError):
    """The state dir's embedded Temporal is running: so is its server."""


def _embedded_running(settings: Settings) -> bool:
    """The state dir's embedded Temporal is alive (its server's child: it dies with it)."""
    try:
        pid = int((settings.state_dir / "temporal.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return b"start-dev" in cmdline and str(settings.state_dir / "temporal.db").encode() in cmdline


@asynccontextmanager
async def _deployment_client(settings: Settings) -> AsyncIterator[Client]:
    """A client of the deployment's Temporal: TEMPORAL_ADDRESS, else the state dir's embedded
    server, started here (headless) for as long as the command needs it. Raises TemporalBusy
    when the embedded server runs already (its server must be stopped first)."""
    from posttrain_server.temporal.client import connect
    from posttrain_server.temporal.dev_server import EmbeddedTemporal, EmbeddedTemporalConfig

    if settings.temporal_is_external:
        yield await connect(settings)
        return
    if _embedded_running(settings):
        raise TemporalBusy(f"the server of {settings.state_dir} is running")
    embedded = EmbeddedTemporal(
        EmbeddedTemporalConfig(
            state_dir=settings.state_dir, port=settings.temporal_port, headless=True
        )
    )
    await embedded.start()
    try:
        address = embedded.config.address
        yield await connect(settings.model_copy(update={"temporal_address": address}))
    finally:
        embedded.stop()


async def _recorded_fingerprint(client: Client, task_queue: str) -> str | None:
    from posttrain_common.failures import running_description
    from workflows.operations.deployment import MEMO_KEY_FINGERPRINT, deployment_workflow_id

    handle = client.get_workflow_handle(deployment_workflow_id(client.namespace, task_queue))
    description = await running_description(handle)
    if description is None:
        return None
    return await description.memo_value(MEMO_KEY_FINGERPRINT, None, type_hint=str)


async def _show(settings: Settings) -> int:
    """This key's fingerprint, and the deployment's from its running Temporal (the embedded
    one while the server runs)."""
    from posttrain_server.commands.episodes import operator_client
    from posttrain_server.deployment_key import resolve_server_key

    key = resolve_server_key(settings)
    print(f"this key: fingerprint {key.fingerprint} ({key.source})")
    try:
        client = await operator_client(settings)
    except RuntimeError as exc:
        print(f"the deployment's: Temporal is not reachable ({exc})")
        return 1
    recorded = await _recorded_fingerprint(client, settings.task_queue)
    where = f"task queue {settings.task_queue!r}"
    if recorded is None:
        print(f"the deployment's ({where}): none recorded; the next process to start records its")
    else:
        same = "the same key" if recorded == key.fingerprint else "ANOTHER KEY"
        print(f"the deployment's ({where}): fingerprint {recorded} ({same})")
    return 0


async def _forget(settings: Settings, *, force: bool) -> int:
    from posttrain_server.deployment_key import forget_deployment
    from posttrain_server.temporal.dev_server import EmbeddedTemporalError

    queue = settings.task_queue
    if not _QUEUE.fullmatch(queue):
        print(f"posttrain-env key: task queue {queue!r} cannot be queried", file=sys.stderr)
        return 1
    try:
        async with _deployment_client(settings) as client:
            live = await client.count_workflows(
                "WorkflowType IN ('EpisodeWorkflow', 'JobWorkflow') AND "
                f"ExecutionStatus = 'Running' AND TaskQueue = '{queue}'"
            )
            if live.count and not force:
                print(
                    f"posttrain-env key: {live.count} episodes and jobs of task queue {queue!r} "
                    "are running; their score lines, tokens and session ids derive from the "
                    "current key and would not verify under a new one. Let them end (or cancel "
                    "them), or pass --force",
                    file=sys.stderr,
                )
                return 1
            forgotten = await forget_deployment(client, queue)
    except (TemporalBusy, EmbeddedTemporalError) as exc:
        print(
            f"posttrain-env key: {exc}; stop it first: a key changes only while every process "
            "of the deployment is stopped",
            file=sys.stderr,
        )
        return 1
    if forgotten:
        print(
            f"forgot the key fingerprint of task queue {queue!r}: start every process with the "
            "new key"
        )
    else:
        print(f"no key fingerprint was recorded for task queue {queue!r}")
    return 0
