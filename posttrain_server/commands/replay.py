"""`posttrain-env replay-store`: the replay backend's store (docs/backends.md, "Replay backend").

    posttrain-env replay-store build [--audit-dir DIR] [--campaign ID] [--store DIR]
                                     [--tasks-dir DIR]
    posttrain-env replay-store list [--store DIR]

`build` records every ended job of a deployment's audit records (default: its
`<state_dir>/audit`, or POSTTRAIN_AUDIT_DIR) into the store (default: POSTTRAIN_REPLAY_STORE, else
`<state_dir>/replay/store`); `--campaign` only a campaign's rollouts. `list` prints each key with
its role, task, state and running time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPLAY_HELP = "the replay backend's store of recorded job outcomes"


def add_replay_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    """Register `replay` and its subcommands on the top-level parser's subparsers."""
    replay = subparsers.add_parser("replay-store", help=REPLAY_HELP, description=REPLAY_HELP)
    commands = replay.add_subparsers(dest="replay_command", required=True)
    build = commands.add_parser(
        "build", help="record the ended jobs of a deployment's audit records into the store"
    )
    build.add_argument("--audit-dir", type=Path, help="default: the deployment's audit folder")
    build.add_argument("--campaign", help="only the rollouts of this campaign")
    build.add_argument("--tasks-dir", type=Path, help="default: the deployment's tasks")
    build.add_argument("--store", type=Path, help="default: POSTTRAIN_REPLAY_STORE")
    listing = commands.add_parser("list", help="every recording of the store")
    listing.add_argument("--store", type=Path, help="default: POSTTRAIN_REPLAY_STORE")


def run_replay(args: argparse.Namespace) -> int:
    """Run a parsed `replay` command; returns the exit status (1 with a message on a folder
    that cannot be read, never a traceback)."""
    from activities.backends.replay.from_audit import build_store
    from activities.backends.replay.settings import ReplaySettings
    from activities.backends.replay.store import ReplayStore
    from posttrain_common.settings import Settings
    from tasks.registry import TASKS_DIR

    settings = Settings()
    root = args.store or ReplaySettings().store or settings.state_dir / "replay" / "store"
    store = ReplayStore(root)
    if args.replay_command == "list":
        for key in store.keys():
            recording = store.get(key)
            if recording is not None:
                inputs = recording.inputs
                print(
                    f"{key}  {inputs.role.value:6} {inputs.task_id}  {recording.state:9} "
                    f"{recording.running_s:g} s  {recording.source}"
                )
        return 0
    audit_dir = args.audit_dir or settings.audit_folder
    if not audit_dir.is_dir():
        print(f"posttrain-env replay-store: no audit folder at {audit_dir}", file=sys.stderr)
        return 1
    tasks_dir = args.tasks_dir or settings.tasks_dir or TASKS_DIR
    report = build_store(audit_dir, tasks_dir, store, campaign_id=args.campaign)
    print(
        f"{report.episodes} episodes: {report.recorded} recordings written, {report.known} "
        f"already in {root}"
    )
    for why, count in sorted(report.skipped.items()):
        print(f"  skipped {count}: {why}")
    for job in report.not_recorded:  # every job, so that none is left out unsaid
        print(f"  not recorded: {job.episode_id}/{job.job_id} ({job.role}): {job.why}")
    return 0
