"""The eight kill points of the fault matrix, each an episode played through two gateways that
reaches a known end, with the moment at which the cell's target is killed:

(a) `jobs_submit` in flight: the backend has created the job, and its answer was lost (the fake
    drops the connection after creating it: the retried submit must find it, not start another);
(b) a job running, between two calls;
(c) `jobs_wait` in flight on a running job;
(d) `dev_evaluate` in flight, its evaluation job started (its submit answered: a kill inside
    the submit activity is (h));
(e) `submit` grading, the grader started (likewise);
(f) `jobs_cancel` in flight, the cancellation asked for and not confirmed (the fake confirms
    it after 6 s);
(g) `reset` in flight while the episode before it ends (its job's cancellation unconfirmed);
(h) `submit`'s start of the grader in flight: the backend created the grader and its answer is
    slow to come (the fake holds it SUBMIT_HANG_S), and the worker running that submit
    activity is killed. Its retry must come at the activity's heartbeat timeout, not at its
    start-to-close timeout (an evaluation killed so waited 120 s before), and find the grader
    it started: the answer must come within PROMPT_RECOVERY_S of the kill. Only the targets
    that kill that worker play it (POINT_TARGETS): under any other the answer just waits out
    the hold.

A play returns what the episode(s) must have reached and how many jobs of each role it started;
`checks.py` holds the invariants every cell is checked against.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import EndReason, JobState
from posttrain_server.cluster_local import Member
from tests.faults.player import Answer, Player
from tests.faults.topology import SETTLE_TIMEOUT_S, Target, Topology
from tests.waiting import eventually
from workflows.policies import SUBMIT_HEARTBEAT

TASK = "t0_artifact"
FLAVOR = "cpu-basic"  # every job of a play, evaluations included (the task's eval_flavor)
POINTS = {
    "a": "jobs_submit in flight",
    "b": "a job running",
    "c": "jobs_wait in flight",
    "d": "dev_evaluate running",
    "e": "submit grading",
    "f": "cancel unconfirmed",
    "g": "reset, episode ending",
    "h": "grader start in flight",
}
# The points that only some targets play (see (h)); every other point plays every target.
POINT_TARGETS: dict[str, tuple[Target, ...]] = {"h": ("worker", "everything")}
# (h): how long the fake holds the grader's create answer, and how soon after the kill the
# answer must come: the heartbeat timeout, then the grading (5 s), the restart and backoff.
SUBMIT_HANG_S = 100.0
PROMPT_RECOVERY_S = SUBMIT_HEARTBEAT.total_seconds() + 45.0
# The points whose answer must come within a bound of the kill, besides every invariant.
RECOVERY_BOUNDS_S: dict[str, float] = {"h": PROMPT_RECOVERY_S}
# What the local backend can play: its jobs' timing is real, so only the points that wait on a
# job it runs (an agent job, a dev evaluation, a grading).
LOCAL_POINTS = ("b", "d", "e")

# Fake jobs of a few seconds (the dev server's workflow time is real time); the markers choose.
FAKE_GRADER_SCORE = 0.75
FAKE_DEV_SCORE = 0.6
FAKE_SCENARIO = FakeScenario(
    jobs=[
        # Two 503s, then the job is created and the connection drops: the submit activity is
        # retried with backoff (1 s, 2 s, 4 s) and must find the job it created.
        FakeJobScript(
            script_contains="SLOW_SUBMIT",
            queue_s=0.5,
            run_s=3,
            transient_errors={"submit": 2},
            fail_after_create=True,
        ),
        FakeJobScript(
            script_contains="SLOW_CANCEL", queue_s=0.5, run_s=600, cancel_confirm_after_s=6
        ),
        FakeJobScript(script_contains="RUN_LONG", queue_s=0.5, run_s=8),
        FakeJobScript(
            role=JobRole.grader,
            evaluated_script_contains="HANG_GRADER_START",
            queue_s=0.5,
            run_s=5,
            score=FAKE_GRADER_SCORE,
            submit_hang_s=SUBMIT_HANG_S,
        ),
        FakeJobScript(role=JobRole.dev, queue_s=0.5, run_s=5, score=FAKE_DEV_SCORE),
        FakeJobScript(role=JobRole.grader, queue_s=0.5, run_s=5, score=FAKE_GRADER_SCORE),
        FakeJobScript(queue_s=0.5, run_s=3),
    ]
)
REFERENCE = (Path(__file__).parents[2] / "tasks" / TASK / "reference_solution.py").read_text()


@dataclass(frozen=True)
class Scripts:
    """The agent scripts a play submits, and the scores its evaluations give, per backend."""

    quick: str
    long_run: str  # a job that runs long enough to be killed around (several seconds)
    slow_submit: str
    slow_cancel: str
    hang_grader_start: str  # an agent job whose grader's create answers slowly (h)
    dev_score: float
    grader_score: float


FAKE_SCRIPTS = Scripts(
    quick="print('training')\n",
    long_run="print('training')  # RUN_LONG\n",
    slow_submit="print('training')  # SLOW_SUBMIT\n",
    slow_cancel="print('training')  # SLOW_CANCEL\n",
    hang_grader_start="print('training')  # HANG_GRADER_START\n",
    dev_score=FAKE_DEV_SCORE,
    grader_score=FAKE_GRADER_SCORE,
)
# The task's reference solution scores 1.0; slowed down, it leaves time to kill around it.
LOCAL_SCRIPTS = Scripts(
    quick=REFERENCE,
    long_run="import time\ntime.sleep(6)\n" + REFERENCE,
    slow_submit="",
    slow_cancel="",
    hang_grader_start="",
    dev_score=1.0,
    grader_score=1.0,
)


@dataclass(frozen=True)
class End:
    reason: EndReason
    reward: float | None


@dataclass
class Expected:
    """What a play must reach: each episode's end, and the jobs it started, by role."""

    ends: dict[str, End] = field(default_factory=dict)
    jobs: dict[str, dict[JobRole, int]] = field(default_factory=dict)


class Fault:
    """The cell's kill: `strike` SIGKILLs the target's processes (the gateway the call went to)
    and starts them again at once; the first answer after it is the one around the kill, and
    the time from the kill to it is the cell's recovery time."""

    def __init__(self, topology: Topology, target: Target) -> None:
        self.topology = topology
        self.target = target
        self.episode_id = ""
        self.struck_at: float | None = None
        self.killed: list[Member] = []
        self.job_states: str = ""  # what the backend's jobs were doing at the kill
        # The job workflow whose pending activity the kill aims at: a `worker` kill then takes
        # the worker running that activity (h), not the one that last ran the episode.
        self.activity_of: str | None = None
        self._restart: Awaitable[None] | None = None

    async def strike(self, gateway: int) -> None:
        assert self.struck_at is None, "one kill per cell"
        jobs = self.topology.jobs_of(self.episode_id)
        self.job_states = ", ".join(f"{j.role.value} {j.state.value}" for j in jobs) or "no job"
        self.killed = await self.topology.members_for(
            self.target, gateway, self.episode_id, self.activity_of
        )
        self.struck_at = time.monotonic()
        self.topology.cluster.kill(*self.killed)
        self._restart = asyncio.ensure_future(self.topology.cluster.restart(*self.killed))

    async def restarted(self) -> None:
        if self._restart is not None:
            await self._restart

    def recovery_s(self, around: Answer | None) -> float | None:
        if self.struck_at is None or around is None:
            return None
        return around.answered_at - self.struck_at


@dataclass
class Context:
    topology: Topology
    player: Player
    fault: Fault
    scripts: Scripts

    # -- kill points --------------------------------------------------------------------------

    def backend_has(
        self, role: JobRole, states: tuple[JobState, ...] = ()
    ) -> Callable[[], Awaitable[bool]]:
        """The episode's job of `role` exists in the backend (in one of `states`)."""

        async def check() -> bool:
            return any(
                j.role is role and (not states or j.state in states)
                for j in self.topology.jobs_of(self.fault.episode_id)
            )

        return check

    def evaluation_started(self, role: JobRole) -> Callable[[], Awaitable[bool]]:
        """The episode's evaluation of `role` has started and its job workflow follows it: it
        has armed its guard timer (`JobWorkflow._follow_until_terminal`), which it does once it
        has taken the submit's answer and reported it to the episode. Not earlier: a kill
        inside the submit activity is (h). On the fake backend it also runs (for 5 s); a local
        evaluation may end before the harness looks."""
        states = (JobState.running,) if self.topology.backend == "fake" else ()

        async def check() -> bool:
            jobs = [
                j
                for j in self.topology.jobs_of(self.fault.episode_id)
                if j.role is role and (not states or j.state in states)
            ]
            for job in jobs:  # the backend's key is the job's workflow id
                handle = self.topology.client.get_workflow_handle(job.key)
                async for event in handle.fetch_history_events():
                    if event.HasField("timer_started_event_attributes"):
                        return True
            return False

        return check

    def grader_start_held(self) -> Callable[[], Awaitable[bool]]:
        """The backend has created the episode's grader and holds the answer (h); the kill
        then aims at the worker running that submit activity."""

        async def check() -> bool:
            for job in self.topology.jobs_of(self.fault.episode_id):
                if job.role is JobRole.grader:
                    self.fault.activity_of = job.key  # the backend's key: the job's workflow
                    return True
            return False

        return check

    def steps_reach(self, steps: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await self.topology.status(self.fault.episode_id)).steps_used >= steps

        return check

    def cancel_unconfirmed(self, episode_id: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return bool((await self.topology.status(episode_id)).cancelling)

        return check

    async def episode_sees(self, job_id: str, state: JobState) -> None:
        async def seen() -> bool:
            status = await self.topology.status(self.fault.episode_id)
            return any(j["job_id"] == job_id and j["state"] == state.value for j in status.jobs)

        await eventually(seen, SETTLE_TIMEOUT_S, f"the episode to see {job_id} {state.value}")

    # -- pieces of plays -----------------------------------------------------------------------

    async def reset(self) -> str:
        answer = await self.player.reset(TASK)
        self.fault.episode_id = answer.episode_id
        return answer.episode_id

    async def submit_job(self, script: str, **kill: Any) -> str:
        answer = await self.player.call(
            "jobs_submit", script=script, flavor=FLAVOR, timeout_minutes=5, **kill
        )
        assert "job_id" in answer.data, answer.data
        return str(answer.data["job_id"])

    async def trained(self, script: str) -> str:
        job_id = await self.submit_job(script)
        waited = await self.player.wait_ended(job_id)
        assert waited.data["state"] == "succeeded", waited.data
        return job_id

    async def submitted(self, job_id: str, **kill: Any) -> Answer:
        final = await self.player.call("submit", job_id=job_id, **kill)
        assert final.result.done is True, final.data
        assert final.data.get("score") == self.scripts.grader_score, final.data
        return final

    def strike_args(self, when: Callable[[], Awaitable[bool]]) -> dict[str, Any]:
        return {"kill_when": when, "strike": self.fault.strike}


def one_each(agent: int = 1, dev: int = 0, grader: int = 1) -> dict[JobRole, int]:
    return {JobRole.agent: agent, JobRole.dev: dev, JobRole.grader: grader}


async def play_a(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.submit_job(
        ctx.scripts.slow_submit, **ctx.strike_args(ctx.backend_has(JobRole.agent))
    )
    await ctx.player.wait_ended(job_id)
    await ctx.submitted(job_id)
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each()}
    )


async def play_b(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.submit_job(ctx.scripts.long_run)
    running = ctx.backend_has(JobRole.agent, (JobState.running,))
    await eventually(running, SETTLE_TIMEOUT_S, "the job to run")
    await ctx.fault.strike(ctx.player.next_gateway)  # between two calls
    waited = await ctx.player.wait_ended(job_id)
    assert waited.data["state"] == "succeeded", waited.data
    await ctx.submitted(job_id)
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each()}
    )


async def play_c(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.submit_job(ctx.scripts.long_run)
    # Once the episode has seen it run, a jobs_wait waits for its end (seconds away).
    await ctx.episode_sees(job_id, JobState.running)
    steps = ctx.player.steps_of(episode) + 1
    await ctx.player.call(
        "jobs_wait", job_id=job_id, timeout_s=60, **ctx.strike_args(ctx.steps_reach(steps))
    )
    waited = await ctx.player.wait_ended(job_id)
    assert waited.data["state"] == "succeeded", waited.data
    await ctx.submitted(job_id)
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each()}
    )


async def play_d(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.trained(ctx.scripts.quick)
    started = ctx.evaluation_started(JobRole.dev)
    dev = await ctx.player.call("dev_evaluate", job_id=job_id, **ctx.strike_args(started))
    assert dev.data.get("score") == ctx.scripts.dev_score, dev.data
    await ctx.submitted(job_id)
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each(dev=1)}
    )


async def play_e(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.trained(ctx.scripts.quick)
    grading = ctx.evaluation_started(JobRole.grader)
    await ctx.submitted(job_id, **ctx.strike_args(grading))
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each()}
    )


async def play_f(ctx: Context) -> Expected:
    episode = await ctx.reset()
    doomed = await ctx.submit_job(ctx.scripts.slow_cancel)
    await ctx.episode_sees(doomed, JobState.running)
    cancelled = await ctx.player.call(
        "jobs_cancel", job_id=doomed, **ctx.strike_args(ctx.cancel_unconfirmed(episode))
    )
    assert cancelled.data.get("state") == "cancelled", cancelled.data
    job_id = await ctx.trained(ctx.scripts.quick)
    await ctx.submitted(job_id)
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each(agent=2)}
    )


async def play_g(ctx: Context) -> Expected:
    first = await ctx.reset()
    doomed = await ctx.submit_job(ctx.scripts.slow_cancel)
    await ctx.episode_sees(doomed, JobState.running)
    again = await ctx.player.reset(TASK, **ctx.strike_args(ctx.cancel_unconfirmed(first)))
    second = again.episode_id
    assert second != first
    ctx.fault.episode_id = second
    return Expected(
        {first: End(EndReason.reset, None), second: End(EndReason.cancelled, None)},
        {first: one_each(grader=0), second: one_each(agent=0, grader=0)},
    )


async def play_h(ctx: Context) -> Expected:
    episode = await ctx.reset()
    job_id = await ctx.trained(ctx.scripts.hang_grader_start)
    await ctx.submitted(job_id, **ctx.strike_args(ctx.grader_start_held()))
    return Expected(
        {episode: End(EndReason.submitted, ctx.scripts.grader_score)}, {episode: one_each()}
    )


PLAYS: dict[str, Callable[[Context], Awaitable[Expected]]] = {
    "a": play_a,
    "b": play_b,
    "c": play_c,
    "d": play_d,
    "e": play_e,
    "f": play_f,
    "g": play_g,
    "h": play_h,
}
