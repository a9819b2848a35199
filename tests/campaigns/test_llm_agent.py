"""The OpenAI-compatible agent inside a campaign, against a scripted chat-completions server on
127.0.0.1: a 429 is retried, a malformed tool call is answered without reaching the episode,
the LLM's spend is recorded apart from the environment's, and the agent's key is nowhere but in
the requests to its LLM. The agent worker refuses to start beside the broker's secrets."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from posttrain_common.campaigns.records import Outcome
from posttrain_common.settings import Settings
from posttrain_server.agent_worker import refusal
from tests.campaigns.harness import agent_env, running_campaigns
from tests.examples.scripted_llm import Reply, Script, ScriptedLLM, calls, failure, tool_results
from workflows.ids import (
    campaign_workflow_id,
    episode_workflow_id,
    job_workflow_id,
    rollout_workflow_id,
)

AGENT_KEY = "sk-agent-" + "k3y" * 8  # the agent's own key: only its LLM may see it
SOLUTION = "print('trained')\n"
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
# $0.15 and $0.60 per million tokens: 1000 x 0.15 + 100 x 0.60 = 210 micro-USD per reply.
PRICES = {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}
PER_REPLY_MICRO_USD = 210


def used(reply: Reply) -> Reply:
    reply.body["usage"] = USAGE
    return reply


@dataclass
class Seen:
    """What the scripted LLM saw of the rollout."""

    replies: int = 0  # answers with a turn (the 429 is none)
    malformed_answer: dict[str, Any] = field(default_factory=dict)
    steps_left_after_malformed: int | None = None


def solver(seen: Seen) -> Script:
    messages = yield failure(429, {"retry-after-ms": "20"})  # retried by the client
    seen.replies += 1
    messages = yield used(calls(("jobs_submit", '{"script": "print(1)", "flavor": ')))
    [answer] = tool_results(messages)
    seen.malformed_answer = answer
    seen.replies += 1
    arguments = {"script": SOLUTION, "flavor": "cpu-basic", "timeout_minutes": 5}
    messages = yield used(calls(("jobs_submit", arguments)))
    [submitted] = tool_results(messages)
    seen.steps_left_after_malformed = submitted["steps_left"]
    job = submitted["result"]
    while job["state"] in ("queued", "running"):
        seen.replies += 1
        messages = yield used(calls(("jobs_wait", {"job_id": job["job_id"], "timeout_s": 600})))
        [waited] = tool_results(messages)
        job = waited["result"]
    assert job["state"] == "succeeded", job
    seen.replies += 1
    yield used(calls(("submit", {"job_id": job["job_id"]})))


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


@pytest.mark.slow  # a whole campaign through an agent worker and turn processes: 45-50 s
async def test_an_llm_agent_plays_a_campaign_rollout_and_its_key_stays_with_its_llm(
    time_skipping_env: WorkflowEnvironment,
    tmp_path: Path,
    logged: pytest.LogCaptureFixture,
) -> None:
    seen = Seen()
    with ScriptedLLM(solver(seen)) as llm:
        spec = {
            "name": "llm",
            "tasks": ["t_a"],
            "agents": [
                {
                    "name": "gpt",
                    "agent": "openai",
                    "api_key_env": "AGENT_KEY",
                    "args": {"model": "scripted", "base_url": llm.base_url, "max_retries": 3},
                    "prices": PRICES,
                    "llm_cap_usd": 0.5,
                }
            ],
            "epochs": 1,
            "concurrency": 1,
            "budget_usd": 10.0,
        }
        environ = agent_env(AGENT_KEY=AGENT_KEY)
        async with running_campaigns(
            time_skipping_env, tmp_path, tasks={"t_a": {}}, agent_environ=environ
        ) as c:
            campaign_id = await c.start(spec)
            status = await c.run_until_final(campaign_id)
            [record] = c.records(campaign_id)
            ids = [
                campaign_workflow_id(campaign_id),
                rollout_workflow_id(record.rollout_id, 1),
                episode_workflow_id(record.episode_id or ""),
                job_workflow_id(record.episode_id or "", 1),
                job_workflow_id(record.episode_id or "", 2),  # the grader
            ]
            histories = [
                (await c.client.get_workflow_handle(i).fetch_history()).to_json() for i in ids
            ]
        llm.check()

    assert record.outcome is Outcome.scored and record.end_reason == "submitted", record
    assert status.counts[Outcome.scored] == 1 and status.mean_reward == record.reward
    # The malformed call was answered as an error, without a step.
    assert seen.malformed_answer["result"]["error"]["type"] == "invalid_argument"
    assert "not valid JSON" in seen.malformed_answer["result"]["error"]["message"]
    assert seen.steps_left_after_malformed == 100 - 1
    assert record.turns == seen.replies and record.steps_used == seen.replies - 1
    # The 429 was retried: one request more than the replies with a turn.
    completions = [s for s in llm.seen if s.path == "/v1/chat/completions"]
    assert len(completions) == seen.replies + 1
    assert {s.authorization for s in completions} == {f"Bearer {AGENT_KEY}"}
    # The LLM's spend, apart from the environment's.
    assert record.llm.requests == seen.replies
    assert record.llm.prompt_tokens == 1000 * seen.replies
    assert record.llm.completion_tokens == 100 * seen.replies
    assert record.llm.usd == round(PER_REPLY_MICRO_USD * seen.replies / 1e6, 6)
    assert status.llm_usd == record.llm.usd and status.env_usd == record.service_spend.settled.usd
    assert record.total_usd == round(record.llm.usd + record.service_spend.settled.usd, 6)
    # The key: in no history, no file of the campaign's folder, no log line.
    assert all(history for history in histories)
    for history in histories:
        assert AGENT_KEY not in history
    for path in c.root.rglob("*"):
        if path.is_file():
            assert AGENT_KEY.encode() not in path.read_bytes(), path
    assert AGENT_KEY not in logged.text


def test_the_agent_worker_refuses_to_start_with_the_brokers_token_set(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "POSTTRAIN_STATE_DIR": str(tmp_path / "state"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # it must refuse before it connects anywhere
        "HF_TOKEN": "hf_" + "x" * 30,
    }
    done = subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", "agent-worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2, done
    assert "HF_TOKEN is set" in done.stderr and "hf_xxx" not in done.stderr + done.stdout


def test_the_agent_worker_refuses_a_readable_server_key(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    assert refusal(settings, {}) is None
    settings.server_key_path.parent.mkdir(parents=True)
    settings.server_key_path.write_bytes(b"k" * 32)
    assert "server key" in (refusal(settings, {}) or "")
    # Its own state dir, the server's campaigns folder beside the server's key: refused too.
    own = Settings(state_dir=tmp_path / "own", campaigns_dir=tmp_path / "state" / "campaigns")
    assert "server key" in (refusal(own, {}) or "")
    elsewhere = tmp_path / "keys" / "server.key"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"k" * 32)
    assert refusal(Settings(state_dir=tmp_path / "own"), {}) is None
    named = {"POSTTRAIN_SERVER_KEY_FILE": str(elsewhere)}
    assert "server key" in (refusal(Settings(state_dir=tmp_path / "own"), named) or "")
    assert "HUGGING_FACE_HUB_TOKEN" in (
        refusal(Settings(state_dir=tmp_path / "own"), {"HUGGING_FACE_HUB_TOKEN": "x"}) or ""
    )
