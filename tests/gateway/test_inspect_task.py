"""The Inspect task (`posttrain_env/posttrain`, posttrain_env/inspect_task.py) end to end: Inspect
runs in a process of its own with a scripted `mockllm/model` (tests/gateway/inspect_driver.py)
against the real server; each sample is one episode played over its MCP endpoint."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zipfile_zstd  # zipfile with zstd, which Inspect's logs use (an inspect-ai dependency)

import tasks
from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from posttrain_common.keys import ServerKey
from tests.gateway.server import ServerProcess, serving

# Each test runs Inspect itself (an `inspect eval` process) through whole episodes: 15-35 s each
# on 2 cores. With the other third-party clients, in the slow set (docs/clients.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_SOLUTION = Path(tasks.__file__).parent / "t0_artifact" / "reference_solution.py"
API_KEY = "k-inspect-" + "5eC7e7" * 6
FAKE = FakeScenario(
    jobs=[
        FakeJobScript(script_contains="RUN_LONG", queue_s=1, run_s=3600),
        FakeJobScript(role=JobRole.grader, queue_s=1, run_s=2, outcome="failed"),
        FakeJobScript(queue_s=1, run_s=2),
    ]
)


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, FAKE)


def run_inspect(
    server: ServerProcess,
    log_dir: Path,
    script: Path,
    *,
    fail_after: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One eval of one sample; the driver's summary of its log."""
    args = [str(server.base_url), "t0_artifact", str(log_dir), str(script)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.gateway.inspect_driver", *args, *filter(None, [fail_after])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def log_bytes(location: str) -> bytes:
    """Every member of an `.eval` log (a zip of JSON, zstd-compressed), uncompressed."""
    with zipfile_zstd.ZipFile(location) as log:
        return b"".join(log.read(name) for name in log.namelist())


def only_sample(summary: dict[str, Any]) -> dict[str, Any]:
    [sample] = summary["samples"]
    return sample


def test_a_sample_plays_t0_artifact_on_the_local_backend_to_reward_1_leaking_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerProcess(
        tmp_path / "state",
        extra_env={"POSTTRAIN_BACKEND": "local", "POSTTRAIN_API_KEYS": API_KEY},
    )
    server.start()
    try:
        monkeypatch.setenv("ENV_SERVER_API_KEY", API_KEY)
        summary = run_inspect(server, tmp_path / "logs", REFERENCE_SOLUTION)
    finally:
        server.stop()
    assert summary["status"] == "success"
    sample = only_sample(summary)
    assert sample["error"] is None
    assert sample["tools"][0] == "jobs_submit" and sample["tools"][-2:] == [
        "dev_evaluate",
        "submit",
    ]
    score = sample["scores"]["episode_reward"]
    assert score["value"] == 1.0, score
    meta = score["metadata"]
    assert meta["end_reason"] == "submitted" and meta["reward"] == 1.0
    assert meta["service_spend"]["settled"]["jobs"] == 1 and meta["service_spend"]["final"] is True
    assert meta["steps_used"] == len(sample["tools"])
    # Neither the API key nor the episode's token is anywhere in Inspect's log.
    token = ServerKey.load_or_create(server.state_dir / "server.key").episode_token(
        meta["episode_id"]
    )
    written = log_bytes(summary["location"])
    assert meta["episode_id"].encode() in written  # the log is searchable as it is
    assert API_KEY.encode() not in written and token.encode() not in written


def test_a_grader_failure_is_unscored_not_0(fake_server: ServerProcess, tmp_path: Path) -> None:
    summary = run_inspect(fake_server, tmp_path / "logs", REFERENCE_SOLUTION)
    score = only_sample(summary)["scores"]["episode_reward"]
    assert math.isnan(score["value"]), score  # Inspect's unscored: left out of every metric
    assert score["reason"] == "grader_failed"
    assert score["metadata"]["end_reason"] == "score_failed" and score["metadata"]["reward"] is None


def test_a_failed_sample_ends_its_episode_and_cancels_its_jobs(
    fake_server: ServerProcess, tmp_path: Path
) -> None:
    long_job = tmp_path / "train.py"
    long_job.write_text("RUN_LONG = 1\n")
    summary = run_inspect(fake_server, tmp_path / "logs", long_job, fail_after="jobs_submit")
    sample = only_sample(summary)
    assert "the scripted model fails" in sample["error"]
    episode_id = sample["metadata"]["posttrain_episode_id"]
    status = fake_server.wait_status(episode_id, lambda s: s.done and s.service_spend.final)
    assert status.end is not None and status.end.reason.value == "abandoned"
    assert status.end.reward == 0.0
    assert [job["state"] for job in status.jobs] == ["cancelled"]  # nothing left billing
