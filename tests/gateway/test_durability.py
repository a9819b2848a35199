"""Durability over real HTTP: long tool calls, and SIGKILL of the whole server (gateway, worker,
embedded Temporal) in the middle of an episode, restarted on the same state dir while the same
`PostTrainEnv` object keeps going. Each test runs its own server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from openenv.core.env_server.mcp_types import CallToolAction

from activities.fake.backend import FakeJobScript, FakeScenario
from posttrain_env import PostTrainEnv
from posttrain_env.contracts.jobs import JobRole
from tests.gateway.server import ServerProcess, wait_until_ended

SUBMIT = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}


class Episode(threading.Thread):
    """Plays submit -> wait -> submit with one PostTrainEnv in a thread, recording results."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.env = PostTrainEnv(base_url=base_url, message_timeout_s=600).sync()
        self.states: list[str] = []
        self.final: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.env as env:
                env.reset(task_id="t0_artifact")
                job = env.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
                job_id = job.observation.result["data"]["job_id"]
                _waited, self.states = wait_until_ended(env, job_id)
                self.final = env.step(
                    CallToolAction(tool_name="submit", arguments={"job_id": job_id})
                )
        except BaseException as exc:  # reported by the test
            self.error = exc


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def finish(episode: Episode, timeout_s: float) -> Any:
    episode.join(timeout_s)
    assert not episode.is_alive(), "the episode did not finish"
    if episode.error is not None:
        raise episode.error
    return episode.final


def test_a_whole_server_killed_mid_job_comes_back_and_the_same_client_finishes(
    make_server: Callable[[FakeScenario], ServerProcess],
) -> None:
    server = make_server(
        FakeScenario(
            jobs=[
                FakeJobScript(role=JobRole.grader, queue_s=0, run_s=1, score=0.6),
                FakeJobScript(queue_s=0, run_s=20),
            ]
        )
    )
    server.start()
    episode = Episode(server.base_url)
    episode.start()
    wait_for(lambda: len(server.requests(JobRole.agent)) == 1, 60, "the agent job to start")
    time.sleep(2)  # the client is now inside jobs_wait
    server.kill()
    time.sleep(1)
    server.start()
    final = finish(episode, 180)
    assert final.done is True and final.reward == 0.6
    spend = final.observation.metadata["service_spend"]
    assert spend["final"] is True and spend["settled"]["jobs"] == 1
    assert spend["settled"]["usd"] == pytest.approx(167 / 1e6)  # 20 s of cpu-basic: 1 minute
    assert len(server.requests(JobRole.agent)) == 1
    assert len(server.requests(JobRole.grader)) == 1
    assert episode.states[-1] == "succeeded"


def test_a_whole_server_killed_while_submit_grades_gives_the_reward_once(
    make_server: Callable[[FakeScenario], ServerProcess],
) -> None:
    server = make_server(
        FakeScenario(
            jobs=[
                FakeJobScript(role=JobRole.grader, queue_s=0, run_s=15, score=0.8),
                FakeJobScript(queue_s=0, run_s=2),
            ]
        )
    )
    server.start()
    episode = Episode(server.base_url)
    episode.start()
    wait_for(lambda: len(server.requests(JobRole.grader)) == 1, 90, "the grader to start")
    server.kill()
    time.sleep(1)
    server.start()
    final = finish(episode, 180)
    assert final.done is True and final.reward == 0.8
    assert final.observation.metadata["episode_end"]["reason"] == "submitted"
    assert len(server.requests(JobRole.grader)) == 1
    assert len(server.requests(JobRole.agent)) == 1
    status = server.wait_status(episode.env.episode_id)
    assert status.end is not None and status.end.reward == 0.8


def test_a_local_job_outlives_a_killed_server_and_is_neither_lost_nor_run_twice(
    make_server: Callable[[FakeScenario], ServerProcess],
) -> None:
    """The local backend's jobs are detached: SIGKILL of the whole server (gateway, worker,
    embedded Temporal) leaves the running job alone, and the restarted server adopts it."""
    server = make_server(FakeScenario())
    server.extra_env["POSTTRAIN_BACKEND"] = "local"
    server.start()
    script = (
        "import pathlib, time\n"
        "time.sleep(8)\n"
        "pathlib.Path('/data/outputs/done.txt').write_text('trained once')\n"
        "print('TRAINED', flush=True)\n"
    )
    jobs_dir = server.state_dir / "local" / "jobs"
    with PostTrainEnv(base_url=server.base_url, message_timeout_s=600).sync() as env:
        env.reset(task_id="t0_artifact")
        job = env.step(
            CallToolAction(tool_name="jobs_submit", arguments={**SUBMIT, "script": script})
        )
        job_id = job.observation.result["data"]["job_id"]
        wait_for(lambda: any(jobs_dir.glob("*/status.json")), 60, "the local job to start")
        server.kill()
        server.start()
        waited, states = wait_until_ended(env, job_id, timeout_s=60)
        assert states[-1] == "succeeded", waited.observation.result
        logs = env.step(CallToolAction(tool_name="jobs_logs", arguments={"job_id": job_id}))
        lines = logs.observation.result["data"]["lines"]
        assert sum("TRAINED" in line for line in lines) == 1, lines
    folders = list(jobs_dir.iterdir())
    assert len(folders) == 1
    assert (folders[0] / "artifact" / "done.txt").read_text() == "trained once"
