"""Workflow ids, derived from domain ids (never from a capability such as a session id)."""

from __future__ import annotations

import hashlib
import re

# The ids an episode and its jobs get (minted in workflows/episode/session.py, `rollout_episode_id`
# below, and workflows/episode/jobs.py): what an operator's command checks before asking Temporal.
EPISODE_ID = re.compile(r"ep-[0-9a-f]{16}")
JOB_ID = re.compile(r"(job|eval)-[0-9a-f]{12}")
TASK_QUEUE = "posttrain"
# Agent turns run only on this queue, served by `posttrain-env agent-worker` (no broker secret).
AGENT_TASK_QUEUE = "posttrain-agents"


def session_workflow_id(session_id: str) -> str:
    # A hash: the session id is a capability and must not appear in Temporal's UI or history.
    return "session-" + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def episode_workflow_id(episode_id: str) -> str:
    return f"episode-{episode_id}"


def job_workflow_id(episode_id: str, n: int) -> str:
    return f"episode-{episode_id}/job/{n}"


def campaign_workflow_id(campaign_id: str) -> str:
    return f"campaign/{campaign_id}"


def rollout_workflow_id(rollout_id: str, attempt: int) -> str:
    """`rollout/<campaign>/<task>/<agent>/<epoch>/a<attempt>`: one workflow per attempt."""
    return f"rollout/{rollout_id}/a{attempt}"


def rollout_episode_id(rollout_id: str, attempt: int) -> str:
    """The episode an attempt plays, derived from it: a replayed start adopts the same one."""
    digest = hashlib.sha256(f"{rollout_id}/a{attempt}".encode()).hexdigest()
    return f"ep-{digest[:16]}"


def watcher_workflow_id(namespace: str, task_queue: str) -> str:
    """The task queue's watcher when it has one shard; the stem of its shards' ids otherwise."""
    return f"posttrain-watcher/{namespace}/{task_queue}"


def watcher_shard_id(watcher_id: str, shards: int, job_workflow_id: str) -> str:
    """The watcher shard that follows a job: a stable hash of the job's workflow id (SHA-256,
    the same in every process and Python version, unlike `hash`; CRC-32 was tried and put 2.3
    times the mean on one shard, its low bits following the ids' patterns). One shard keeps the
    unsharded id, so episodes started before sharding and their jobs find the watcher they
    knew."""
    if shards <= 1:
        return watcher_id
    digest = hashlib.sha256(job_workflow_id.encode()).digest()
    return f"{watcher_id}/shard-{int.from_bytes(digest[:8], 'big') % shards}"


def watcher_shard_ids(watcher_id: str, shards: int) -> list[str]:
    """Every shard's id (an operator's view, a test's clean-up)."""
    if shards <= 1:
        return [watcher_id]
    return [f"{watcher_id}/shard-{n}" for n in range(shards)]


def account_workflow_id(namespace: str, task_queue: str) -> str:
    return f"posttrain-account/{namespace}/{task_queue}"


# Signals sent between workflows that would otherwise import each other in a cycle. Each
# handler declares its name with the same constant, so sender and receiver cannot drift apart.
SIGNAL_JOB_CHANGED = "job_changed"  # JobWorkflow -> EpisodeWorkflow
SIGNAL_EPISODE_CLOSED = "episode_closed"  # EpisodeWorkflow -> SessionWorkflow
SIGNAL_LOOK_NOW = "look_now"  # EpisodeWorkflow, JobWorkflow -> WatcherWorkflow
SIGNAL_EXPOSURE = "exposure"  # EpisodeWorkflow -> AccountWorkflow
SIGNAL_RETIRE = "retire"  # EpisodeWorkflow -> AccountWorkflow
SIGNAL_TOOL_ANSWERED = "tool_answered"  # EpisodeWorkflow -> RolloutWorkflow (ToolCall.reply_to)
SIGNAL_ROLLOUT_FINISHED = "rollout_finished"  # RolloutWorkflow -> CampaignWorkflow
SIGNAL_LATE_JOB_SETTLED = "late_job_settled"  # ReaperWorkflow -> EpisodeWorkflow
