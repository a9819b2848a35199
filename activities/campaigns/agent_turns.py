"""Agent turns, each in a process of its own (the agent worker's activities).

Registered only by `posttrain-env agent-worker`, on the agent task queue: a process that holds
no broker token and cannot read the server key (it refuses to start otherwise). Each turn runs
`python -m posttrain_env.agents.runner` in an empty folder with an environment of the basics and
the agent's own key, and nothing else; it reads the conversation on standard input and answers
its turn on standard output. The turn is stored before the activity returns, so a turn retried
after a crash is answered from the store and the agent (and its LLM) is not asked twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.campaigns.store import CampaignStore, StoredTurn
from posttrain_common.contracts.activities import AgentsApi
from posttrain_common.contracts.campaigns import AgentTurn, CheckAgents, TurnSummary
from posttrain_common.failures import agent_failure
from posttrain_env.agents.runner import TurnReply, TurnRequest
from posttrain_env.errors import AGENT_FAILED, AGENT_INVALID
from posttrain_env.limits import MAX_AGENT_TURN_BYTES, cut_text

# What a turn's process gets of the worker's environment, besides the agent's own key.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR")
HEARTBEAT_S = 5.0
CHECK_TIMEOUT_S = 120.0
PR_SET_PDEATHSIG = 1


def _die_with_worker() -> None:  # in the child, between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class AgentTurnActivities(AgentsApi):
    def __init__(
        self, store: CampaignStore, environ: Mapping[str, str], python: str = sys.executable
    ) -> None:
        self._store = store
        self._environ = dict(environ)
        self._python = python

    @activity.defn
    async def agent_turn(self, turn: AgentTurn) -> TurnSummary:
        store, campaign = self._store, turn.campaign_id
        stored = await asyncio.to_thread(store.load_turn, campaign, turn.attempt_key, turn.number)
        if stored is None:
            conversation = await asyncio.to_thread(store.conversation, campaign, turn.conversation)
            request = TurnRequest(
                kind=turn.agent.agent,
                args=turn.agent.args,
                api_key_env=turn.agent.api_key_env,
                conversation=conversation,
            )
            reply = await self._run(request, float(turn.agent.turn_timeout_s))
            if reply.turn is None:
                raise agent_failure(AGENT_FAILED, "the agent answered no turn", non_retryable=False)
            messages = [*reply.turn.exchanged, reply.turn.message()]
            head = await asyncio.to_thread(store.extend, campaign, turn.conversation, messages)
            stored = StoredTurn(turn=reply.turn, conversation=head)
            await asyncio.to_thread(
                store.save_turn, campaign, turn.attempt_key, turn.number, stored
            )
        done = stored.turn
        return TurnSummary(
            kind=done.kind,
            calls=len(done.calls),
            tools=[call.tool[:64] for call in done.calls],
            usage=done.usage,
            conversation=stored.conversation,
        )

    @activity.defn
    async def check_agents(self, check: CheckAgents) -> None:
        for agent in check.agents:
            request = TurnRequest(kind=agent.agent, args=agent.args, api_key_env=agent.api_key_env)
            try:
                await self._run(request, CHECK_TIMEOUT_S)
            except ApplicationError as err:
                raise agent_failure(AGENT_INVALID, f"agent {agent.name!r}: {err.message}") from None

    # -- the turn's process --------------------------------------------------------------------

    def _env(self, request: TurnRequest, home: str) -> dict[str, str]:
        env = {name: self._environ[name] for name in PASSED_ENV if name in self._environ}
        env.update({"HOME": home, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
        name = request.api_key_env
        if name is not None:
            if not self._environ.get(name):
                raise agent_failure(
                    AGENT_INVALID,
                    f"the agent worker has no {name} set: the agent's key is read from it",
                )
            env[name] = self._environ[name]
        return env

    def _key(self, request: TurnRequest) -> str | None:
        return self._environ.get(request.api_key_env) if request.api_key_env else None

    async def _run(self, request: TurnRequest, timeout_s: float) -> TurnReply:
        """Run the turn's process. Raises ApplicationError (agent_invalid, agent_failed)."""
        with tempfile.TemporaryDirectory(prefix="posttrain-agent-") as home:
            stderr_path = Path(home) / ".stderr"
            with stderr_path.open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    self._python,
                    "-m",
                    "posttrain_env.agents.runner",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    cwd=home,
                    env=self._env(request, home),
                    preexec_fn=_die_with_worker,
                )
                try:
                    out = await self._communicate(proc, request, timeout_s)
                finally:
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        await proc.wait()
            err_tail = stderr_path.read_bytes()[-2000:].decode("utf-8", "replace")
        key = self._key(request)
        if key:
            err_tail = err_tail.replace(key, "<key>")
        try:
            reply = TurnReply.model_validate_json(out.strip().splitlines()[-1] if out else b"")
        except (ValueError, IndexError):
            raise agent_failure(
                AGENT_FAILED,
                cut_text(f"the agent's process ended {proc.returncode} without a turn: {err_tail}"),
            ) from None
        if reply.error is not None:
            raise agent_failure(reply.error.type, reply.error.message)
        return reply

    async def _communicate(
        self, proc: asyncio.subprocess.Process, request: TurnRequest, timeout_s: float
    ) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(request.model_dump_json().encode())
        await proc.stdin.drain()
        proc.stdin.close()
        reading = asyncio.ensure_future(_read_capped(proc.stdout, MAX_AGENT_TURN_BYTES + 1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not reading.done():
            if loop.time() > deadline:
                reading.cancel()
                raise agent_failure(
                    AGENT_FAILED,
                    f"the agent's turn took longer than {timeout_s:.0f} s (turn_timeout_s)",
                )
            await asyncio.wait([reading], timeout=HEARTBEAT_S)
            # Only while the turn still runs: a beat after it is a server write for nothing.
            if not reading.done() and activity.in_activity():
                activity.heartbeat()
        out = reading.result()
        if len(out) > MAX_AGENT_TURN_BYTES:
            raise agent_failure(
                AGENT_FAILED, f"the agent's turn is over {MAX_AGENT_TURN_BYTES} bytes"
            )
        await proc.wait()
        return out


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    """Everything up to end of file, or the first `cap` bytes and more. A single `read(cap)`
    would return what one pipe buffer holds (64 KiB) and leave a larger turn unread, its
    process blocked on writing the rest."""
    chunks: list[bytes] = []
    total = 0
    while total < cap:
        chunk = await stream.read(cap - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
