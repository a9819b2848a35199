"""Bad campaign specs get a clear error before anything starts; every campaign limit has a test.

`campaign run` is driven in this process with Temporal's address pointing at a closed port: a
spec that got past the checks would try to connect and fail otherwise than with exit status 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from posttrain_common.campaigns.spec import SpecError, load_spec, parse_spec
from posttrain_env.limits import (
    MAX_AGENT_ARGS_BYTES,
    MAX_AGENT_TURNS,
    MAX_CAMPAIGN_AGENTS,
    MAX_CAMPAIGN_ROLLOUTS,
    MAX_CAMPAIGN_TASKS,
    MAX_CONCURRENCY,
)
from posttrain_server.commands.campaign import add_campaign_commands, run_campaign_command

REPO = Path(__file__).resolve().parents[2]
REFERENCE = {"name": "ref", "agent": "reference"}


def spec(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "smoke",
        "tasks": ["t0_artifact"],
        "agents": [REFERENCE],
        "epochs": 2,
        "concurrency": 2,
        "budget_usd": 5.0,
    }
    return {**base, **changes}


def toml_of(data: dict[str, Any]) -> str:
    """Enough TOML for these specs: scalars and lists at the top, agents as inline tables."""
    lines = []
    for key, value in data.items():
        if key == "agents":
            continue
        lines.append(f"{key} = {json.dumps(value)}")
    for agent in data.get("agents", []):
        lines.append("[[agents]]")
        for key, value in agent.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def run_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any] | str, *flags: str
) -> int:
    path = tmp_path / "spec.toml"
    path.write_text(data if isinstance(data, str) else toml_of(data))
    monkeypatch.setenv("POSTTRAIN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens there
    parser = argparse.ArgumentParser()
    add_campaign_commands(parser.add_subparsers(dest="command"))
    return run_campaign_command(parser.parse_args(["campaign", "run", str(path), *flags]))


@pytest.mark.parametrize(
    ("data", "flags", "says"),
    [
        (spec(tasks=["t9_nope"]), (), "t9_nope"),
        (spec(agents=[{"name": "x", "agent": "gpt-magic"}]), (), "unknown agent 'gpt-magic'"),
        (spec(concurrency=0), (), "concurrency"),
        (spec(), ("--concurrency", "0"), "concurrency"),
        (spec(epochs=0), (), "epochs"),
        (spec(budget_usd=0.25), (), "below the worst case of one rollout of t0_artifact/ref"),
        (spec(), ("--budget-usd", "0.1"), "below the worst case"),
        (
            spec(agents=[{"name": "llm", "agent": "openai", "llm_cap_usd": 5.0}]),
            (),
            "budget_usd: $5.0 is below the worst case",
        ),
        (
            spec(agents=[{"name": "llm", "agent": "openai", "args": {"api_key": "abc123"}}]),
            (),
            "agents[0].args.api_key",
        ),
        (
            spec(agents=[{"name": "llm", "agent": "openai", "args": {"x": "hf_" + "a" * 30}}]),
            (),
            "looks like a secret",
        ),
        (
            spec(agents=[{"name": "llm", "agent": "openai", "api_key_env": "HF_TOKEN"}]),
            (),
            "broker's token",
        ),
        (spec(agents=[REFERENCE, REFERENCE]), (), "same name"),
        (spec(tasks=["t0_artifact", "t0_artifact"]), (), "named twice"),
        (spec(colour="blue"), (), "colour: unknown key"),
        ("tasks = [", (), "not valid TOML"),
    ],
)
def test_a_bad_spec_is_refused_with_exit_2_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    data: dict[str, Any] | str,
    flags: tuple[str, ...],
    says: str,
) -> None:
    assert run_cli(tmp_path, monkeypatch, data, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("posttrain-env campaign: ") and says in err, err
    assert not (tmp_path / "state" / "campaigns").exists()  # no folder, no record


def test_the_readme_example_spec_passes_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from activities.campaigns.activities import check_tasks
    from tasks.registry import TASKS_DIR

    loaded = load_spec(REPO / "examples" / "campaign.toml")
    check_tasks(loaded, TASKS_DIR)
    assert loaded.rollouts == len(loaded.tasks) * len(loaded.agents) * loaded.epochs


def test_a_key_is_never_in_a_spec_only_the_name_of_its_variable() -> None:
    ok = parse_spec(spec(agents=[{"name": "llm", "agent": "openai", "api_key_env": "MY_KEY"}]))
    assert ok.agents[0].api_key_env == "MY_KEY"
    for leak in ({"token": "x"}, {"nested": {"secret": "y"}}, {"h": ["Bearer abc"]}):
        with pytest.raises(SpecError, match="secret"):
            parse_spec(spec(agents=[{"name": "a", "agent": "scripted", "args": leak}]))


def test_a_third_party_agent_is_named_module_colon_attr() -> None:
    named = parse_spec(spec(agents=[{"name": "mine", "agent": "my_pkg.agents:Mine"}]))
    assert named.agents[0].agent == "my_pkg.agents:Mine"
    with pytest.raises(SpecError, match="unknown agent"):
        parse_spec(spec(agents=[{"name": "mine", "agent": "my_pkg.agents"}]))


# -- limits ----------------------------------------------------------------------------------


def test_concurrency_is_at_most_the_limit() -> None:
    assert parse_spec(spec(concurrency=MAX_CONCURRENCY)).concurrency == MAX_CONCURRENCY
    with pytest.raises(SpecError, match="concurrency"):
        parse_spec(spec(concurrency=MAX_CONCURRENCY + 1))


def test_rollouts_are_at_most_the_limit() -> None:
    at = parse_spec(spec(epochs=MAX_CAMPAIGN_ROLLOUTS))
    assert at.rollouts == MAX_CAMPAIGN_ROLLOUTS
    with pytest.raises(SpecError, match=f"a campaign runs at most {MAX_CAMPAIGN_ROLLOUTS}"):
        parse_spec(spec(epochs=MAX_CAMPAIGN_ROLLOUTS + 1))


def test_tasks_and_agents_are_at_most_the_limits() -> None:
    tasks = [f"t{i}" for i in range(MAX_CAMPAIGN_TASKS)]
    assert len(parse_spec(spec(tasks=tasks)).tasks) == MAX_CAMPAIGN_TASKS
    with pytest.raises(SpecError, match="tasks"):
        parse_spec(spec(tasks=[*tasks, "one_more"]))
    agents = [{"name": f"a{i}", "agent": "reference"} for i in range(MAX_CAMPAIGN_AGENTS)]
    assert len(parse_spec(spec(agents=agents)).agents) == MAX_CAMPAIGN_AGENTS
    with pytest.raises(SpecError, match="agents"):
        parse_spec(spec(agents=[*agents, {"name": "extra", "agent": "reference"}]))


def test_an_agents_arguments_are_at_most_the_limit() -> None:
    # json.dumps({"p": "..."}) adds 9 bytes around the string.
    fits = {"p": "x" * (MAX_AGENT_ARGS_BYTES - 9)}
    assert parse_spec(spec(agents=[{"name": "a", "agent": "scripted", "args": fits}]))
    over = {"p": "x" * (MAX_AGENT_ARGS_BYTES - 8)}
    with pytest.raises(SpecError, match=f"at most {MAX_AGENT_ARGS_BYTES}"):
        parse_spec(spec(agents=[{"name": "a", "agent": "scripted", "args": over}]))


def test_max_turns_is_at_most_the_limit() -> None:
    agent = {"name": "a", "agent": "reference", "max_turns": MAX_AGENT_TURNS}
    assert parse_spec(spec(agents=[agent])).agents[0].max_turns == MAX_AGENT_TURNS
    with pytest.raises(SpecError, match="max_turns"):
        parse_spec(spec(agents=[{**agent, "max_turns": MAX_AGENT_TURNS + 1}]))
