"""An agent turn runs in a process of its own that sees the conversation and nothing else of the
agent worker (no broker secret, no folder of the server); what a turn may answer is bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.campaigns.agent_turns import AgentTurnActivities
from activities.campaigns.store import CampaignStore
from posttrain_common.campaigns.spec import AgentSpec
from posttrain_common.contracts.campaigns import AgentTurn
from posttrain_env.agents.conversation import BaseModelRef, Message, TaskBrief
from posttrain_env.agents.prompts import tool_content
from posttrain_env.limits import (
    MAX_AGENT_CALLS_PER_TURN,
    MAX_AGENT_TURN_BYTES,
    MAX_TOOL_MESSAGE_CHARS,
)
from tests.campaigns.harness import agent_env

BRIEF = TaskBrief(
    task_id="t_a",
    reference_task="t_a",
    prompt="do it",
    base_model=BaseModelRef(repo_id="org/base", revision="a" * 40),
)


async def turn(tmp_path: Path, agent: AgentSpec, environ: dict[str, str]) -> Any:
    store = CampaignStore(tmp_path / "campaigns")
    head = store.start_conversation("c1", BRIEF)
    turns = AgentTurnActivities(store, environ)
    summary = await turns.agent_turn(
        AgentTurn(
            campaign_id="c1", attempt_key="c1/t_a/x/1/a1", number=1, agent=agent, conversation=head
        )
    )
    return store, summary


async def test_a_turns_process_sees_only_the_basics_and_the_agents_own_key(
    tmp_path: Path,
) -> None:
    environ = agent_env(AGENT_KEY="sk-mine", OTHER_SECRET="nope", POSTTRAIN_STATE_DIR=str(tmp_path))
    agent = AgentSpec(name="snoop", agent="tests.campaigns.agents:Snoop", api_key_env="AGENT_KEY")
    store, summary = await turn(tmp_path, agent, environ)
    assert summary.kind == "stop"
    [reply] = store.conversation("c1", summary.conversation).messages
    seen = json.loads(reply.content or "")
    assert set(seen["env"]) <= {
        "PATH",
        "PYTHONPATH",
        "HOME",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "AGENT_KEY",
        "LC_CTYPE",  # set by CPython's locale coercion when no locale is given
    }
    assert "AGENT_KEY" in seen["env"] and "OTHER_SECRET" not in seen["env"]
    assert seen["cwd_files"] == [".stderr"]  # an empty folder of its own (its stderr aside)
    assert seen["task"] == "t_a" and seen["messages"] == 0 and seen["has_key"] is True


async def test_a_turn_whose_key_variable_is_unset_is_refused_as_invalid(tmp_path: Path) -> None:
    agent = AgentSpec(name="snoop", agent="tests.campaigns.agents:Snoop", api_key_env="NOT_SET")
    with pytest.raises(ApplicationError) as raised:
        await turn(tmp_path, agent, agent_env())
    assert raised.value.type == "agent_invalid" and "NOT_SET" in raised.value.message


async def test_a_turn_over_the_size_limit_fails_the_turn(tmp_path: Path) -> None:
    agent = AgentSpec(name="chatty", agent="tests.campaigns.agents:Chatty")
    with pytest.raises(ApplicationError) as raised:
        await turn(tmp_path, agent, agent_env())
    assert raised.value.type == "agent_failed"
    assert f"over {MAX_AGENT_TURN_BYTES} bytes" in raised.value.message


@pytest.mark.parametrize("calls", [MAX_AGENT_CALLS_PER_TURN, MAX_AGENT_CALLS_PER_TURN + 1])
async def test_calls_per_turn_are_at_most_the_limit(tmp_path: Path, calls: int) -> None:
    agent = AgentSpec(name="busy", agent="tests.campaigns.agents:Busy", args={"calls": calls})
    if calls <= MAX_AGENT_CALLS_PER_TURN:
        _, summary = await turn(tmp_path, agent, agent_env())
        assert summary.calls == calls
        return
    with pytest.raises(ApplicationError) as raised:
        await turn(tmp_path, agent, agent_env())
    assert raised.value.type == "agent_failed"


def test_a_tool_answer_is_cut_for_the_model_at_the_limit() -> None:
    big = Message(role="tool", call_id="c", tool="jobs_logs", data={"lines": ["y" * 50_000]})
    content = tool_content(big)
    assert content.startswith('{"result"') and content.endswith("ask for fewer lines]")
    assert len(content) < MAX_TOOL_MESSAGE_CHARS + 100
    small = Message(role="tool", call_id="c", tool="task_info", data={"a": 1})
    assert json.loads(tool_content(small)) == {"result": {"a": 1}}
