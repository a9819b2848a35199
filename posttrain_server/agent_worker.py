"""`posttrain-env agent-worker`: the only process that runs agent code (DESIGN §10).

It polls the agent task queue (`POSTTRAIN_AGENT_TASK_QUEUE`, default `posttrain-agents`) for
agent turns and runs each in a process of its own (activities/campaigns/agent_turns.py). It refuses
to
start where the broker's secrets are: with `HF_TOKEN` set, with the server key in its
environment (`POSTTRAIN_SERVER_KEY`), or with a server key file it can read (its state dir's,
`POSTTRAIN_SERVER_KEY_FILE`, or the one beside the campaigns folder it shares with the
server). Run it as another user, or with a state dir of its own and the server's campaigns
folder (`POSTTRAIN_CAMPAIGNS_DIR`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.campaigns.agent_turns import AgentTurnActivities
from activities.campaigns.store import CampaignStore
from posttrain_common.keys import KEY_FILE_SETTING, KEY_HEX_SETTING
from posttrain_common.settings import Settings
from posttrain_server.shutdown import stop_on_signals
from posttrain_server.temporal.client import connect

log = logging.getLogger(__name__)
BROKER_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def key_paths(settings: Settings, environ: Mapping[str, str]) -> list[Path]:
    paths = [settings.server_key_path, settings.campaign_root.parent / "server.key"]
    if environ.get(KEY_FILE_SETTING):
        paths.append(Path(environ[KEY_FILE_SETTING]))
    return paths


def refusal(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why this process may not run agent code, or None."""
    for name in BROKER_TOKENS:
        if environ.get(name):
            return (
                f"{name} is set: the agent worker runs agent code and must never hold the "
                "broker's token; start it in an environment without it"
            )
    if environ.get(KEY_HEX_SETTING):
        return (
            f"{KEY_HEX_SETTING} is set: the agent worker runs agent code and must never hold "
            "the server key; start it in an environment without it"
        )
    for path in key_paths(settings, environ):
        if path.is_file() and os.access(path, os.R_OK):
            return (
                f"the server key {path} is readable by this process: agent code must never run "
                "where the broker's secrets are. Run the agent worker as a user that cannot "
                "read it, or give it a state dir of its own (POSTTRAIN_STATE_DIR) and the "
                "server's campaigns folder (POSTTRAIN_CAMPAIGNS_DIR, outside the server's "
                "state dir)"
            )
    return None


def build_agent_worker(
    client: Client,
    settings: Settings,
    environ: Mapping[str, str],
    *,
    task_queue: str | None = None,
) -> Worker:
    turns = AgentTurnActivities(CampaignStore(settings.campaign_root), environ)
    return Worker(
        client,
        task_queue=task_queue or settings.agent_task_queue,
        activities=[turns.agent_turn, turns.check_agents],
        max_concurrent_activities=settings.agent_turns_at_once,
        # Server-side: the queue's dispatch rate, whichever agent worker polls.
        max_task_queue_activities_per_second=settings.agent_turns_per_second,
    )


async def run_agent_worker(
    turns_at_once: int | None = None, turns_per_second: float | None = None
) -> int:
    """Serve agent turns until SIGINT or SIGTERM; 2 when it refuses to start. The flags, when
    given, win over `POSTTRAIN_AGENT_TURNS_AT_ONCE` and `POSTTRAIN_AGENT_TURNS_PER_SECOND`."""
    given = {"agent_turns_at_once": turns_at_once, "agent_turns_per_second": turns_per_second}
    settings = Settings(**{name: value for name, value in given.items() if value is not None})
    problem = refusal(settings, os.environ)
    if problem is not None:
        print(f"posttrain-env agent-worker: {problem}", file=sys.stderr, flush=True)
        return 2
    client = await connect(settings, serve_sdk_metrics=True)
    worker = build_agent_worker(client, settings, os.environ)
    stop = stop_on_signals()
    log.info(
        "agent worker on task queue %r at %s (campaigns in %s; %d turns at once, %s)",
        settings.agent_task_queue,
        settings.temporal_address,
        settings.campaign_root,
        settings.agent_turns_at_once,
        "unpaced"
        if settings.agent_turns_per_second is None
        else f"{settings.agent_turns_per_second:g} turns started per second on the queue",
    )
    async with worker:
        await stop.wait()
    return 0
