"""Who gets in (DESIGN §6 item 6): API keys on every route but the open ones, episode tokens on
an episode's MCP endpoint and only there, and no start on a network bind without keys. One real
server, bound to 0.0.0.0 with keys and a real host name allowed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from posttrain_env.tools import TOOLS
from tests.gateway.conftest import QUICK
from tests.gateway.server import ServerProcess, command, frame, ws_url
from tests.startup import START_REFUSAL_S
from tests.waiting import wait_until

KEY = "k-" + "a1b2c3d4" * 5
OTHER_KEY = "k-" + "e5f6a7b8" * 5
HOST = "posttrain.example"
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"),
        scenario=QUICK,
        extra_env={"POSTTRAIN_API_KEYS": f"{OTHER_KEY}, {KEY}", "POSTTRAIN_ALLOWED_HOSTS": HOST},
    )
    proc.start("--host", "0.0.0.0")  # with keys, a network bind starts
    try:
        yield proc
    finally:
        proc.stop()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def create_episode(server: ServerProcess, **headers: str) -> dict[str, Any]:
    response = httpx.post(
        f"{server.base_url}/episodes",
        json={"task_id": "t0_artifact"},
        headers={**bearer(KEY), **headers},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()


def tool_call(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments or {}}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def sse_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC result in a streamable HTTP (SSE) reply."""
    events = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(events[-1])["result"]


def test_every_route_needs_an_api_key_but_the_open_ones(server: ServerProcess) -> None:
    base = server.base_url
    guarded = [
        ("GET", "/state", None),
        ("POST", "/reset", {"task_id": "t0_artifact"}),
        ("POST", "/step", {"action": {"tool_name": "task_info"}}),
        ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
        ("POST", "/episodes", {"task_id": "t0_artifact"}),
        ("GET", "/docs", None),
    ]
    for method, path, body in guarded:
        for headers in ({}, bearer("wrong"), {"X-API-Key": "wrong"}, {"Authorization": KEY}):
            response = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
            assert response.status_code == 401, (path, headers, response.text)
            assert response.json()["detail"]["code"] == "UNAUTHORIZED"
            assert response.headers["www-authenticate"] == "Bearer"
    for path in ("/health", "/metadata", "/schema", "/openapi.json"):
        assert httpx.get(base + path).status_code == 200, path
    tools = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in (bearer(KEY), bearer(OTHER_KEY), {"X-API-Key": KEY}):
        response = httpx.post(f"{base}/mcp", json=tools, headers=headers)
        assert response.status_code == 200 and {
            tool["name"] for tool in response.json()["result"]["tools"]
        } == set(TOOLS)
    unknown = httpx.post(f"{base}/episodes", json={"task_id": "nope"}, headers=bearer(KEY))
    assert unknown.status_code == 400 and unknown.json()["detail"]["code"] == "invalid_argument"


def test_the_websocket_needs_an_api_key_too(server: ServerProcess) -> None:
    for headers in ({}, bearer("wrong")):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(ws_url(server), additional_headers=headers).close()
        assert refused.value.response.status_code == 401
        assert b"UNAUTHORIZED" in refused.value.response.body
    with ws_connect(ws_url(server), additional_headers=bearer(KEY)) as ws:
        ws.send(frame("state"))
        assert json.loads(ws.recv())["type"] == "state"


def test_the_stock_openenv_client_plays_with_an_api_key_in_its_headers(
    server: ServerProcess,
) -> None:
    with MCPToolClient(base_url=server.base_url, headers=bearer(KEY)).sync() as env:
        reset = env.reset(task_id="t0_artifact")
        assert reset.observation.metadata["episode_id"].startswith("ep-")
        step = env.step(CallToolAction(tool_name="task_info", arguments={}))
        assert step.observation.result["data"]["max_steps"] == 100
        assert env.call_tool("jobs_status") == {"jobs": [], "total": 0, "next_cursor": None}
    with pytest.raises(Exception, match="401"):
        with MCPToolClient(base_url=server.base_url).sync() as env:
            env.reset(task_id="t0_artifact")


def test_the_episode_endpoint_takes_its_own_token_and_nothing_else(
    server: ServerProcess,
) -> None:
    mine, theirs = create_episode(server), create_episode(server)
    url = mine["mcp_url"]
    assert len(mine["episode_token"]) >= 32 and mine["episode_token"] != theirs["episode_token"]
    refusals = [
        {},  # no token
        {"Authorization": f"Bearer {mine['episode_token'][:-1]}"},  # malformed
        {"Authorization": f"Basic {mine['episode_token']}"},  # not a bearer token
        {"Authorization": "Bearer"},
        bearer(theirs["episode_token"]),  # another episode's token
        bearer(KEY),  # an API key opens no episode
    ]
    for headers in refusals:
        response = httpx.post(url, json=tool_call("task_info"), headers={**MCP_ACCEPT, **headers})
        assert response.status_code == 401, (headers, response.text)
        assert response.json()["detail"]["code"] == "UNAUTHORIZED"
    answered = httpx.post(
        url, json=tool_call("task_info"), headers={**MCP_ACCEPT, **bearer(mine["episode_token"])}
    )
    assert answered.status_code == 200 and sse_result(answered)["structuredContent"]["prompt"]
    # An id that cannot be an episode is not found, whatever the token (Temporal is not asked).
    for bad in ("ep-XYZ", "ep-0123", "episode", mine["episode_id"] + "0"):
        response = httpx.post(
            f"{server.base_url}/episodes/{bad}/mcp",
            json=tool_call("task_info"),
            headers={**MCP_ACCEPT, **bearer(mine["episode_token"])},
        )
        assert response.status_code == 404, bad
    assert server.wait_status(theirs["episode_id"]).steps_used == 0  # theirs was not touched


def test_a_real_host_name_from_allowed_hosts_reaches_the_mcp_endpoint(
    server: ServerProcess,
) -> None:
    host = {"Host": f"{HOST}:{server.port}"}
    episode = create_episode(server, **host)
    assert episode["mcp_url"] == f"http://{HOST}:{server.port}/episodes/{episode['episode_id']}/mcp"
    path = f"/episodes/{episode['episode_id']}/mcp"
    same_site = {"Origin": f"https://{HOST}"}
    answered = httpx.post(
        server.base_url + path,
        json=tool_call("list_hardware"),
        headers={**MCP_ACCEPT, **host, **same_site, **bearer(episode["episode_token"])},
    )
    assert answered.status_code == 200, answered.text
    assert sse_result(answered)["structuredContent"]["flavors"]
    foreign = httpx.post(
        server.base_url + path,
        json=tool_call("list_hardware"),
        headers={**MCP_ACCEPT, "Host": "rebound.example", **bearer(episode["episode_token"])},
    )
    assert foreign.status_code == 403


def test_neither_keys_nor_tokens_reach_the_log(server: ServerProcess) -> None:
    episode = create_episode(server)
    httpx.post(
        episode["mcp_url"],
        json=tool_call("task_info"),
        headers={**MCP_ACCEPT, **bearer(episode["episode_token"])},
    )
    line = f"/episodes/{episode['episode_id']}/mcp"  # written once the response is sent
    log = wait_until(
        lambda: text if line in (text := server.log_path.read_text()) else None,
        10,
        "the access log line",
    )
    assert KEY not in log and OTHER_KEY not in log and episode["episode_token"] not in log


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--host", "0.0.0.0"], {}, "refusing to bind 0.0.0.0"),
        (["--host", "192.0.2.1"], {}, "refusing to bind 192.0.2.1"),
        ([], {"POSTTRAIN_BACKEND": "hf", "HF_TOKEN": "hf_not_a_real_token"}, "hf backend"),
        # What falls through the replay runs on Hugging Face: it spends money too.
        (
            [],
            {
                "POSTTRAIN_BACKEND": "replay",
                "POSTTRAIN_REPLAY_INNER": "hf",
                "HF_TOKEN": "hf_not_a_real_token",
            },
            "replay backend",
        ),
    ],
)
def test_the_server_refuses_to_start_where_keys_are_required_and_missing(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    server = ServerProcess(tmp_path / "state", extra_env=env)
    done = subprocess.run(
        [*command(), "server", "--port", str(server.port), *args],
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=START_REFUSAL_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and "POSTTRAIN_API_KEYS" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (server.state_dir / "temporal.pid").exists()  # refused before anything started


def test_an_episodes_own_routes_take_its_token_even_where_api_keys_guard_the_rest(
    server: ServerProcess,
) -> None:
    """`GET`/`DELETE /episodes/<id>`, like its MCP endpoint: the token, never an API key."""
    episode = create_episode(server)
    url = f"{server.base_url}/episodes/{episode['episode_id']}"
    for headers in ({}, bearer(KEY), {"X-API-Key": KEY}):
        response = httpx.get(url, headers=headers, timeout=30)
        assert response.status_code == 401, (headers, response.text)
    seen = httpx.get(url, headers=bearer(episode["episode_token"]), timeout=30)
    assert seen.status_code == 200 and seen.json()["state"] == "running"
    ended = httpx.delete(url, headers=bearer(episode["episode_token"]), timeout=60)
    # The client ended it (as a rollout's agent that stops): `abandoned`, reward 0.
    assert ended.status_code == 200 and ended.json()["episode_end"]["reason"] == "abandoned"
