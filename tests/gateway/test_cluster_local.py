"""`posttrain-env cluster-local`, the production shape on one machine (docs/deployment.md, "On
one machine"): two gateways without a worker, two workers, one Temporal dev server and one key.
An episode whose calls alternate between the gateways survives one worker killed in the middle;
the command reports the death, restarts nothing, and stops everything within 30 s of SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_server.cluster_local import (
    ClusterConfig,
    ClusterError,
    LocalCluster,
    add_cluster_local_arguments,
    config_from,
    our_command,
)
from tests.faults.player import Player
from tests.gateway.production import SHUTDOWN_LIMIT_S, cluster_environment
from tests.gateway.server import free_port
from tests.waiting import PROGRESS_S, eventually
from workflows.ids import episode_workflow_id

SCENARIO = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.grader, queue_s=0.2, run_s=1, score=0.625),
        FakeJobScript(queue_s=0.2, run_s=3),
    ]
)
MEMBER_LINE = re.compile(r"^(?P<name>\S+)\s+(?P<where>\S+).*\bpid (?P<pid>\d+)\s+log (?P<log>\S+)")
READY_LINE = "clients: any gateway serves any session"


def members_of(output: str) -> dict[str, dict[str, str]]:
    return {
        match["name"]: match.groupdict()
        for match in map(MEMBER_LINE.match, output.splitlines())
        if match is not None and match["name"].startswith(("temporal", "gateway", "worker"))
    }


async def busy_worker_pid(address: str, episode_id: str) -> int:
    """The pid of the worker that last completed a workflow task of the episode: its sticky
    queue holds the episode, so its death is the one that costs the episode most."""
    client = await Client.connect(address)
    identity = ""
    async for event in client.get_workflow_handle(
        episode_workflow_id(episode_id)
    ).fetch_history_events():
        if event.HasField("workflow_task_completed_event_attributes"):
            identity = event.workflow_task_completed_event_attributes.identity
    return int(identity.split("@", 1)[0])


def consecutive_free_ports(count: int) -> list[int]:
    """`count` consecutive ports free now (another test may still take one before it is
    bound: the command then fails to start and says which port)."""
    for _ in range(100):
        first = free_port()
        with ExitStack() as held:
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return list(range(first, first + count))
    raise AssertionError("no consecutive free ports")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


async def test_two_gateways_and_two_workers_an_episode_alternating_between_gateways_survives_a_killed_worker_with_one_job_and_the_right_reward(  # noqa: E501
    tmp_path: Path,
) -> None:
    state = tmp_path / "cluster"
    env = cluster_environment(state, SCENARIO)
    temporal_port = free_port()
    ports = consecutive_free_ports(2)  # the command puts its gateways on consecutive ports
    output = tmp_path / "cluster-local.out"
    with output.open("wb") as out:
        command = subprocess.Popen(  # noqa: ASYNC220 - returns at once
            our_command(
                "cluster-local",
                "--port",
                str(ports[0]),
                "--temporal-port",
                str(temporal_port),
                "--no-ui",
                "--state-dir",
                str(state),
            ),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        async def ready() -> bool:
            assert command.poll() is None, output.read_text()
            return READY_LINE in output.read_text()

        await eventually(ready, 180, "cluster-local to be ready")
        members = members_of(output.read_text())
        assert sorted(members) == ["gateway-1", "gateway-2", "temporal", "worker-1", "worker-2"]
        urls = (members["gateway-1"]["where"], members["gateway-2"]["where"])
        assert urls == (f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}")
        assert members["temporal"]["where"] == f"127.0.0.1:{temporal_port}"
        assert "server key" in output.read_text() and "fingerprint" in output.read_text()

        player = await Player.open(urls, cell="two-gateways")
        try:
            episode_id = (await player.reset("t0_artifact")).episode_id
            submitted = await player.call(
                "jobs_submit", script="print('training')\n", flavor="cpu-basic", timeout_minutes=5
            )
            job_id = submitted.data["job_id"]
            backend = FakeBackend(state / "fake", SCENARIO)

            async def running() -> bool:
                return any(v.state.value == "running" for v in backend.views(datetime.now(UTC)))

            await eventually(running, PROGRESS_S, "the job to run")
            victim = await busy_worker_pid(members["temporal"]["where"], episode_id)
            worker = next(n for n, m in members.items() if m["pid"] == str(victim))
            os.killpg(victim, signal.SIGKILL)
            waited = await player.wait_ended(job_id)
            assert waited.data["state"] == "succeeded", waited.data
            final = await player.call("submit", job_id=job_id)
            assert {a.gateway for a in player.answers} == {0, 1}  # both gateways served
        finally:
            await player.close_session()
            await player.aclose()
        assert final.result.done is True and final.result.reward == 0.625
        assert final.result.observation.metadata["episode_end"]["reason"] == "submitted"
        roles = sorted(r.role.value for r in backend.requests())
        assert roles == ["agent", "grader"], roles  # one job, one grading: nothing twice

        async def reported() -> bool:
            return f"{worker} (pid {victim}) exited with status -9" in output.read_text()

        await eventually(reported, PROGRESS_S, "the killed worker's death to be reported")
        assert "not restarted" in output.read_text()
        log = await asyncio.to_thread(Path(members[worker]["log"]).read_text)
        assert log.count("worker on task queue") == 1  # never started again
        others = [int(m["pid"]) for n, m in members.items() if n != worker]
        assert not any(gone(pid) for pid in others)

        started = time.monotonic()
        command.send_signal(signal.SIGTERM)
        status = await asyncio.to_thread(command.wait, 60)
        assert time.monotonic() - started < SHUTDOWN_LIMIT_S
        assert status == 1  # a member died while it ran
        assert all(gone(pid) for pid in others)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait(10)


async def test_a_port_in_use_is_reported_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        config = ClusterConfig(
            state_dir=tmp_path / "cluster",
            gateway_ports=(free_port(), taken),
            temporal_port=free_port(),
            temporal_ui_port=None,
            environment={},
        )
        cluster = LocalCluster(config)
        with pytest.raises(ClusterError, match=f"port\\(s\\) {taken} on 127.0.0.1 are in use"):
            await cluster.start()
        assert all(member.proc is None for member in cluster.members)


def test_the_command_puts_its_state_beside_the_servers_and_its_gateways_on_consecutive_ports(
    tmp_path: Path,
) -> None:
    parser = argparse.ArgumentParser()
    add_cluster_local_arguments(parser)
    config = config_from(
        parser.parse_args(["--gateways", "3", "--port", "9100"]),
        {"POSTTRAIN_STATE_DIR": str(tmp_path)},
    )
    assert config.state_dir == tmp_path / "cluster-local"
    assert config.gateway_ports == (9100, 9101, 9102) and config.workers == 2
    assert config.key_path == tmp_path / "cluster-local" / "server.key"
    cluster = LocalCluster(config)
    env = cluster.gateways[0].env
    assert env["TEMPORAL_ADDRESS"] == "127.0.0.1:7233"
    assert env["POSTTRAIN_SERVER_KEY_FILE"] == str(config.key_path)
    with pytest.raises(ClusterError, match="1 to 16"):
        config_from(parser.parse_args(["--workers", "0"]), {})
