"""One server key per deployment (docs/security.md, "One key per deployment"): the key settings
and their errors, no key ever created implicitly beside an external Temporal, the fingerprint
every process checks on the deployment's workflow, and a grader's score read by another worker
of the same key. Processes are the real commands on a file-backed dev server of the test's own."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowUpdateStage

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.contracts.episode_calls import ToolCall, ToolResult
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey, ServerKeyError
from posttrain_common.settings import Settings
from posttrain_server.agent_worker import refusal
from posttrain_server.deployment_key import resolve_server_key
from tests.gateway.production import (
    gateway,
    key_file,
    kill_group,
    run_to_exit,
    start_worker,
)
from tests.gateway.server import ServerProcess
from tests.waiting import PROGRESS_S, eventually
from tests.workflows.harness import Answer, reset_new_session, write_task
from tests.workflows.test_worker_restart import call, dev_server
from workflows.episode.session import ResetRequest, ResetResult, SessionState, SessionWorkflow
from workflows.episode.workflow import EpisodeWorkflow
from workflows.operations.deployment import MEMO_KEY_FINGERPRINT, deployment_workflow_id

HEX_KEY = "ab" * 32
NOT_EXTERNAL: dict[str, Any] = {}
EXTERNAL: dict[str, Any] = {"TEMPORAL_ADDRESS": "127.0.0.1:1"}


@pytest.fixture(autouse=True)
def _no_key_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("POSTTRAIN_SERVER_KEY", "POSTTRAIN_SERVER_KEY_FILE", "TEMPORAL_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def settings(tmp_path: Path, **given: Any) -> Settings:
    return Settings(state_dir=tmp_path / "state", **given)


# -- the settings and their errors (unit) ------------------------------------------------------


def test_without_temporal_address_the_key_is_created_once_in_the_state_dir(tmp_path: Path) -> None:
    first = resolve_server_key(settings(tmp_path))
    path = tmp_path / "state" / "server.key"
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
    assert resolve_server_key(settings(tmp_path)).fingerprint == first.fingerprint
    assert str(path) in first.source


def test_with_temporal_address_and_no_key_setting_nothing_is_created_and_the_error_names_the_file_setting(  # noqa: E501
    tmp_path: Path,
) -> None:
    with pytest.raises(ServerKeyError, match="POSTTRAIN_SERVER_KEY_FILE"):
        resolve_server_key(settings(tmp_path, **EXTERNAL))
    assert not (tmp_path / "state" / "server.key").exists()


def test_a_key_file_and_the_same_key_in_hex_are_one_key_whatever_the_temporal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k"
    path.write_bytes(bytes.fromhex(HEX_KEY))
    path.chmod(0o600)
    from_file = resolve_server_key(settings(tmp_path, server_key_file=path, **EXTERNAL))
    from_hex = resolve_server_key(settings(tmp_path, server_key=HEX_KEY, **NOT_EXTERNAL))
    assert from_file.fingerprint == from_hex.fingerprint
    assert from_file.source == f"POSTTRAIN_SERVER_KEY_FILE={path}"
    assert from_hex.source == "POSTTRAIN_SERVER_KEY"
    assert not (tmp_path / "state" / "server.key").exists()  # no implicit key beside a given one


@pytest.mark.parametrize(
    ("content", "mode", "expected"),
    [
        (None, 0o600, "no such file"),
        (b"k" * 31, 0o600, "holds 31 bytes"),
        (b"k" * 32, 0o640, "chmod 600"),
        (b"k" * 32, 0o604, "chmod 600"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_setting(
    tmp_path: Path, content: bytes | None, mode: int, expected: str
) -> None:
    path = tmp_path / "k"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    with pytest.raises(ServerKeyError) as refused:
        resolve_server_key(settings(tmp_path, server_key_file=path))
    assert str(refused.value).startswith(f"POSTTRAIN_SERVER_KEY_FILE={path}: ")
    assert expected in str(refused.value)


def test_a_key_file_that_is_a_folder_or_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"k" * 32)
    for path, expected in (
        (tmp_path / "folder", "not a regular file"),
        (tmp_path / "file" / "k", "cannot be read"),
    ):
        with pytest.raises(ServerKeyError, match=expected):
            resolve_server_key(settings(tmp_path, server_key_file=path))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("zz" * 32, "is not hexadecimal"),
        ("0x" + "ab" * 32, "is not hexadecimal"),
        ("a" * 65, "is not hexadecimal"),  # an odd number of digits
        ("ab" * 31, "holds 31 bytes"),
    ],
)
def test_a_bad_hex_key_is_refused_naming_the_setting_never_the_value(
    tmp_path: Path, value: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        settings(tmp_path, server_key=value)
    message = str(refused.value)
    assert "POSTTRAIN_SERVER_KEY" in message and expected in message
    assert value not in message and value[:12] not in message


def test_both_key_settings_are_refused_and_no_setting_is_quoted(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as refused:
        settings(tmp_path, server_key=HEX_KEY, server_key_file=tmp_path / "k", HF_TOKEN="hf_xyz")
    message = str(refused.value)
    assert "POSTTRAIN_SERVER_KEY_FILE and POSTTRAIN_SERVER_KEY are both set" in message
    assert HEX_KEY[:8] not in message and "hf_xyz" not in message


def test_the_fingerprint_is_an_hmac_never_the_key_or_its_plain_hash() -> None:
    key = bytes.fromhex(HEX_KEY)
    fingerprint = ServerKey(key).fingerprint()
    assert len(fingerprint) == 16 and fingerprint != ServerKey(b"o" * 32).fingerprint()
    assert fingerprint not in HEX_KEY
    assert fingerprint not in hashlib.sha256(key).hexdigest()
    assert HEX_KEY not in repr(ServerKey(key)) and fingerprint in repr(ServerKey(key))


def test_the_hugging_face_deployment_label_is_the_one_jobs_were_labelled_with_before() -> None:
    # The value `deployment_id(key_path)` gave for this key before keys came from settings:
    # running jobs keep being this deployment's.
    key = bytes.fromhex(HEX_KEY)
    before = "d" + hashlib.sha256(b"posttrain-deployment\0" + key).hexdigest()[:24]
    assert ServerKey(key).deployment_label() == before


def test_the_agent_worker_refuses_the_server_key_in_its_environment(tmp_path: Path) -> None:
    own = settings(tmp_path)
    assert refusal(own, {}) is None
    assert "POSTTRAIN_SERVER_KEY is set" in (refusal(own, {"POSTTRAIN_SERVER_KEY": HEX_KEY}) or "")


def test_key_new_writes_a_0600_key_and_never_overwrites_one(tmp_path: Path) -> None:
    path = tmp_path / "server.key"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    made = run_to_exit(["key", "new", str(path)], env)
    assert made.returncode == 0, made.stderr
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
    assert ServerKey.from_file(path).fingerprint() in made.stdout
    again = run_to_exit(["key", "new", str(path)], env)
    assert again.returncode == 2 and "never overwritten" in again.stderr


# -- the processes refuse a missing or bad key --------------------------------------------------


@pytest.mark.parametrize("args", [["server"], ["server", "--no-worker"], ["worker"]])
def test_with_temporal_address_and_no_key_setting_every_process_exits_2_naming_the_file_setting(
    tmp_path: Path, args: list[str]
) -> None:
    server = gateway(tmp_path / "state", "127.0.0.1:1", key=None)
    if args[0] == "server":
        args = [*args, "--port", str(server.port)]
    done = run_to_exit(args, server.env())
    assert done.returncode == 2, done.stderr
    assert "POSTTRAIN_SERVER_KEY_FILE" in done.stderr and "Traceback" not in done.stderr
    assert not (server.state_dir / "server.key").exists()


def test_a_bad_hex_key_stops_the_worker_with_2_and_the_key_is_never_printed(
    tmp_path: Path,
) -> None:
    server = gateway(tmp_path / "state", "127.0.0.1:1", key=None)
    short = "cd" * 31
    done = run_to_exit(["worker"], {**server.env(), "POSTTRAIN_SERVER_KEY": short})
    assert done.returncode == 2 and "POSTTRAIN_SERVER_KEY" in done.stderr
    assert short[:8] not in done.stderr + done.stdout


# -- the fingerprint on the deployment's workflow -----------------------------------------------


async def test_workers_and_gateways_on_another_key_than_the_deployments_refuse_to_start(
    tmp_path: Path,
) -> None:
    first, second, third = (key_file(tmp_path / f"key-{n}") for n in (1, 2, 3))
    async with dev_server(tmp_path / "temporal.db") as (address, client):
        one = gateway(tmp_path / "state", address, first)
        worker = start_worker(one.env(), tmp_path / "worker-1.log")
        try:
            workflow_id = deployment_workflow_id(client.namespace, "posttrain")

            async def recorded() -> bool:
                try:
                    await client.get_workflow_handle(workflow_id).describe()
                except Exception:
                    return False
                return True

            await eventually(recorded, 120, "the first worker to record its key")
            expected = ServerKey.from_file(first).fingerprint()
            description = await client.get_workflow_handle(workflow_id).describe()
            assert await description.memo_value(MEMO_KEY_FINGERPRINT, type_hint=str) == expected

            other = gateway(tmp_path / "state", address, second)
            refused = run_to_exit(["worker"], other.env())
            assert refused.returncode == 2, refused.stderr
            assert f"POSTTRAIN_SERVER_KEY_FILE={second}" in refused.stderr
            assert expected in refused.stderr
            assert ServerKey.from_file(second).fingerprint() in refused.stderr

            third_gateway = gateway(tmp_path / "state", address, third)
            args = ["server", "--no-worker", "--port", str(third_gateway.port)]
            refused = run_to_exit(args, third_gateway.env())
            assert refused.returncode == 2, refused.stderr
            assert f"POSTTRAIN_SERVER_KEY_FILE={third}" in refused.stderr
            assert expected in refused.stderr and "Traceback" not in refused.stderr

            # The same key on a second worker and a gateway: both start.
            same = start_worker(one.env(), tmp_path / "worker-2.log")
            try:
                one.start("--no-worker")
                assert one.proc is not None and one.proc.poll() is None
                assert same.poll() is None
            finally:
                kill_group(same)
                one.stop()
            history = await client.get_workflow_handle(workflow_id).fetch_history()
            # Every start found it: its history is its start and one workflow task.
            assert len(history.events) <= 5, [e.event_type for e in history.events]
        finally:
            kill_group(worker)


async def test_key_forget_refuses_while_an_episode_runs_and_then_lets_a_new_key_start(
    tmp_path: Path,
) -> None:
    old, new = key_file(tmp_path / "old.key"), key_file(tmp_path / "new.key")
    write_task(tmp_path / "tasks")
    async with dev_server(tmp_path / "temporal.db") as (address, client):
        one = gateway(tmp_path / "state", address, old)
        env = {**one.env(), "POSTTRAIN_TASKS_DIR": str(tmp_path / "tasks")}
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            session = await client.start_workflow(
                SessionWorkflow.run,
                SessionState(),
                id=f"session-{uuid.uuid4().hex}",
                task_queue="posttrain",
            )
            reset = await session.execute_update(
                SessionWorkflow.reset, ResetRequest(task_id="t_test"), result_type=ResetResult
            )
            await asyncio.to_thread(worker.send_signal, signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 60)

            async def counted() -> bool:  # visibility is eventually consistent
                query = "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running'"
                return (await client.count_workflows(query)).count == 1

            await eventually(counted, PROGRESS_S, "the episode to be listed")
            refused = run_to_exit(["key", "forget"], env)
            assert refused.returncode == 1 and "--force" in refused.stderr, refused.stderr
            refused = run_to_exit(["worker"], {**env, "POSTTRAIN_SERVER_KEY_FILE": str(new)})
            assert refused.returncode == 2 and "fingerprint" in refused.stderr

            await client.get_workflow_handle(reset.workflow_id).terminate("test: episode over")

            async def none_running() -> bool:
                query = "WorkflowType = 'EpisodeWorkflow' AND ExecutionStatus = 'Running'"
                return (await client.count_workflows(query)).count == 0

            await eventually(none_running, PROGRESS_S, "the episode to be listed as ended")
            forgotten = run_to_exit(["key", "forget"], env)
            assert forgotten.returncode == 0, forgotten.stderr
            worker = start_worker(
                {**env, "POSTTRAIN_SERVER_KEY_FILE": str(new)}, tmp_path / "worker-new.log"
            )

            async def recorded_new() -> bool:
                handle = client.get_workflow_handle(
                    deployment_workflow_id(client.namespace, "posttrain")
                )
                description = await handle.describe()
                fingerprint = await description.memo_value(
                    MEMO_KEY_FINGERPRINT, None, type_hint=str
                )
                return fingerprint == ServerKey.from_file(new).fingerprint()

            await eventually(recorded_new, 120, "the new key's fingerprint")
            assert worker.poll() is None
            shown = run_to_exit(["key", "show"], {**env, "POSTTRAIN_SERVER_KEY_FILE": str(new)})
            assert shown.returncode == 0, shown.stderr
            fingerprint = ServerKey.from_file(new).fingerprint()
            assert f"this key: fingerprint {fingerprint}" in shown.stdout
            assert f"fingerprint {fingerprint} (the same key)" in shown.stdout
            shown = run_to_exit(["key", "show"], {**env, "POSTTRAIN_SERVER_KEY_FILE": str(old)})
            assert "(ANOTHER KEY)" in shown.stdout
        finally:
            kill_group(worker)


# -- one key file, two workers: a grader read by either scores right ----------------------------


async def test_a_grader_started_by_one_worker_is_scored_right_by_another_on_the_same_key_file(
    tmp_path: Path,
) -> None:
    """The two workers are two machines: each has a state dir of its own, and they share only
    the backend (the fake's job store, standing in for the Hub). Before keys came from one
    setting, each created a key in its state dir: the score line of a grader one started failed
    the other's nonce check, and the reward was silently 0."""
    grader_s = 12.0
    scenario = FakeScenario(
        jobs=[
            FakeJobScript(role=JobRole.agent, queue_s=0.2, run_s=1),
            FakeJobScript(role=JobRole.grader, queue_s=0.2, run_s=grader_s, score=0.625),
        ]
    )
    key = key_file(tmp_path / "keys" / "server.key")
    write_task(tmp_path / "tasks")
    async with dev_server(tmp_path / "temporal.db") as (address, client):
        machines = {name: gateway(tmp_path / name, address, key, scenario) for name in "ab"}
        shared = {
            "POSTTRAIN_TASKS_DIR": str(tmp_path / "tasks"),
            "POSTTRAIN_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:12]}",
        }
        env = {name: {**m.env(), **shared} for name, m in machines.items()}
        (tmp_path / "a" / "fake").mkdir()
        (tmp_path / "b" / "fake").symlink_to(tmp_path / "a" / "fake")
        queue = shared["POSTTRAIN_TASK_QUEUE"]
        first = start_worker(env["a"], tmp_path / "worker-a.log")
        second = None
        try:
            reset = await reset_new_session(client, queue)
            handle = client.get_workflow_handle(reset.workflow_id)
            episode_id = reset.episode_id
            job = await call(
                handle,
                episode_id,
                "r1",
                "jobs_submit",
                script="print('training')\n",
                flavor="cpu-basic",
                timeout_minutes=10,
            )
            job_id = job.data["job_id"]
            n, state = 1, "queued"
            while state != "succeeded":
                assert state in ("queued", "running"), state
                n += 1
                waited = await call(handle, episode_id, f"r{n}", "jobs_wait", job_id=job_id)
                state = waited.data["state"]
            sent = time.monotonic()
            submit = await handle.start_update(
                EpisodeWorkflow.call_tool,
                ToolCall(request_id="submit", tool="submit", arguments={"job_id": job_id}),
                id=f"{episode_id}:submit",
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                result_type=ToolResult,
            )
            backend = FakeBackend(tmp_path / "a" / "fake", scenario)

            async def grader_started() -> bool:
                return any(r.role is JobRole.grader for r in backend.requests())

            await eventually(grader_started, PROGRESS_S, "worker A to start the grader")
            await asyncio.to_thread(first.send_signal, signal.SIGTERM)
            await asyncio.to_thread(first.wait, 60)
            # A stopped before the grader could end (it started after `sent` and runs for
            # `grader_s`): only B can read its score line.
            assert time.monotonic() - sent < grader_s
            second = start_worker(env["b"], tmp_path / "worker-b.log")
            result = Answer.of(await asyncio.wait_for(submit.result(), 180), "step")
            assert result.reward == 0.625 and result.done, result
            assert result.data["score"] == 0.625
            assert result.metadata["episode_end"]["reason"] == "submitted"
            # Only the key file was used: no machine made a key of its own.
            assert not any((m.state_dir / "server.key").exists() for m in machines.values())
        finally:
            kill_group(first)
            if second is not None:
                kill_group(second)


def test_on_the_embedded_temporal_a_new_key_starts_only_after_key_forget_with_the_server_stopped(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "state")
    server.start()
    try:
        busy = run_to_exit(["key", "forget"], server.env())
        assert busy.returncode == 1 and "stop it first" in busy.stderr, busy.stderr
        # The running server's Temporal was left alone: the server still serves.
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    finally:
        assert server.stop() == 0
    (server.state_dir / "server.key").unlink()  # a laptop's key lost: a new one is made
    with pytest.raises(RuntimeError, match="is not the deployment's"):
        server.start()
    assert server.proc is not None and server.proc.returncode == 2
    forgotten = run_to_exit(["key", "forget"], server.env())
    assert forgotten.returncode == 0, forgotten.stderr
    assert "forgot the key fingerprint of task queue 'posttrain'" in forgotten.stdout
    server.start()
    assert server.stop() == 0
