"""Agents by name: the built-in ones, or any `module:attr` (a class or factory called with the
spec's `args`, returning an object with `async act(conversation) -> Turn`)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any, cast

from posttrain_env.agents.conversation import Agent, AgentError

BUILTIN = {
    "scripted": "posttrain_env.agents.scripted:ScriptedAgent",
    # In `tasks/`, which holds the reference solutions (the agents package sits below it).
    "reference": "tasks.reference_agent:ReferenceAgent",
    "openai": "posttrain_env.agents.openai_agent:OpenAIAgent",
}
# `package.module:Attr` (dotted module path, one attribute name).
TARGET = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class AgentSpecError(ValueError):
    """An agent that cannot be named or built: the message says what to change."""


def check_kind(kind: str) -> None:
    """Raise AgentSpecError unless `kind` is a built-in name or `module:attr` (no import)."""
    if kind not in BUILTIN and not TARGET.fullmatch(kind):
        raise AgentSpecError(
            f"unknown agent {kind!r}: use one of {', '.join(sorted(BUILTIN))}, or name your own "
            "as `package.module:Class`"
        )


def load(kind: str) -> Callable[..., Any]:
    """The class or factory `kind` names. Raises AgentSpecError."""
    check_kind(kind)
    module_name, _, attr = BUILTIN.get(kind, kind).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentSpecError(f"agent {kind!r}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise AgentSpecError(f"agent {kind!r}: {module_name} has no callable {attr!r}")
    return factory


def build(kind: str, args: dict[str, Any], api_key: str | None = None) -> Agent:
    """The agent `kind` names, built with `args` (and `api_key`, when the spec names one).
    Raises AgentSpecError for arguments it does not take; AgentError as the agent raises."""
    factory = load(kind)
    kwargs = dict(args)
    if api_key is not None:
        kwargs["api_key"] = api_key
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise AgentSpecError(f"agent {kind!r}: {exc}") from None
    except ValueError:
        pass  # no signature to check (a builtin or C callable): let the call say
    try:
        agent = factory(**kwargs)
    except AgentError:
        raise
    except (TypeError, ValueError) as exc:
        raise AgentSpecError(f"agent {kind!r}: {exc}") from None
    if not callable(getattr(agent, "act", None)):
        raise AgentSpecError(f"agent {kind!r} has no `act(conversation)` method")
    return cast(Agent, agent)
