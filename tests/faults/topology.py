"""The fault matrix's topology: `cluster-local`'s processes (the package's `LocalCluster`: one
Temporal dev server, two gateways, two workers, one key) on the fake or the local backend, what
the harness kills in it, and what it reads of the backend and of Temporal to check a cell. One
topology serves every cell of a run: a killed process is started again before the cell ends."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.backends.fake.backend import FakeBackend, FakeScenario
from activities.backends.local.backend import LOCAL_PRICES
from activities.backends.local.store import JobStore
from posttrain_common.contracts.episode_calls import EpisodeStatus
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import JobState
from posttrain_server.cluster_local import LocalCluster, Member
from tests.gateway.production import (
    check_cluster_logs,
    cluster_config,
    cluster_environment,
    start_cluster,
)
from tests.waiting import eventually
from workflows.episode.workflow import EpisodeWorkflow
from workflows.ids import episode_workflow_id

BackendName = Literal["fake", "local"]
Target = Literal["none", "gateway", "worker", "temporal", "everything"]
KILL_TARGETS: tuple[Target, ...] = ("gateway", "worker", "temporal", "everything")
# Waiting on the topology: a restart on a loaded 2-core machine, a job of a few seconds.
SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class BackendRecord:
    """One job as the backend holds it (one per start: a job started twice is two records)."""

    key: str
    job_id: str
    role: JobRole
    state: JobState
    running_s: float
    stored_bytes: int = 0  # what an ended agent job's artifact keeps (charged as storage)


class Topology:
    def __init__(
        self,
        cluster: LocalCluster,
        backend: BackendName,
        scenario: FakeScenario,
        client: Client,
    ) -> None:
        self.cluster = cluster
        self.backend = backend
        self.scenario = scenario
        self.client = client
        self.state_dir = cluster.config.state_dir
        prices = scenario.prices if backend == "fake" else LOCAL_PRICES
        self.prices = {p.name: p.micro_usd_per_minute for p in prices}

    @classmethod
    @asynccontextmanager
    async def running(
        cls, state_dir: Path, backend: BackendName, scenario: FakeScenario
    ) -> AsyncIterator[Topology]:
        extra = {"POSTTRAIN_BACKEND": backend}
        config = cluster_config(state_dir, cluster_environment(state_dir, scenario, **extra))
        cluster = await start_cluster(config)
        try:
            client = await Client.connect(
                cluster.config.temporal_address, data_converter=pydantic_data_converter
            )
            yield cls(cluster, backend, scenario, client)
        finally:
            await cluster.stop()
            check_cluster_logs(cluster)

    @property
    def urls(self) -> tuple[str, str]:
        first, second = (g.url for g in self.cluster.gateways[:2])
        assert first is not None and second is not None
        return first, second

    # -- faults ------------------------------------------------------------------------------

    async def members_for(
        self, target: Target, gateway: int, episode_id: str, activity_of: str | None = None
    ) -> list[Member]:
        """What a kill of `target` takes down: the gateway `gateway` (the one the call in flight
        went to), the worker running the pending activity of workflow `activity_of` when one is
        named, else the worker that last completed a workflow task of the episode (its sticky
        queue holds the episode), Temporal, or every process."""
        cluster = self.cluster
        match target:
            case "none":
                return []
            case "gateway":
                return [cluster.gateways[gateway]]
            case "worker":
                running = await self.activity_worker(activity_of) if activity_of else None
                return [running or await self.busy_worker(episode_id)]
            case "temporal":
                return [cluster.temporal]
            case "everything":
                return cluster.members

    async def activity_worker(self, workflow_id: str) -> Member | None:
        """The worker running `workflow_id`'s pending activity, if one of ours does."""
        described = await self.client.get_workflow_handle(workflow_id).describe()
        for pending in described.raw_description.pending_activities:
            worker = self._worker_of(pending.last_worker_identity)
            if worker is not None:
                return worker
        return None

    def _worker_of(self, identity: str) -> Member | None:
        """The worker whose Temporal identity (the SDK's default, `pid@host`) this is."""
        pid = identity.split("@", 1)[0]
        return next((w for w in self.cluster.workers if str(w.pid) == pid), None)

    async def busy_worker(self, episode_id: str) -> Member:
        handle = self.client.get_workflow_handle(episode_workflow_id(episode_id))
        identity = ""
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_completed_event_attributes"):
                identity = event.workflow_task_completed_event_attributes.identity
        return self._worker_of(identity) or self.cluster.workers[0]

    async def make_whole(self) -> list[str]:
        """Start again every member that is not running (none should be, between cells); the
        names started."""
        dead = [m for m in self.cluster.members if not m.alive]
        if dead:
            await self.cluster.restart(*dead)
        return [m.name for m in dead]

    # -- what the backend holds ----------------------------------------------------------------

    def jobs_of(self, episode_id: str) -> list[BackendRecord]:
        prefix = f"{episode_workflow_id(episode_id)}/job/"
        records = self._fake_jobs() if self.backend == "fake" else self._local_jobs()
        return [r for r in records if r.key.startswith(prefix)]

    def _fake_jobs(self) -> list[BackendRecord]:
        backend = FakeBackend(self.state_dir / "fake", self.scenario)
        while True:  # two reads: retried if a job was added between them (jobs only append)
            requests = backend.requests()
            views = backend.views(datetime.now(UTC))
            if len(requests) == len(views):
                break
        return [
            BackendRecord(
                key=request.key,
                job_id=request.job_id,
                role=request.role,
                state=view.state,
                running_s=view.running_s,
                stored_bytes=view.stored_bytes or 0,
            )
            for request, view in zip(requests, views, strict=True)
        ]

    def _local_jobs(self) -> list[BackendRecord]:
        store = JobStore(self.state_dir / "local" / "jobs", sys.executable)
        records = []
        for folder in sorted(store.jobs_dir.iterdir()):
            view = store.view(folder.name)
            spec_file = folder / "job.json"
            if view is None or not spec_file.exists():
                continue
            spec = json.loads(spec_file.read_text())
            records.append(
                BackendRecord(
                    key=view.key,
                    job_id=spec["job_id"],
                    role=JobRole(spec["role"]),
                    state=view.state,
                    running_s=view.running_s,
                    stored_bytes=view.stored_bytes or 0,
                )
            )
        return records

    # -- what Temporal holds -------------------------------------------------------------------

    async def status(self, episode_id: str) -> EpisodeStatus:
        handle = self.client.get_workflow_handle_for(
            EpisodeWorkflow.run, episode_workflow_id(episode_id)
        )
        return await handle.query(EpisodeWorkflow.status)

    async def wait_closed(self, episode_id: str) -> None:
        """Until the episode's workflow has completed (it stays open while a job is live)."""
        handle = self.client.get_workflow_handle(episode_workflow_id(episode_id))

        async def closed() -> bool:
            description = await handle.describe()
            return description.status is not WorkflowExecutionStatus.RUNNING

        await eventually(closed, SETTLE_TIMEOUT_S, f"episode {episode_id}'s workflow to complete")
