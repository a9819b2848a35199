"""One session played through two gateways: each call goes to the other gateway than the one
before (a load balancer's round robin), by a `PostTrainEnv` bound to that gateway and to the
session, so a dropped connection or a restarted gateway is ridden out as `PostTrainEnv` does
(it reconnects to its gateway and re-sends with the same request id). Every call carries a
request id of the harness's own, so the call around a kill can be sent again afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Observation

from posttrain_env import PostTrainEnv

# The longest call a play makes is a jobs_wait of WAIT_S or a grading of a few seconds; a kill
# adds a restart (up to ~30 s on a loaded machine) and the client's backoff (at most 5 s).
WAIT_S = 30
MESSAGE_TIMEOUT_S = 240.0
RECONNECT_TIMEOUT_S = 240.0


class KillPointMissed(AssertionError):
    """The call ended before the point the cell kills at was reached."""


class OnSession(PostTrainEnv):
    """A PostTrainEnv on a session made elsewhere (by another gateway): it never creates one,
    and its close leaves the session alone (only `Player.close_session` ends it)."""

    def __init__(self, base_url: str, session_id: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._given_session = session_id

    async def _ensure_production_session(self) -> str:
        return self._given_session


@dataclass
class Answer:
    """One call and its answer."""

    n: int
    gateway: int
    tool: str  # "reset" for a reset
    arguments: dict[str, Any]
    request_id: str
    result: StepResult[Observation]
    sent_at: float
    answered_at: float

    @property
    def data(self) -> dict[str, Any]:
        result = getattr(self.result.observation, "result", None) or {}
        return result.get("data") or {}

    @property
    def episode_id(self) -> str:
        return str(self.result.observation.metadata.get("episode_id"))

    def same_as(self, other: Answer) -> bool:
        """The same answer: the tool's result, reward and end (a reset: the same episode)."""
        if self.tool == "reset":
            return self.episode_id == other.episode_id
        mine = getattr(self.result.observation, "result", None)
        theirs = getattr(other.result.observation, "result", None)
        return (mine, self.result.reward, self.result.done) == (
            theirs,
            other.result.reward,
            other.result.done,
        )


Strike = Callable[[int], Awaitable[None]]


@dataclass
class Player:
    urls: tuple[str, str]
    session_id: str
    cell: str  # names the request ids, so that a request id is never reused across cells
    answers: list[Answer] = field(default_factory=list)
    clients: list[OnSession] = field(default_factory=list)

    @classmethod
    async def open(cls, urls: tuple[str, str], cell: str) -> Player:
        session_id = await create_session(urls[0])
        player = cls(urls, session_id, cell)
        for url in urls:
            client = OnSession(
                url,
                session_id,
                message_timeout_s=MESSAGE_TIMEOUT_S,
                reconnect_timeout_s=RECONNECT_TIMEOUT_S,
            )
            await client.__aenter__()
            player.clients.append(client)
        return player

    async def aclose(self) -> None:
        for client in self.clients:
            await client.close()

    @property
    def next_gateway(self) -> int:
        return len(self.answers) % 2

    def steps_of(self, episode_id: str) -> int:
        """Tool calls sent in `episode_id` (each a step: no call of a play is sent twice but
        by the client's own re-send, which is the same request)."""
        return sum(1 for a in self.answers if a.tool != "reset" and a.episode_id == episode_id)

    async def reset(
        self,
        task_id: str,
        *,
        kill_when: Callable[[], Awaitable[bool]] | None = None,
        strike: Strike | None = None,
    ) -> Answer:
        n, gateway = len(self.answers), self.next_gateway
        request_id = f"{self.cell}-{n}-reset"
        client = self.clients[gateway]
        send = client.reset(task_id=task_id, request_id=request_id)
        return await self._answer(
            n, gateway, "reset", {"task_id": task_id}, request_id, send, kill_when, strike
        )

    async def call(
        self,
        tool: str,
        *,
        kill_when: Callable[[], Awaitable[bool]] | None = None,
        strike: Strike | None = None,
        **arguments: Any,
    ) -> Answer:
        n, gateway = len(self.answers), self.next_gateway
        request_id = f"{self.cell}-{n}-{tool}"
        action = CallToolAction(
            tool_name=tool, arguments=arguments, metadata={"request_id": request_id}
        )
        send = self.clients[gateway].step(action)
        return await self._answer(n, gateway, tool, arguments, request_id, send, kill_when, strike)

    async def _answer(
        self,
        n: int,
        gateway: int,
        tool: str,
        arguments: dict[str, Any],
        request_id: str,
        send: Awaitable[StepResult[Observation]],
        kill_when: Callable[[], Awaitable[bool]] | None,
        strike: Strike | None,
    ) -> Answer:
        sent = time.monotonic()
        call = asyncio.ensure_future(send)
        if kill_when is not None:
            assert strike is not None
            while not call.done():
                if await kill_when():
                    await strike(gateway)
                    break
                await asyncio.wait({call}, timeout=0.1)
            else:
                await call  # raises what the call raised
                raise KillPointMissed(f"{tool} was answered before the kill point")
        result = await call
        answer = Answer(n, gateway, tool, arguments, request_id, result, sent, time.monotonic())
        self.answers.append(answer)
        return answer

    async def send_again(self, answer: Answer) -> Answer:
        """`answer`'s request again, with its request id, through the other gateway."""
        gateway = 1 - answer.gateway
        client = self.clients[gateway]
        sent = time.monotonic()
        if answer.tool == "reset":
            result = await client.reset(**answer.arguments, request_id=answer.request_id)
        else:
            action = CallToolAction(
                tool_name=answer.tool,
                arguments=answer.arguments,
                metadata={"request_id": answer.request_id},
            )
            result = await client.step(action)
        return Answer(
            answer.n,
            gateway,
            answer.tool,
            answer.arguments,
            answer.request_id,
            result,
            sent,
            time.monotonic(),
        )

    async def wait_ended(self, job_id: str) -> Answer:
        """`jobs_wait` until the job leaves queued/running: the last answer."""
        while True:
            waited = await self.call("jobs_wait", job_id=job_id, timeout_s=WAIT_S)
            if waited.data.get("state") not in ("queued", "running"):
                return waited

    async def close_session(self) -> None:
        """End the session (`openenv/session/close`): its live episode ends `cancelled`."""
        await mcp_request(
            self.urls[self.next_gateway], "openenv/session/close", {"session_id": self.session_id}
        )


async def mcp_request(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC request to a gateway's `POST /mcp`, sent again while the gateway is away."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    deadline = time.monotonic() + RECONNECT_TIMEOUT_S
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        while True:
            try:
                response = await http.post(f"{url}/mcp", json=body)
                if response.status_code < 500:
                    response.raise_for_status()
                    return response.json()
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer {method}")
            await asyncio.sleep(0.5)


async def create_session(url: str) -> str:
    reply = await mcp_request(url, "openenv/session/create", {})
    return reply["result"]["session_id"]
