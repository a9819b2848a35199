"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, standing in for the LLM.

A script is a generator. What it yields is the answer to the next request; what it receives
back from `yield` is the `messages` of the request after it, so it reads the tool messages the
agent sent and plays on from them:

    def script() -> Script:
        messages = yield calls(("task_info", {}))
        [info] = tool_results(messages)
        ...

Every request is recorded as received (request line, headers, body), so a test can check what
left the agent. A failing assertion inside the script is recorded and answered with a 400, which the
agent does not retry; the test re-raises it with `check()`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


Script = Generator[Reply, list[dict[str, Any]], None]
_ids = itertools.count(1)


def _completion(message: dict[str, Any], finish_reason: str) -> Reply:
    return Reply(
        body={
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
    )


def calls(*tool_calls: tuple[str, dict[str, Any] | str]) -> Reply:
    """An assistant turn calling these tools; a `str` is sent as the raw arguments text."""
    return _completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{next(_ids)}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for name, args in tool_calls
            ],
        },
        "tool_calls",
    )


def text(content: str) -> Reply:
    """An assistant turn without tool calls."""
    return _completion({"role": "assistant", "content": content}, "stop")


def failure(status: int, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"error": {"message": f"scripted {status}"}}, headers or {})


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parsed `tool` messages answering the last assistant turn, in order."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return [json.loads(m["content"]) for m in messages[last + 1 :] if m["role"] == "tool"]


def _messages(body: bytes) -> list[dict[str, Any]] | AssertionError:
    """The request's `messages`, or what is wrong with the request."""
    try:
        messages = json.loads(body)["messages"]
    except (ValueError, KeyError, TypeError):
        return AssertionError(f"not a chat-completions request: {body[:200]!r}")
    return messages


@dataclass
class Seen:
    path: str
    head: str  # request line and headers, as received
    body: bytes
    authorization: str | None

    @property
    def raw(self) -> bytes:
        return self.head.encode() + self.body

    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class ScriptedLLM:
    """`with ScriptedLLM(script()) as llm:` serves `llm.base_url` (…/v1) from a thread."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._started = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def check(self) -> None:
        """Re-raise what went wrong inside the script, if anything did."""
        if self.error is not None:
            raise self.error

    def answer(self, messages: list[dict[str, Any]] | BaseException) -> Reply:
        with self._lock:
            if self.error is not None:
                return failure(400)
            if isinstance(messages, BaseException):
                self.error = messages
                return failure(400)
            try:
                if not self._started:
                    self._started = True
                    return next(self.script)
                return self.script.send(messages)
            except StopIteration:
                self.error = AssertionError("the agent asked again after the script ended")
            except Exception as exc:  # an assertion of the script, kept for the test
                self.error = exc
            return failure(400)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                head = f"{self.requestline}\r\n{self.headers}"
                llm.seen.append(Seen(self.path, head, body, self.headers.get("Authorization")))
                if self.path != "/v1/chat/completions":
                    reply = failure(404)
                else:
                    reply = llm.answer(_messages(body))
                payload = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        return Handler
