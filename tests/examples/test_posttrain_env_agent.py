"""`examples/posttrain_env_agent.py` run as a user runs it: a subprocess playing against the real
server (embedded Temporal, fake backend) and a scripted OpenAI-compatible endpoint on 127.0.0.1.

The example is a thin command line over `posttrain_env.agents.play` and `OpenAIAgent`, so a turn
is the agent's: a reply without a tool call is nudged within its turn (up to twice), which is why
a turn may take more than one request of the LLM.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples.conftest import QUICK
from tests.examples.scripted_llm import (
    Reply,
    Script,
    ScriptedLLM,
    calls,
    failure,
    text,
    tool_results,
)
from tests.gateway.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "posttrain_env_agent.py"
AGENT_KEY = "agent-key-5f3c9e1d7a"
BROKER_TOKEN = "hf_broker_secret_0b7d41c6e2"
ENV_KEY = "env-server-key-93d2a6f01c"
SUBMIT_ARGS = {"script": "print('training')\n", "flavor": "cpu-basic", "timeout_minutes": 5}
TOOLS = [
    "task_info",
    "list_hardware",
    "jobs_submit",
    "jobs_wait",
    "jobs_status",
    "jobs_logs",
    "jobs_cancel",
    "dev_evaluate",
    "submit",
]


def run_example(
    server: ServerProcess, llm: ScriptedLLM, *args: str, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """The example with the agent's key in its environment — and a broker token beside it, as
    on a machine that runs both, which must never reach the LLM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "HF_"))}
    env.update({"AGENT_API_KEY": AGENT_KEY, "HF_TOKEN": BROKER_TOKEN, **extra_env})
    urls = ["--base-url", server.base_url, "--llm-base-url", llm.base_url]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *urls, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    llm.check()
    return done


def whole_episode() -> Script:
    messages = yield calls(("task_info", {}))
    [info] = tool_results(messages)
    assert info["result"]["prompt"] and info["steps_left"] == 99
    # Two calls in one turn: both run, both answered in order.
    messages = yield calls(("list_hardware", {}), ("jobs_submit", SUBMIT_ARGS))
    hardware, job = tool_results(messages)
    assert "cpu-basic" in str(hardware["result"])
    job_id = job["result"]["job_id"]
    assert job["spend_usd"]["reserved"] > 0
    while job["result"]["state"] != "succeeded":
        assert job["result"]["state"] in {"queued", "running"}, job
        messages = yield calls(("jobs_wait", {"job_id": job_id, "timeout_s": 60}))
        [job] = tool_results(messages)
    messages = yield calls(("dev_evaluate", {"job_id": job_id}))
    [dev] = tool_results(messages)
    assert "error" not in dev["result"], dev
    yield calls(("submit", {"job_id": job_id}))  # the episode ends: no further request


def test_the_example_plays_a_whole_episode_and_only_the_agent_key_reaches_the_llm(
    server: ServerProcess,
) -> None:
    with ScriptedLLM(whole_episode()) as llm:
        done = run_example(server, llm)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done: submitted" in done.stdout
    assert "reward: 0.75" in done.stdout
    assert "spend: $0.0" in done.stdout and "(1 jobs, 1 dev evaluations)" in done.stdout

    first = llm.seen[0].json()
    assert [t["function"]["name"] for t in first["tools"]] == TOOLS
    submit_schema = first["tools"][2]["function"]["parameters"]
    assert submit_schema["required"] == ["script", "flavor", "timeout_minutes"]
    system = first["messages"][0]
    assert system["role"] == "system" and "Produce a checkpoint" in system["content"]
    assert "Budget: $0.5" in system["content"]

    # The broker's token sat in the example's environment; none of it left for the LLM.
    # task_info, list+submit, any waits (none when a loaded machine answered jobs_submit only
    # after the short job had succeeded), dev_evaluate, submit.
    assert len(llm.seen) >= 5
    assert {s.authorization for s in llm.seen} == {f"Bearer {AGENT_KEY}"}
    for seen in llm.seen:
        assert BROKER_TOKEN.encode() not in seen.raw
        assert b"episode_token" not in seen.raw  # the reset metadata's capability stays home
    assert AGENT_KEY not in done.stdout + done.stderr  # never logged


def malformed_then_silent() -> Script:
    messages = yield calls(("jobs_status", '{"job_id": "job-'))
    [answer] = tool_results(messages)
    # Answered as the environment's own error, in the shape every tool message has.
    assert answer["result"]["error"]["type"] == "invalid_argument", answer
    assert "not valid JSON" in answer["result"]["error"]["message"]
    assert "steps_left" not in answer  # answered here: the episode never saw it
    messages = yield calls(("task_info", {}))
    [info] = tool_results(messages)
    assert info["result"]["prompt"]
    assert info["steps_left"] == 99  # the malformed call never reached the environment
    # Turn 3 answers without a tool call: the agent nudges within the same turn.
    messages = yield text("I think I am done.")
    assert messages[-2] == {"role": "assistant", "content": "I think I am done."}
    assert messages[-1]["role"] == "user" and "submit" in messages[-1]["content"]
    yield calls(("nonexistent_tool", {}))


def test_malformed_tool_call_json_is_answered_as_an_error_and_the_episode_goes_on(
    server: ServerProcess,
) -> None:
    with ScriptedLLM(malformed_then_silent()) as llm:
        done = run_example(server, llm, "--max-turns", "3")
    # Three turns without submitting: the example says so and exits 1, not with a traceback.
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no end after 3 turns" in done.stdout
    assert "Traceback" not in done.stderr
    assert "model: I think I am done." in done.stdout
    assert "there is no tool 'nonexistent_tool'" in done.stdout
    assert len(llm.seen) == 4  # three turns, the third with one nudge


def rate_limited_first() -> Script:
    yield failure(429, {"Retry-After": "0"})
    yield failure(503)  # no Retry-After: the client's own backoff
    messages = yield calls(("task_info", {}))
    [info] = tool_results(messages)
    assert info["result"]["prompt"]
    yield calls(("list_hardware", {}))


def test_rate_limits_and_server_errors_from_the_llm_are_retried(server: ServerProcess) -> None:
    with ScriptedLLM(rate_limited_first()) as llm:
        done = run_example(server, llm, "--max-turns", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    # The openai client retried both within the first turn, and the example showed each retry.
    assert done.stdout.count("(LLM: Retrying request") == 2, done.stdout
    assert "[1] task_info" in done.stdout and "[2] list_hardware" in done.stdout
    assert "no end after 2 turns" in done.stdout
    assert len(llm.seen) == 4  # 429, 503, then one reply for each turn


def refused() -> Script:
    yield Reply(401, {"error": {"message": f"invalid key {AGENT_KEY}"}})


def test_a_refused_llm_request_is_not_retried_and_exits_1(server: ServerProcess) -> None:
    with ScriptedLLM(refused()) as llm:
        done = run_example(server, llm)
    assert done.returncode == 1
    assert "the agent failed: the LLM answered HTTP 401" in done.stderr
    assert "Traceback" not in done.stderr
    assert AGENT_KEY not in done.stdout + done.stderr  # not even when the endpoint quotes it
    assert len(llm.seen) == 1


def one_look() -> Script:
    messages = yield calls(("task_info", {}))
    [info] = tool_results(messages)
    assert info["result"]["prompt"]
    yield calls(("list_hardware", {}))


@pytest.mark.slow  # a second server of its own, with API keys: 20-30 s
def test_a_server_with_api_keys_gets_the_env_key_and_the_llm_never_sees_it(
    tmp_path: Path,
) -> None:
    keyed = ServerProcess(tmp_path, scenario=QUICK, extra_env={"POSTTRAIN_API_KEYS": ENV_KEY})
    keyed.start()
    try:
        with ScriptedLLM(one_look()) as llm:
            done = run_example(keyed, llm, "--max-turns", "2", ENV_SERVER_API_KEY=ENV_KEY)
            refused = run_example(keyed, llm, "--max-turns", "1")
    finally:
        keyed.stop()
    assert done.returncode == 1 and "no end after 2 turns" in done.stdout, done.stderr
    assert len(llm.seen) == 2  # the run without the key never reached the LLM
    for seen in llm.seen:
        assert ENV_KEY.encode() not in seen.raw
    assert refused.returncode == 1, refused.stderr
    assert "the env server" in refused.stderr and "401" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_broker_token_variable_is_refused_as_the_agent_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", BROKER_TOKEN)
    spec = importlib.util.spec_from_file_location("posttrain_env_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with pytest.raises(SystemExit) as exit_:
        example.main(["--api-key-env", "HF_TOKEN"])
    assert exit_.value.code == 2
    assert "broker's token" in capsys.readouterr().err
