"""`posttrain-env hub`: the local backend's hub of base models and datasets.

    posttrain-env hub add-model <repo_id> <folder>     copy a model in; prints its revision
    posttrain-env hub add-dataset <repo_id> <folder>   the same for a dataset
    posttrain-env hub list                             every repo, its `main` and revisions

The hub lives in `<POSTTRAIN_STATE_DIR>/local/hub`. A revision is a hash of the files, so
importing the same files twice gives the same revision; `main` names the latest import.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HUB_HELP = "the local backend's base models and datasets"


def add_hub_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register `hub` and its subcommands on the top-level parser's subparsers."""
    hub = subparsers.add_parser("hub", help=HUB_HELP, description=HUB_HELP)
    commands = hub.add_subparsers(dest="hub_command", required=True)
    for kind in ("model", "dataset"):
        add = commands.add_parser(
            f"add-{kind}",
            help=f"copy a {kind} folder into the hub and print its revision",
        )
        add.add_argument("repo_id", help="`name` or `org/name`")
        add.add_argument("folder", type=Path, help=f"the {kind}'s files")
    commands.add_parser("list", help="every repo with its `main` revision")


def run_hub(args: argparse.Namespace) -> int:
    """Run a parsed `hub` command; returns the exit status (1 with a message on a bad repo id,
    folder or file, never a traceback)."""
    from activities.backends.local.hub import HubError, LocalHub
    from posttrain_common.settings import Settings

    hub = LocalHub(Settings().state_dir / "local" / "hub")
    try:
        if args.hub_command == "list":
            for repo in hub.list():
                count = len(repo.revisions)
                print(f"{repo.kind[:-1]:8} {repo.repo_id}  main={repo.main}  ({count} revisions)")
            return 0
        kind = "models" if args.hub_command == "add-model" else "datasets"
        revision = hub.add(kind, args.repo_id, args.folder)
    except (HubError, OSError) as exc:
        print(f"posttrain-env hub: {exc}", file=sys.stderr)
        return 1
    print(revision)
    return 0
