"""A campaign spec (TOML): tasks x agents x epochs, how many in flight, the dollar budget.

    name = "smoke"
    tasks = ["t0_artifact"]
    epochs = 3
    concurrency = 4
    budget_usd = 2.0

    [retry]                 # a rollout whose attempt failed for infrastructure reasons
    max_attempts = 3

    [[agents]]
    name = "reference"
    agent = "reference"     # built in: scripted, reference, openai; or `package.module:Class`
    args = { timeout_minutes = 5 }

    [[agents]]
    name = "gpt-oss"
    agent = "openai"
    api_key_env = "AGENT_API_KEY"   # the variable the agent worker reads; never the key itself
    args = { model = "openai/gpt-oss-120b" }
    llm_cap_usd = 0.50
    prices = { input_usd_per_mtok = 0.15, output_usd_per_mtok = 0.60 }

What can be checked without the server's tasks is checked here (`load_spec`); the tasks and the
budget against their worst cases are checked by `activities.campaigns.activities.check_tasks`, both
by the
CLI before anything starts and again by the campaign's first activity.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from posttrain_env.agents.registry import AgentSpecError, check_kind
from posttrain_env.limits import (
    MAX_AGENT_ARGS_BYTES,
    MAX_AGENT_TURNS,
    MAX_CAMPAIGN_AGENTS,
    MAX_CAMPAIGN_ROLLOUTS,
    MAX_CAMPAIGN_SPEC_BYTES,
    MAX_CAMPAIGN_TASK_ID_CHARS,
    MAX_CAMPAIGN_TASKS,
    MAX_CONCURRENCY,
    cut_text,
)
from posttrain_env.models import MICRO

NAME = r"^[a-z0-9][a-z0-9_-]{0,39}$"
CAMPAIGN_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# The broker's token may never be an agent's key.
BROKER_TOKEN_ENV = "HF_TOKEN"
# Names of settings that hold secrets, and the shapes of well-known keys: none may be written
# in a spec (a spec travels into workflow history and into the campaign's folder).
_SECRET_NAME = re.compile(r"(^|_)(api_?key|key|token|secret|password|passwd|bearer)$", re.I)
_SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|sk_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|xox[abp]-[A-Za-z0-9-]{10,}|AKIA[A-Z0-9]{16}|Bearer\s+\S+)",
)


class SpecError(ValueError):
    """A spec that cannot run; the message names the field and what to change."""


class PriceTable(BaseModel):
    """What the agent's LLM charges, in USD per million tokens (its own, not the environment's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float = Field(default=0.0, ge=0)
    output_usd_per_mtok: float = Field(default=0.0, ge=0)

    def cost_micro_usd(self, prompt_tokens: int, completion_tokens: int) -> int:
        # USD per Mtok times tokens is micro-USD; a started micro-dollar is charged.
        raw = prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok
        return math.ceil(round(raw, 6))


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME)
    agent: str
    args: dict[str, Any] = Field(default_factory=dict)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    # The agent's own LLM spend per rollout; passing it ends the rollout (abandoned).
    llm_cap_usd: float = Field(default=0.0, ge=0)
    prices: PriceTable = Field(default_factory=PriceTable)
    max_turns: int = Field(default=200, gt=0, le=MAX_AGENT_TURNS)
    # One turn (an LLM reply, retries included) may take this long before it is retried.
    turn_timeout_s: int = Field(default=600, gt=0, le=3600)

    @field_validator("agent")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        try:
            check_kind(kind)
        except AgentSpecError as exc:
            raise ValueError(str(exc)) from None
        return kind

    @field_validator("api_key_env")
    @classmethod
    def _not_the_brokers(cls, name: str | None) -> str | None:
        if name == BROKER_TOKEN_ENV:
            raise ValueError(
                f"{BROKER_TOKEN_ENV} is the broker's token: give the agent a key of its own"
            )
        return name

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(args))
        if size > MAX_AGENT_ARGS_BYTES:
            raise ValueError(
                f"the arguments take {size} bytes as JSON; at most {MAX_AGENT_ARGS_BYTES} "
                "(they travel with every rollout)"
            )
        return args

    @property
    def llm_cap_micro_usd(self) -> int:
        return round(self.llm_cap_usd * MICRO)

    def view(self) -> dict[str, Any]:
        """As records name the agent: no key (there is none in a spec), its variable's name."""
        return {"name": self.name, "agent": self.agent, "args": self.args}


class RetrySpec(BaseModel):
    """A new attempt for a rollout whose attempt ended as an infrastructure `error`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=3, ge=1, le=10)
    # Error types never retried (retrying cannot fix them).
    non_retryable: list[str] = Field(default_factory=lambda: ["agent_invalid"])
    backoff_s: float = Field(default=30.0, ge=0)


class CampaignSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="campaign", pattern=NAME)
    tasks: list[str] = Field(min_length=1, max_length=MAX_CAMPAIGN_TASKS)
    agents: list[AgentSpec] = Field(min_length=1, max_length=MAX_CAMPAIGN_AGENTS)
    epochs: int = Field(default=1, ge=1)
    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENCY)
    budget_usd: float = Field(gt=0)
    retry: RetrySpec = Field(default_factory=RetrySpec)

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("tasks: a task is named twice")
        names = [agent.name for agent in self.agents]
        if len(set(names)) != len(names):
            raise ValueError("agents: two agents have the same name")
        total = len(self.tasks) * len(self.agents) * self.epochs
        if total > MAX_CAMPAIGN_ROLLOUTS:
            raise ValueError(
                f"{total} rollouts (tasks x agents x epochs); a campaign runs at most "
                f"{MAX_CAMPAIGN_ROLLOUTS}"
            )
        return self

    @property
    def budget_micro_usd(self) -> int:
        return round(self.budget_usd * MICRO)

    @property
    def rollouts(self) -> int:
        return len(self.tasks) * len(self.agents) * self.epochs


def secrets_in(value: Any, where: str = "") -> list[str]:
    """Where in `value` something is, or looks like, a secret (a key written in the spec)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{where}.{key}" if where else str(key)
            if key != "api_key_env" and _SECRET_NAME.search(str(key)) and item not in (None, ""):
                found.append(here)
            else:
                found += secrets_in(item, here)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += secrets_in(item, f"{where}[{index}]")
    elif isinstance(value, str) and _SECRET_VALUE.match(value.strip()):
        found.append(where)
    return found


def parse_spec(data: dict[str, Any], **overrides: Any) -> CampaignSpec:
    """Validate a spec's data (flags in `overrides` win). Raises SpecError."""
    leaks = secrets_in(data)
    if leaks:
        raise SpecError(
            f"the spec holds what looks like a secret at {', '.join(leaks)}: never write a key "
            "in a spec; name the variable that holds it with `api_key_env` (the agent worker "
            "reads it)"
        )
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise SpecError(problems) from None
    check_carried_size(spec)
    return spec


def check_carried_size(spec: CampaignSpec) -> None:
    """Raise SpecError unless the spec keeps the campaign's carry bounded: the spec travels in
    it whole, and its task ids in every rollout id (the in-flight set's keys). Checked where a
    spec is read, not on the model, so that campaigns started before these limits still decode."""
    long_ids = [t for t in spec.tasks if len(t) > MAX_CAMPAIGN_TASK_ID_CHARS]
    if long_ids:
        raise SpecError(
            f"tasks: {cut_text(long_ids[0], 100)!r} is longer than {MAX_CAMPAIGN_TASK_ID_CHARS} "
            "characters; a campaign's task ids are part of every rollout id"
        )
    size = len(spec.model_dump_json().encode())
    if size > MAX_CAMPAIGN_SPEC_BYTES:
        raise SpecError(
            f"the spec takes {size} bytes as JSON; a campaign's spec may take at most "
            f"{MAX_CAMPAIGN_SPEC_BYTES} (it travels with the campaign's state): give agents "
            "shorter arguments"
        )


def load_spec(path: Path, **overrides: Any) -> CampaignSpec:
    """Read and validate a spec file. Raises SpecError naming the file and the field."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_spec(data, **overrides)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def _describe(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown key"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{field}: {message}"
