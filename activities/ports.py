"""What activities need from other workflows, as small interfaces (DESIGN §10).

Activities touch the world and nothing else: where one must reach another workflow (register a
job with the watcher, ask the account to admit an episode or accept more spend, ask whether an
episode still runs, carry a rollout's tool call to its episode), it calls one of these.
`posttrain_server/wiring.py` implements them with a Temporal client, so every
workflow-to-workflow call an activity makes is listed there.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel

from posttrain_common.contracts.audit import AuditRecord
from posttrain_common.contracts.episode_calls import EpisodeStatus, ToolCall, ToolResult
from posttrain_common.contracts.episodes import Caps, ServerSpend
from posttrain_common.contracts.jobs import BackendJob
from posttrain_common.contracts.reconcile import FindStranded, StrandedRun, StrandedSearch


class JobToWatch(BaseModel):
    """A job the watcher should follow until it ends."""

    ref: str  # the backend's id of the job
    job_workflow_id: str  # told when the job ends
    state: str
    job_id: str
    episode_id: str  # its episode is told of changes short of the end
    # The job as it started: when set, its episode is told first (the job's workflow does not).
    started: BackendJob | None = None
    # The watcher shard to follow it; empty: the worker's one watcher.
    watcher_workflow_id: str = ""


class JobWatch(Protocol):
    async def watch(self, job: JobToWatch) -> None:
        """Have the watcher of this task queue follow `job` (starting it if none runs); first
        tell its episode it started when `job.started` is set."""
        ...


class ServerAccount(Protocol):
    async def admit(self, episode_id: str, caps: Caps) -> None:
        """Count the episode as live. Raises ToolError (limit_reached, budget_exhausted) when a
        server-wide cap refuses it."""
        ...

    async def check_exposure(self, spend: ServerSpend) -> None:
        """Accept the episode's new committed spend. Raises ToolError(budget_exhausted) when it
        would pass the server-wide spend cap."""
        ...


class EpisodeLiveness(Protocol):
    async def is_running(self, episode_id: str) -> bool:
        """True while the episode's workflow runs (False once it closed, or if it never ran)."""
        ...

    async def left_behind(self, episode_id: str, job_id: str, ref: str) -> bool:
        """True when the running episode's job `job_id` is over (its job workflow reported its
        end: its submit gave up, or the job it followed ended) and `ref` is not the backend
        job it followed: nothing follows `ref` any more. False when it cannot tell."""
        ...


class EpisodeTrail(Protocol):
    async def read(self, episode_id: str) -> AuditRecord:
        """The episode's audit record as its Temporal history tells it (every run)."""
        ...


class EpisodeCalls(Protocol):
    """A rollout's tool calls, sent to its episode as the gateway sends them (by update)."""

    async def send(self, episode_id: str, call: ToolCall) -> bool:
        """Send `call` and return once the episode accepted it (not answered it); the update id
        is `<episode_id>:<request_id>`, so a resend is the same call. False when the episode's
        workflow has completed (the call can never be answered)."""
        ...

    async def result_of(self, episode_id: str, request_id: str) -> ToolResult | None:
        """The episode's answer to `request_id`, once it has one (its `result_of` query)."""
        ...

    async def status(self, episode_id: str) -> EpisodeStatus:
        """The episode's status (its `status` query; also after it completed)."""
        ...

    async def is_running(self, episode_id: str) -> bool:
        """True while the episode's workflow runs (every call it accepted gets an answer)."""
        ...


class StrandedWorkflows(Protocol):
    async def find(self, request: FindStranded) -> StrandedSearch:
        """Runs of our workflows on this task queue closed from outside (terminated, timed
        out) that nothing has wound down yet, parents first."""
        ...

    async def wind_down(self, run: StrandedRun) -> str:
        """Start it again to end (or hand its state to the running singleton); what was done."""
        ...
