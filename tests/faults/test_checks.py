"""The fault matrix's invariants can fail: each is shown a record that breaks it (a job started
twice, a minute billed twice, a job live after the end, another end, a re-sent request answered
otherwise, a step counted twice) beside a clean record that passes. No processes: the topology
and the player are stand-ins holding those records."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolObservation

from posttrain_common.contracts.episode_calls import EpisodeStatus
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import EndReason, EpisodeEnd, JobState, ServiceSpend, SettledSpend
from tests.faults.checks import check
from tests.faults.player import Answer
from tests.faults.plays import End, Expected, one_each
from tests.faults.topology import BackendRecord

EPISODE = "ep-0123456789abcdef"
KEY = f"episode-{EPISODE}/job/"
PRICE = 167  # cpu-basic, micro-USD per minute


def answer(n: int, tool: str, data: dict[str, Any], reward: float | None = None) -> Answer:
    done = reward is not None
    observation = CallToolObservation(
        tool_name=tool, result={"data": data}, metadata={"episode_id": EPISODE}
    )
    result = StepResult(observation=observation, reward=reward, done=done)
    return Answer(n, n % 2, tool, {}, f"r{n}", result, 0.0, 1.0)


@dataclass
class StandInPlayer:
    answers: list[Answer] = field(
        default_factory=lambda: [
            answer(0, "jobs_submit", {"job_id": "job-1"}),
            answer(1, "jobs_wait", {"job_id": "job-1", "state": "succeeded"}),
            answer(2, "submit", {"job_id": "job-1", "score": 0.75}, reward=0.75),
        ]
    )

    def steps_of(self, episode_id: str) -> int:
        return len(self.answers)


@dataclass
class StandInTopology:
    records: list[BackendRecord]
    status_: EpisodeStatus
    prices: dict[str, int] = field(default_factory=lambda: {"cpu-basic": PRICE})

    def jobs_of(self, episode_id: str) -> list[BackendRecord]:
        return self.records

    async def status(self, episode_id: str) -> EpisodeStatus:
        return self.status_

    async def wait_closed(self, episode_id: str) -> None:
        return None


AGENT = BackendRecord(f"{KEY}1", "job-1", JobRole.agent, JobState.succeeded, running_s=61.0)
GRADER = BackendRecord(f"{KEY}2", "grader-1", JobRole.grader, JobState.succeeded, 5.0)
STATUS = EpisodeStatus(
    episode_id=EPISODE,
    task_id="t0_artifact",
    steps_used=3,
    steps_left=97,
    time_left_s=7000,
    done=True,
    end=EpisodeEnd(reason=EndReason.submitted, reward=0.75),
    service_spend=ServiceSpend(settled=SettledSpend(usd=2 * PRICE / 1e6, jobs=1), final=True),
    jobs=[{"job_id": "job-1", "cost_usd": 2 * PRICE / 1e6}],
    cancelling=[],
)
EXPECTED = Expected({EPISODE: End(EndReason.submitted, 0.75)}, {EPISODE: one_each()})


async def failures_of(
    records: list[BackendRecord] | None = None,
    status: EpisodeStatus = STATUS,
    again: Answer | None = None,
) -> list[str]:
    player = StandInPlayer()
    topology = StandInTopology(records if records is not None else [AGENT, GRADER], status)
    around = player.answers[1]
    return await check(topology, player, EXPECTED, around, again or around)  # type: ignore[arg-type]


async def test_a_clean_record_passes_every_invariant() -> None:
    assert await failures_of() == []


@pytest.mark.parametrize(
    ("records", "status", "again", "expected"),
    [
        ([AGENT, replace(AGENT), GRADER], STATUS, None, "a job exists twice in the backend"),
        ([AGENT, GRADER, replace(GRADER, key=f"{KEY}3")], STATUS, None, "1 agent, 0 dev, 2 grader"),
        (
            None,
            STATUS.model_copy(
                update={
                    "service_spend": ServiceSpend(settled=SettledSpend(usd=3 * PRICE / 1e6, jobs=1))
                }
            ),
            None,
            "settled (micro-USD, jobs, evaluations) (501, 1, 0)",
        ),
        (
            [replace(AGENT, state=JobState.running), GRADER],
            STATUS,
            None,
            "ended with jobs live in the backend",
        ),
        (
            None,
            STATUS.model_copy(update={"end": EpisodeEnd(reason=EndReason.score_failed)}),
            None,
            "ended (<EndReason.score_failed: 'score_failed'>, None)",
        ),
        (None, STATUS.model_copy(update={"steps_used": 4}), None, "counted 4 steps for 3 requests"),
        (
            None,
            STATUS,
            answer(1, "jobs_wait", {"job_id": "job-1", "state": "running"}),
            "jobs_wait sent again (request r1) was answered",
        ),
    ],
)
async def test_each_broken_invariant_is_reported(
    records: list[BackendRecord] | None,
    status: EpisodeStatus,
    again: Answer | None,
    expected: str,
) -> None:
    failures = await failures_of(records, status, again)
    assert any(expected in failure for failure in failures), failures
