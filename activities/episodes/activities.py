"""Activities that set episodes up and keep the server-wide caps (task specs, prices, account)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from temporalio import activity

from activities.backends.interface import JobsBackend, known_run_source
from activities.ports import ServerAccount
from posttrain_common.contracts.activities import EpisodesApi
from posttrain_common.contracts.episodes import (
    Caps,
    EpisodeSetup,
    JobLimits,
    PrepareEpisode,
    ServerSpend,
    StorageTerms,
)
from posttrain_common.contracts.jobs import RepoRef
from posttrain_common.failures import agent_errors
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import CONTINUE_AS_NEW_HISTORY_BYTES, STORAGE_USD_PER_TB_MONTH
from posttrain_env.models import MICRO, TaskSpec
from tasks.registry import (
    TaskSpecError,
    fetch_command,
    load_task,
    missing_evaluation_files,
    missing_test_items,
)

# The setting that lets a task without its contamination items run (posttrain_common/settings.py).
ACCEPT_UNCHECKED_SETTING = "POSTTRAIN_ACCEPT_UNCHECKED_REWARDS"


class EpisodeConfig(BaseModel):
    """Server settings that episodes need, handed to the activities at worker start."""

    tasks_dir: Path
    watcher_workflow_id: str
    watch_shards: int = 1
    account_workflow_id: str
    cancel_confirm_s: int = 120
    max_live_episodes: int | None = None
    spend_cap_micro_usd: int | None = None
    continue_as_new_events: int | None = None
    continue_as_new_bytes: int = CONTINUE_AS_NEW_HISTORY_BYTES
    deployment: str | None = None  # this deployment's name, for operators' filters
    # The operator accepts rewards the contamination check could not check (its test items
    # are not here): such episodes start, and end with `contamination.skipped: "unchecked"`.
    accept_unchecked_rewards: bool = False
    # Storage's price (POSTTRAIN_STORAGE_USD_PER_TB_MONTH) and the days an artifact is charged
    # for (as long as job folders are kept: POSTTRAIN_JOB_RETENTION_DAYS).
    storage_micro_usd_per_tb_month: int = round(STORAGE_USD_PER_TB_MONTH * MICRO)
    storage_billed_days: float = 14.0


async def pinned_base_model(
    backend: JobsBackend, task: TaskSpec, revision: str | None = None
) -> RepoRef:
    """The repo the backend mounts as the task's base model, at a commit. A branch or tag
    becomes a commit here, once per episode (or once per campaign, which pins every rollout to
    it with `revision`): every job of the episode, and every answer about its base model, names
    that commit. Raises ToolError(not_allowed) for a task the backend cannot run."""
    model = task.base_model
    repo_id, default = model.repo_id, model.revision
    if backend.uses_local_models:
        if model.local is None:
            raise ToolError(
                ErrorType.not_allowed,
                f"task {task.id!r} has no local base model; it needs the hf backend",
                field="task_id",
            )
        repo_id, default = model.local, model.local_revision
    return RepoRef(
        repo_id=repo_id, revision=await backend.resolve_model(repo_id, revision or default)
    )


def refuse_unready(task: TaskSpec, config: EpisodeConfig) -> None:
    """Raise ToolError(not_ready), naming the command that makes the task ready, for a task
    this deployment cannot grade (files its evaluator embeds are missing) or cannot check for
    contamination (its test items are missing) unless the operator accepts unchecked rewards:
    no reward is unchecked by accident (DESIGN §12)."""
    missing = missing_evaluation_files(task, config.tasks_dir)
    unchecked = missing_test_items(task, config.tasks_dir)
    if missing is None and (unchecked is None or config.accept_unchecked_rewards):
        return
    why = missing or unchecked
    opt_in = ""
    if not missing:
        opt_in = f" (or, to reward its episodes unchecked, sets {ACCEPT_UNCHECKED_SETTING}=true)"
    raise ToolError(
        ErrorType.not_ready,
        f"task {task.id!r} is not ready on this deployment: {why}. Its operator runs "
        f"`{fetch_command(task.id)}`{opt_in}",
        field="task_id",
    )


class EpisodeActivities(EpisodesApi):
    def __init__(self, backend: JobsBackend, account: ServerAccount, config: EpisodeConfig) -> None:
        self._backend = backend
        self._account = account
        self._config = config

    @activity.defn
    @agent_errors
    async def prepare_episode(self, request: PrepareEpisode) -> EpisodeSetup:
        """Load the task, lock its prices, pin the base model, admit the episode."""
        try:
            task = load_task(request.task_id, self._config.tasks_dir)
        except TaskSpecError as err:
            raise ToolError(ErrorType.invalid_argument, str(err), field="task_id") from None
        refuse_unready(task, self._config)
        prices = {p.name: p for p in await self._backend.hardware()}
        base_model = await pinned_base_model(self._backend, task, request.base_model_revision)
        config = self._config
        caps = Caps(
            account_workflow_id=config.account_workflow_id,
            spend_cap_micro_usd=config.spend_cap_micro_usd,
            max_live_episodes=config.max_live_episodes,
        )
        if caps.tracked:
            await self._account.admit(request.episode_id, caps)
        return EpisodeSetup(
            episode_id=request.episode_id,
            task=task,
            base_model=base_model,
            prices={
                name: prices[name] for name in [*task.flavors, task.eval_flavor] if name in prices
            },
            prices_simulated=self._backend.prices_simulated,
            cancel_confirm_s=config.cancel_confirm_s,
            watcher_workflow_id=config.watcher_workflow_id,
            watch_shards=config.watch_shards,
            caps=caps,
            session_workflow_id=request.session_workflow_id,
            continue_as_new_events=config.continue_as_new_events,
            continue_as_new_bytes=config.continue_as_new_bytes,
            job_python_version=self._backend.job_python_version,
            backend=self._backend.name,
            known_runs=known_run_source(self._backend) is not None,
            deployment=config.deployment,
            job_limits=self._job_limits(task.flavors, task.eval_flavor),
            storage=StorageTerms(
                cap_bytes=task.storage_cap_bytes or self._backend.default_storage_cap_bytes,
                artifact_cap_bytes=task.artifact_cap_bytes
                or self._backend.default_artifact_cap_bytes,
                micro_usd_per_tb_month=config.storage_micro_usd_per_tb_month,
                billed_days=config.storage_billed_days,
            ),
        )

    def _job_limits(self, flavors: list[str], eval_flavor: str) -> JobLimits | None:
        """The backend's limits per job, for this task's flavors only."""
        limits = self._backend.job_limits()
        if limits is None:
            return None
        wanted = [*flavors, eval_flavor]
        return limits.model_copy(
            update={"flavors": {f: v for f, v in limits.flavors.items() if f in wanted}}
        )

    @activity.defn
    @agent_errors
    async def reserve_server_spend(self, spend: ServerSpend) -> None:
        await self._account.check_exposure(spend)
