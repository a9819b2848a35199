"""`posttrain-env temporal setup | dev-server`: a Temporal of your own.

    posttrain-env temporal setup       register the search attributes the namespace lacks (at
                                       TEMPORAL_ADDRESS)
    posttrain-env temporal dev-server  run the file-backed dev server on its own, restarting it
                                       when it exits (`posttrain_server/temporal/standalone.py`)

`setup` is idempotent: a second run adds nothing. On Temporal Cloud (whose operator service
does not add search attributes) it prints the `tcld` commands to run instead. The embedded dev
server and `dev-server` need none of this: they register them at every start.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain_common.settings import Settings

TEMPORAL_HELP = "a Temporal of your own: set up its namespace, or run the dev server alone"


def add_temporal_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    temporal = subparsers.add_parser("temporal", help=TEMPORAL_HELP, description=TEMPORAL_HELP)
    commands = temporal.add_subparsers(dest="temporal_command", required=True)
    commands.add_parser(
        "setup",
        help="register the search attributes episodes and jobs upsert (idempotent)",
    )
    dev = commands.add_parser(
        "dev-server",
        help="run the file-backed Temporal dev server on its own (the production shape on one "
        "machine), starting it again when it exits",
    )
    dev.add_argument(
        "--state-dir",
        type=Path,
        help="its database and log (default: $POSTTRAIN_STATE_DIR/temporal-dev)",
    )
    dev.add_argument("--port", type=int, help="its frontend on 127.0.0.1 (POSTTRAIN_TEMPORAL_PORT)")
    dev.add_argument("--ui-port", type=int, help="its UI (POSTTRAIN_TEMPORAL_UI_PORT)")
    dev.add_argument("--no-ui", action="store_true", help="serve no UI")
    dev.add_argument("--metrics-port", type=int, help="its Prometheus metrics (default: none)")
    dev.add_argument(
        "--no-restart", action="store_true", help="exit 1 when the server exits, instead"
    )


def run_temporal(args: argparse.Namespace) -> int:
    """Run a parsed `temporal` command; the exit status."""
    from posttrain_common.settings import Settings

    settings = Settings()
    if args.temporal_command == "setup":
        return asyncio.run(_setup(settings))
    if args.temporal_command == "dev-server":
        return asyncio.run(_dev_server(settings, args))
    return 2


async def _dev_server(settings: Settings, args: argparse.Namespace) -> int:
    from posttrain_server.shutdown import stop_on_signals
    from posttrain_server.temporal.dev_server import EmbeddedTemporalConfig
    from posttrain_server.temporal.standalone import Supervision, serve_dev_server

    for flag in ("port", "ui_port", "metrics_port"):
        value = getattr(args, flag)
        if value is not None and not 0 < value < 65536:
            name = flag.replace("_", "-")
            print(f"posttrain-env temporal dev-server: --{name} {value}: 1-65535", file=sys.stderr)
            return 2
    config = EmbeddedTemporalConfig(
        state_dir=args.state_dir or settings.state_dir / "temporal-dev",
        port=args.port or settings.temporal_port,
        ui_port=args.ui_port or settings.temporal_ui_port,
        headless=args.no_ui,
        metrics_port=args.metrics_port,
    )
    stop = stop_on_signals()
    return await serve_dev_server(
        config, stop, sys.stdout, Supervision(restart=not args.no_restart)
    )


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
