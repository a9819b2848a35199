"""`posttrain-env` command line: `demo`, `server`, `worker`, `agent-worker`, `cluster-local`,
`campaign`, `hub`, `temporal`, `episodes`, `key`, `tasks`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from activities.backends.registry import UnknownBackend
from posttrain_server.shutdown import exit_now


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain-env")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="run a Temporal worker on the task queue `posttrain`")
    agents = sub.add_parser(
        "agent-worker", help="run agent turns (campaigns) on their own task queue, no secrets"
    )
    agents.add_argument(
        "--turns-at-once",
        type=int,
        default=None,
        help="turns this worker runs at once (default 16; POSTTRAIN_AGENT_TURNS_AT_ONCE)",
    )
    agents.add_argument(
        "--turns-per-second",
        type=float,
        default=None,
        help="turns started per second on the agent task queue, by all its workers together "
        "(default: unpaced; POSTTRAIN_AGENT_TURNS_PER_SECOND)",
    )
    from posttrain_server.commands.campaign import add_campaign_commands

    add_campaign_commands(sub)
    from posttrain_server.server import add_server_arguments

    add_server_arguments(
        sub.add_parser("server", help="the gateway, a worker and the embedded Temporal server")
    )
    from posttrain_server.cluster_local import CLUSTER_HELP, add_cluster_local_arguments

    add_cluster_local_arguments(
        sub.add_parser("cluster-local", help=CLUSTER_HELP, description=CLUSTER_HELP)
    )
    from posttrain_server.commands.hub import add_hub_commands

    add_hub_commands(sub)
    from posttrain_server.commands.temporal import add_temporal_commands

    add_temporal_commands(sub)
    from posttrain_server.commands.episodes import add_episodes_commands

    add_episodes_commands(sub)
    from posttrain_server.commands.key import add_key_commands

    add_key_commands(sub)
    from posttrain_server.commands.replay import add_replay_commands

    add_replay_commands(sub)
    from posttrain_server.commands.tasks import add_tasks_commands

    add_tasks_commands(sub)
    demo = sub.add_parser(
        "demo",
        help="play one whole episode on this machine (local backend, no token): t0_artifact "
        "with its reference solution unless told otherwise",
    )
    demo.add_argument("--task", default="t0_artifact", help="the task to play")
    demo.add_argument(
        "--script",
        type=Path,
        default=None,
        help="the training script to submit (default: the task's reference solution)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # The demo prints its own story; the services' INFO lines would drown it.
    level = logging.WARNING if args.command == "demo" else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    status = 0
    try:
        if args.command == "worker":
            from posttrain_server.worker import run_worker

            asyncio.run(run_worker())
        elif args.command == "server":
            from posttrain_server.server import run

            status = run(args.host, args.port, with_worker=not args.no_worker)
        elif args.command == "cluster-local":
            from posttrain_server.cluster_local import run_cluster_local

            status = run_cluster_local(args)
        elif args.command == "agent-worker":
            from posttrain_server.agent_worker import run_agent_worker

            status = asyncio.run(run_agent_worker(args.turns_at_once, args.turns_per_second))
        elif args.command == "campaign":
            from posttrain_server.commands.campaign import run_campaign_command

            status = run_campaign_command(args)
        elif args.command == "hub":
            from posttrain_server.commands.hub import run_hub

            status = run_hub(args)
        elif args.command == "temporal":
            from posttrain_server.commands.temporal import run_temporal

            status = run_temporal(args)
        elif args.command == "episodes":
            from posttrain_server.commands.episodes import run_episodes

            status = run_episodes(args)
        elif args.command == "key":
            from posttrain_server.commands.key import run_key

            status = run_key(args)
        elif args.command == "replay-store":
            from posttrain_server.commands.replay import run_replay

            status = run_replay(args)
        elif args.command == "tasks":
            from posttrain_server.commands.tasks import run_tasks

            status = run_tasks(args)
        elif args.command == "demo":
            from posttrain_server.demo import main as run_demo

            status = run_demo(args.task, args.script)
    except (ValidationError, UnknownBackend) as exc:  # a bad setting: say which, no traceback
        print(f"posttrain-env: invalid settings:\n{exc}", file=sys.stderr)
        status = 2
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except Exception:
        logging.exception("posttrain-env %s failed", args.command)
        status = 1
    exit_now(status)


if __name__ == "__main__":
    main()
