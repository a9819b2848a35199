"""The gateway's /metrics, over real HTTP: tool calls move the latency and error series of their
tool and path, oversized MCP bodies count as refusals, no id becomes a label, and
POSTTRAIN_METRICS=off leaves no /metrics."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from activities.backends.fake.backend import FakeScenario
from tests.gateway.mcp_helpers import create_episode, data, mcp_session
from tests.gateway.server import ServerProcess
from tests.gateway.test_payload_bounds import raw_post_reply
from tests.waiting import wait_until

LATENCY = "posttrain_gateway_tool_call_seconds"


def samples(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the gateway's /metrics, by name and labels."""
    answer = httpx.get(f"{server.base_url}/metrics", timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def rpc_call(server: ServerProcess, session_id: str, name: str, request: int) -> dict:
    params = {"session_id": session_id, "name": name, "arguments": {}}
    body = {"jsonrpc": "2.0", "id": request, "method": "tools/call", "params": params}
    return httpx.post(f"{server.base_url}/mcp", json=body, timeout=60).json()


def test_tool_calls_move_the_latency_and_error_series_of_their_tool_and_path(
    server: ServerProcess,
) -> None:
    base = server.base_url
    before = samples(server)
    reset = httpx.post(f"{base}/reset", json={"task_id": "t0_artifact"}, timeout=60).json()
    session_id = reset["metadata"]["session_id"]
    step = httpx.post(
        f"{base}/step",
        json={"session_id": session_id, "action": {"tool_name": "task_info", "arguments": {}}},
        timeout=60,
    )
    assert step.status_code == 200, step.text
    assert rpc_call(server, session_id, "task_info", 1)["result"]["data"]["task_id"]
    typo = rpc_call(server, session_id, "made_up_tool_name", 2)
    assert typo["result"]["data"]["error"]["type"] == "invalid_argument"
    after = samples(server)

    for path in ("step", "openenv_mcp"):
        count = f"{LATENCY}_count"
        moved = value(after, count, tool="task_info", path=path) - value(
            before, count, tool="task_info", path=path
        )
        assert moved == 1, path
        assert value(after, f"{LATENCY}_sum", tool="task_info", path=path) > value(
            before, f"{LATENCY}_sum", tool="task_info", path=path
        )
    errors = "posttrain_gateway_tool_call_errors_total"
    # An agent's made-up name is no label of its own: it is `other`.
    assert (
        value(after, errors, tool="other", kind="invalid_argument")
        - value(before, errors, tool="other", kind="invalid_argument")
        == 1
    )
    labels = {label for _, pairs in after for label in pairs}
    assert not any(session_id in str(label) for label in labels)
    assert not any("made_up_tool_name" in str(label) for label in labels)


async def test_the_episode_mcp_endpoint_counts_its_calls_and_its_refused_bodies(
    server: ServerProcess,
) -> None:
    before = samples(server)
    episode = await create_episode(server)
    async with mcp_session(episode) as session:
        assert data(await session.call_tool("task_info", {}))["task_id"] == "t0_artifact"
    headers = {
        "Authorization": f"Bearer {episode['episode_token']}",
        "Accept": "application/json, text/event-stream",
        "Content-Length": str(100 * 1024 * 1024),
    }
    path = urlsplit(episode["mcp_url"]).path
    status, _ = raw_post_reply(server, path, headers, iter([b"x" * 1024]))
    assert status == 413
    after = samples(server)
    count = f"{LATENCY}_count"
    assert (
        value(after, count, tool="task_info", path="mcp")
        - value(before, count, tool="task_info", path="mcp")
        == 1
    )
    refusals = "posttrain_gateway_payload_refusals_total"
    assert value(after, refusals, kind="body") - value(before, refusals, kind="body") == 1
    assert not any(episode["episode_id"] in str(labels) for _, labels in after)


def test_the_server_says_where_its_metrics_are_and_serves_its_worker_series_there(
    server: ServerProcess,
) -> None:
    assert f"metrics: http://127.0.0.1:{server.port}/metrics" in server.log()
    assert value(samples(server), "posttrain_worker_info", backend="fake") == 1
    # The in-process worker's visibility gauges, read in the background (every 15 s).
    wait_until(
        lambda: value(samples(server), "posttrain_visibility_last_success_timestamp_seconds"),
        60,
        "a visibility reading on the gateway's /metrics",
    )
    found = samples(server)
    assert ("posttrain_episodes", frozenset({("state", "running")})) in found
    assert ("posttrain_jobs", frozenset({("state", "running"), ("backend", "fake")})) in found


def test_with_metrics_off_there_is_no_metrics_route(
    make_server: Callable[[FakeScenario], ServerProcess],
) -> None:
    quiet = make_server(FakeScenario())
    quiet.extra_env["POSTTRAIN_METRICS"] = "off"
    quiet.start()
    assert httpx.get(f"{quiet.base_url}/metrics", timeout=30).status_code == 404
    assert "metrics: off (POSTTRAIN_METRICS)" in quiet.log()
