"""`posttrain-env temporal setup`: register the search attributes on a Temporal of your own.

    posttrain-env temporal setup    add what the namespace lacks (at TEMPORAL_ADDRESS)

Idempotent: a second run adds nothing. On Temporal Cloud (whose operator service does not add
search attributes) it prints the `tcld` commands to run instead. The embedded dev server needs
none of this: it registers them itself at start.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain_common.settings import Settings

TEMPORAL_HELP = "set up a Temporal namespace of your own for posttrain-env"


def add_temporal_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    temporal = subparsers.add_parser("temporal", help=TEMPORAL_HELP, description=TEMPORAL_HELP)
    commands = temporal.add_subparsers(dest="temporal_command", required=True)
    commands.add_parser(
        "setup",
        help="register the search attributes episodes and jobs upsert (idempotent)",
    )


def run_temporal(args: argparse.Namespace) -> int:
    """Run a parsed `temporal` command; the exit status."""
    from posttrain_common.settings import Settings

    settings = Settings()
    if args.temporal_command == "setup":
        return asyncio.run(_setup(settings))
    return 2


async def _setup(settings: Settings) -> int:
    from temporalio.service import RPCError

    from posttrain_server.temporal.client import connect
    from posttrain_server.temporal.setup import (
        SearchAttributeSetupError,
        is_cloud,
        register_search_attributes,
        tcld_commands,
    )

    if is_cloud(settings.temporal_address):
        print("# Temporal Cloud: register the search attributes with tcld:")
        for line in tcld_commands(settings.temporal_namespace):
            print(line)
        return 0
    try:
        client = await connect(settings)
        added = await register_search_attributes(client)
    except SearchAttributeSetupError as exc:
        print(f"posttrain-env temporal setup: {exc}", file=sys.stderr)
        return 1
    except (RPCError, RuntimeError) as exc:
        print(
            f"posttrain-env temporal setup: cannot set up {settings.temporal_namespace!r} at "
            f"{settings.temporal_address}: {exc}",
            file=sys.stderr,
        )
        return 1
    where = f"namespace {settings.temporal_namespace!r} at {settings.temporal_address}"
    if added:
        print(f"registered {', '.join(added)} in {where}")
    else:
        print(f"every search attribute is already registered in {where}")
    return 0
