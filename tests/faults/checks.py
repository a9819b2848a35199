"""The invariants every cell of the fault matrix is checked against, once its episodes ended:

- each episode reached the end it would have reached without the kill (reason and reward);
- every job exists exactly once in the backend (one record per key and per job id), and the
  episode started the jobs the play asked for, no more;
- each job was settled once: the episode's settled spend is the backend's own record of its jobs
  (price × every started minute of each agent job and dev evaluation, graders free, plus the
  storage of what each agent job's artifact keeps at the deployment's storage price), no minute
  billed twice, nothing left reserved;
- the request around the kill was answered once: sent again with its request id through the
  other gateway it gets the same answer, and the episode counted one step per request;
- no job is live once its episode has ended (its workflow completed).

Each failed invariant is one sentence in the cell's result (the matrix prints them).
"""

from __future__ import annotations

from posttrain_common.contracts.jobs import JobRole
from posttrain_common.settings import Settings
from posttrain_env.models import MICRO
from tests.faults.player import Answer, Player
from tests.faults.plays import FLAVOR, Expected
from tests.faults.topology import BackendRecord, Topology
from workflows.episode.ledger import billed_minutes, storage_cost_micro_usd

CHARGED = (JobRole.agent, JobRole.dev)  # graders are free (workflows/episode/ledger.py)


def bill_micro_usd(record: BackendRecord, micro_usd_per_minute: int, settings: Settings) -> int:
    """What the backend's record of a charged job costs: every started minute, and for an
    agent job the storage its artifact keeps (the cluster runs on the settings' defaults)."""
    compute = micro_usd_per_minute * billed_minutes(record.running_s)
    if record.role is not JobRole.agent:
        return compute
    storage = storage_cost_micro_usd(
        record.stored_bytes,
        round(settings.storage_usd_per_tb_month * MICRO),
        settings.storage_billed_days,
    )
    return compute + storage


async def check(
    topology: Topology,
    player: Player,
    expected: Expected,
    around: Answer | None,
    again: Answer | None,
) -> list[str]:
    failures: list[str] = []
    if around is not None and again is not None and not again.same_as(around):
        failures.append(
            f"{around.tool} sent again (request {around.request_id}) was answered "
            f"{again.data!r}, first {around.data!r}"
        )
    price = topology.prices[FLAVOR]
    settings = Settings()
    for episode_id, end in expected.ends.items():
        await topology.wait_closed(episode_id)
        status = await topology.status(episode_id)
        name = f"episode {episode_id}"
        reached = (status.end.reason, status.end.reward) if status.end else None
        if reached != (end.reason, end.reward):
            failures.append(f"{name} ended {reached}, expected {(end.reason, end.reward)}")
        if status.steps_used != player.steps_of(episode_id):
            failures.append(
                f"{name} counted {status.steps_used} steps for "
                f"{player.steps_of(episode_id)} requests"
            )
        records = topology.jobs_of(episode_id)
        keys = [r.key for r in records]
        if len(set(keys)) != len(keys) or len({r.job_id for r in records}) != len(records):
            failures.append(f"{name}: a job exists twice in the backend: {sorted(keys)}")
        counts = {role: sum(1 for r in records if r.role is role) for role in JobRole}
        wanted = expected.jobs.get(episode_id, {})
        if any(counts[role] != wanted.get(role, 0) for role in JobRole):
            failures.append(
                f"{name}: the backend holds "
                + ", ".join(f"{counts[r]} {r.value}" for r in JobRole)
                + " jobs; expected "
                + ", ".join(f"{wanted.get(r, 0)} {r.value}" for r in JobRole)
            )
        submitted = {
            str(a.data["job_id"])
            for a in player.answers
            if a.tool == "jobs_submit" and a.episode_id == episode_id and "job_id" in a.data
        }
        agent_jobs = {r.job_id for r in records if r.role is JobRole.agent}
        if agent_jobs != submitted:
            failures.append(f"{name}: agent jobs {agent_jobs} in the backend, {submitted} answered")
        live = [f"{r.job_id} {r.state.value}" for r in records if not r.state.terminal]
        if live:
            failures.append(f"{name} ended with jobs live in the backend: {live}")
        charged = [r for r in records if r.role in CHARGED]
        billed = sum(bill_micro_usd(r, price, settings) for r in charged)
        spend = status.service_spend
        settled = (round(spend.settled.usd * 1e6), spend.settled.jobs, spend.settled.calls)
        backend = (billed, counts[JobRole.agent], counts[JobRole.dev])
        if settled != backend or not spend.final or spend.reserved.usd != 0:
            failures.append(
                f"{name} settled (micro-USD, jobs, evaluations) {settled}, final {spend.final}, "
                f"reserved {spend.reserved.usd}; the backend's record gives {backend}"
            )
        views = {view["job_id"]: view for view in status.jobs}
        for record in charged:
            view = views.get(record.job_id)
            cost = bill_micro_usd(record, price, settings)
            if view is not None and round(view["cost_usd"] * 1e6) != cost:
                failures.append(
                    f"{name}: job {record.job_id} settled at {view['cost_usd']} USD, the "
                    f"backend's bill ({record.running_s:.1f} s, {record.stored_bytes} bytes "
                    f"kept) {cost / 1e6} USD"
                )
    return failures
