"""posttrain_env in TRL's GRPO, through TRL's own extension point for environments.

    from trl import GRPOConfig, GRPOTrainer
    from posttrain_env.training.trl_env import PostTrainTRL

    posttrain = PostTrainTRL("http://127.0.0.1:8000", sampler=my_sampler)
    trainer = GRPOTrainer(
        model=model,
        train_dataset=dataset,                      # a `prompt` column and a `task_id` column
        reward_funcs=posttrain.reward,              # the episode's reward, None kept
        environment_factory=posttrain.environment,  # one episode per rollout
        args=GRPOConfig(...),
    )

TRL (`GRPOTrainer(environment_factory=...)`, experimental in TRL 1.x) makes one environment per
rollout, calls its `reset(**row)` with the dataset row's columns, exposes its public methods as
the model's tools, runs the tool calls the model makes, then calls the reward functions with the
rollouts' `environments`. Here:

- `reset` starts an episode of the row's `task_id` (ending the instance's previous one if it is
  still live: TRL reuses instances) and returns the task's prompt;
- the tools are the environment's (`task_info`, `list_hardware`, `jobs_submit`, `jobs_wait`,
  `jobs_status`, `jobs_logs`, `jobs_cancel`, `dev_evaluate`, `submit`), their descriptions taken
  from the tool registry; each answers the tool's data as JSON (an error too, as data). A
  `job_id` left empty means the latest job the rollout submitted, so a policy need not copy ids;
- `reward` ends every episode the policy left running (`abandoned`, reward 0, as the service
  scores an agent that gives up; its jobs cancelled) and answers each rollout's reward: **None
  when the episode ended unscored**. TRL (from 1.6.0) excludes a completion for which every
  reward function answered None from its group's mean and standard deviation and gives it
  advantage 0; older TRL summed it as 0, so `PostTrainTRL` refuses them (`TRLVersionError`).
  Combine it only with reward functions that also answer None for such rollouts, or TRL scores
  the row with theirs.
- the cost of every rollout is logged beside its reward: `log_extra` columns `cost_<unit>`,
  `spend_final`, `end_reason`, `replayed`, `not_a_measurement` in TRL's completions table and
  `log_metric` metrics (`cost_<unit>/mean`, `rollouts/unscored`, `rollouts/replay_misses`,
  `rollouts/orphans`), and the rollouts reach the sampler through a `SamplerBridge` (RFC 013
  `update(task, rewards, costs)`, None kept).
- a rollout that is **not a measurement** (`replay_miss`: the replay backend had no recording
  of an evaluation the policy asked for) answers None as an unscored one does, so TRL leaves it
  out of the baseline; it is logged as a warning and counted apart (`rollouts/replay_misses`),
  never in `rollouts/unscored`: a drifted evaluator or tasks folder shows at once.

Nothing here imports TRL: the environment is plain Python, as TRL asks.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from importlib import metadata as importlib_metadata
from typing import Any, Protocol

from posttrain_env.openenv_light import load as load_openenv

load_openenv()  # before the first import of openenv: without its Gradio web UI

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402

from posttrain_env.client import PostTrainEnv  # noqa: E402
from posttrain_env.tools import TOOLS  # noqa: E402
from posttrain_env.training.outcome import RolloutOutcome  # noqa: E402
from posttrain_env.training.sampler import (  # noqa: E402
    CostUnit,
    SamplerBridge,
    TaskSampler,
    UnscoredPolicy,
    cost_of,
)

log = logging.getLogger(__name__)
# The first TRL whose GRPO leaves a completion every reward function answered None for out of
# its group's baseline (huggingface/trl#5902); before it, None was summed as 0.
MIN_TRL = (1, 6)
DEFAULT_MESSAGE_TIMEOUT_S = 3600.0


class TRLVersionError(RuntimeError):
    """The installed TRL would score an unscored rollout 0."""


class LogExtra(Protocol):
    def __call__(self, column: str, values: list[Any]) -> None: ...


class LogMetric(Protocol):
    def __call__(self, name: str, value: float) -> None: ...


def check_trl_version(version: str | None = None) -> None:
    """Raise TRLVersionError when TRL (the installed one, or `version`) is older than 1.6.0.
    Nothing to check when TRL is not installed."""
    if version is None:
        try:
            version = importlib_metadata.version("trl")
        except importlib_metadata.PackageNotFoundError:
            return
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) < MIN_TRL:
        raise TRLVersionError(
            f"TRL {version} scores a completion without reward as 0; posttrain_env needs TRL "
            f">= {MIN_TRL[0]}.{MIN_TRL[1]}.0, which leaves it out of the group baseline"
        )


class PostTrainTRL:
    """The environment factory and the reward function for one `GRPOTrainer`.

    `base_url`: the gateway. `task_id`: the task when the dataset has no `task_id` column.
    `sampler`, `cost_unit`, `unscored`: as `SamplerBridge`'s. `headers`: sent with every request
    (an API key). Every rollout's outcome is kept in `outcomes`, in the order rewarded."""

    def __init__(
        self,
        base_url: str,
        *,
        task_id: str | None = None,
        sampler: TaskSampler | None = None,
        cost_unit: CostUnit | Callable[[RolloutOutcome], float] = "usd",
        unscored: UnscoredPolicy = "keep",
        headers: dict[str, str] | None = None,
        message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S,
    ) -> None:
        check_trl_version()
        self.base_url = base_url
        self.task_id = task_id
        self.headers = headers
        self.message_timeout_s = message_timeout_s
        self.bridge = SamplerBridge(sampler, cost_unit=cost_unit, unscored=unscored)
        self.outcomes: list[RolloutOutcome] = []
        self._environments: list[PostTrainTRLEnv] = []

    @property
    def cost_column(self) -> str:
        unit = self.bridge.cost_unit
        return f"cost_{unit if isinstance(unit, str) else 'custom'}"

    def environment(self) -> PostTrainTRLEnv:
        """TRL's `environment_factory`: a new environment (TRL makes one per rollout)."""
        env = PostTrainTRLEnv(self)
        self._environments.append(env)
        return env

    def reward(
        self,
        environments: Sequence[PostTrainTRLEnv] | None = None,
        log_extra: LogExtra | None = None,
        log_metric: LogMetric | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        """TRL's reward function: each rollout's reward, None when its episode ended unscored.
        Ends the episodes the policy left running, logs every rollout's cost beside its reward
        and updates the sampler. Raises ValueError when TRL passes no environments."""
        del kwargs  # prompts, completions, the dataset's columns, the trainer's state
        if not environments:
            raise ValueError("no environments: pass posttrain.environment as environment_factory")
        outcomes = [env._finish() for env in environments]
        self.outcomes += outcomes
        self.bridge.update(outcomes)
        costs = [cost_of(o, self.bridge.cost_unit) for o in outcomes]
        for outcome, cost in zip(outcomes, costs, strict=True):
            log.info(
                "rollout %s task %s: reward %s, %s %.6f (final %s), end %s",
                outcome.episode_id,
                outcome.task_id,
                outcome.reward,
                self.cost_column,
                cost,
                not outcome.orphan,
                outcome.end.reason.value if outcome.end else "never seen",
            )
        if log_extra is not None:
            log_extra(self.cost_column, costs)
            log_extra("spend_final", [not o.orphan for o in outcomes])
            log_extra("end_reason", [o.end.reason.value if o.end else None for o in outcomes])
            log_extra("replayed", [o.replayed for o in outcomes])
            log_extra("not_a_measurement", [o.not_a_measurement for o in outcomes])
        if log_metric is not None:
            log_metric(f"{self.cost_column}/mean", sum(costs) / len(costs))
            unscored = sum(not o.scored and not o.not_a_measurement for o in outcomes)
            log_metric("rollouts/unscored", float(unscored))
            log_metric("rollouts/replay_misses", float(sum(o.not_a_measurement for o in outcomes)))
            log_metric("rollouts/orphans", float(sum(o.orphan for o in outcomes)))
        return [o.reward for o in outcomes]

    def close(self) -> None:
        """End every episode still live and close the connections."""
        for env in self._environments:
            env._close()
        self._environments.clear()


class PostTrainTRLEnv:
    """One rollout's environment. Its public methods are the model's tools (TRL reads their
    names, type hints and docstrings); everything else is private on purpose."""

    def __init__(self, owner: PostTrainTRL) -> None:
        self._owner = owner
        client = PostTrainEnv(
            base_url=owner.base_url,
            message_timeout_s=owner.message_timeout_s,
            headers=owner.headers,
        )
        self._episodes = client  # the async client: which episode is current
        self._client = client.sync()
        self._task_id: str | None = None
        self._started = 0.0
        self._service_s = 0.0  # time spent in this rollout's calls to the service
        self._outcome: RolloutOutcome | None = None
        self._latest_job: str | None = None

    def reset(self, **kwargs: Any) -> str | None:
        """Start an episode of the row's `task_id`; the task's prompt."""
        self._finish_if_live()
        task_id = kwargs.get("task_id") or self._owner.task_id
        if not task_id:
            raise ValueError("no task: give the dataset a task_id column or PostTrainTRL(task_id=)")
        self._task_id = str(task_id)
        self._outcome = None
        self._latest_job = None
        self._started = time.monotonic()
        self._service_s = 0.0
        result = self._timed(self._client.reset, task_id=self._task_id)
        prompt = result.observation.metadata.get("prompt")
        return prompt if isinstance(prompt, str) else None

    # -- the tools (their docstrings come from the tool registry, below) ------------------------

    def task_info(self) -> str:
        return self._call("task_info", {})

    def list_hardware(self) -> str:
        return self._call("list_hardware", {})

    def jobs_submit(
        self,
        script: str,
        flavor: str,
        timeout_minutes: int,
        dependencies: list[str] | None = None,
        datasets: list[str] | None = None,
    ) -> str:
        arguments: dict[str, Any] = {
            "script": script,
            "flavor": flavor,
            "timeout_minutes": timeout_minutes,
            "dependencies": dependencies or [],
            "datasets": datasets or [],
        }
        return self._call("jobs_submit", arguments)

    def jobs_wait(self, job_id: str = "", timeout_s: int = 300) -> str:
        return self._call("jobs_wait", {"job_id": self._job(job_id), "timeout_s": timeout_s})

    def jobs_status(self, job_id: str = "") -> str:
        return self._call("jobs_status", {"job_id": self._job(job_id)})

    def jobs_logs(self, job_id: str = "", tail: int = 200) -> str:
        return self._call("jobs_logs", {"job_id": self._job(job_id), "tail": tail})

    def jobs_cancel(self, job_id: str = "") -> str:
        return self._call("jobs_cancel", {"job_id": self._job(job_id)})

    def dev_evaluate(self, job_id: str = "") -> str:
        return self._call("dev_evaluate", {"job_id": self._job(job_id)})

    def submit(self, job_id: str = "") -> str:
        return self._call("submit", {"job_id": self._job(job_id)})

    # -- private -------------------------------------------------------------------------------

    def _job(self, job_id: str) -> str:
        if job_id:
            return job_id
        if self._latest_job is None:
            raise ValueError("no job yet: call jobs_submit first, or name a job_id")
        return self._latest_job

    def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        """One step; the tool's data as JSON. Raises ValueError once the episode is over (TRL
        answers the model with the message)."""
        if self._outcome is not None or self._task_id is None:
            raise ValueError("the episode is over: no more tool calls")
        step = self._timed(self._client.step, CallToolAction(tool_name=tool, arguments=arguments))
        body = getattr(step.observation, "result", None)
        data = body.get("data") if isinstance(body, dict) else None
        if tool == "jobs_submit" and isinstance(data, dict) and "job_id" in data:
            self._latest_job = str(data["job_id"])
        if step.done:
            self._outcome = RolloutOutcome.from_answer(
                self._task_id,
                step.observation.metadata or {},
                latency_s=time.monotonic() - self._started,
                service_s=self._service_s,
            )
        return json.dumps(data)

    def _timed(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            self._service_s += time.monotonic() - started

    def _finish(self) -> RolloutOutcome:
        """The rollout's outcome, ending its episode first when the policy left it running."""
        self._finish_if_live()
        if self._outcome is None:
            raise RuntimeError("finish before any reset: TRL rewards only environments it reset")
        return self._outcome

    def _finish_if_live(self) -> None:
        if self._task_id is None or self._outcome is not None:
            return
        answer = self._timed(self._client.end_episode)
        self._outcome = RolloutOutcome.from_answer(
            self._task_id,
            answer,
            episode_id=self._episodes.episode_id,
            latency_s=time.monotonic() - self._started,
            service_s=self._service_s,
        )

    def _close(self) -> None:
        try:
            self._finish_if_live()
        finally:
            self._client.close()


def _docstring(tool: str, args: dict[str, str] | None = None) -> str:
    """A Google-style docstring (what TRL turns into the tool's schema) from the registry."""
    entry = TOOLS[tool]
    lines = [entry.description, ""]
    fields = entry.args.model_fields
    described = {
        name: (args or {}).get(name) or (fields[name].description if name in fields else None)
        for name in (args or {})
    }
    if described:
        lines.append("Args:")
        lines += [f"    {name}: {text or name}" for name, text in described.items()]
        lines.append("")
    lines += ["Returns:", "    The tool's answer as JSON (an error is answered as data)."]
    return "\n".join(lines)


_LATEST = "The job id from jobs_submit; empty: the latest job you submitted."
PostTrainTRLEnv.task_info.__doc__ = _docstring("task_info")
PostTrainTRLEnv.list_hardware.__doc__ = _docstring("list_hardware")
PostTrainTRLEnv.jobs_submit.__doc__ = _docstring(
    "jobs_submit",
    {"script": "", "flavor": "", "timeout_minutes": "", "dependencies": "", "datasets": ""},
)
PostTrainTRLEnv.jobs_wait.__doc__ = _docstring("jobs_wait", {"job_id": _LATEST, "timeout_s": ""})
PostTrainTRLEnv.jobs_status.__doc__ = _docstring("jobs_status", {"job_id": _LATEST})
PostTrainTRLEnv.jobs_logs.__doc__ = _docstring("jobs_logs", {"job_id": _LATEST, "tail": ""})
PostTrainTRLEnv.jobs_cancel.__doc__ = _docstring("jobs_cancel", {"job_id": _LATEST})
PostTrainTRLEnv.dev_evaluate.__doc__ = _docstring("dev_evaluate", {"job_id": _LATEST})
PostTrainTRLEnv.submit.__doc__ = _docstring("submit", {"job_id": _LATEST})
