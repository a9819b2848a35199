"""Activities that set episodes up and keep the server-wide caps (task specs, prices, account)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from activities.backend import JobsBackend, RepoRef
from activities.jobs import agent_errors
from posttrain_env.limits import CONTINUE_AS_NEW_HISTORY_BYTES
from posttrain_env.models import ErrorType, ToolError
from tasks.registry import TaskSpecError, load_task
from workflows.episode_state import Caps, EpisodeSetup


class PrepareEpisode(BaseModel):
    task_id: str
    episode_id: str
    session_workflow_id: str | None = None


class ServerSpend(BaseModel):
    account_workflow_id: str
    episode_id: str
    committed_micro_usd: int
    cap_micro_usd: int


class EpisodeConfig(BaseModel):
    """Server settings that episodes need, handed to the activities at worker start."""

    tasks_dir: Path
    watcher_workflow_id: str
    account_workflow_id: str
    cancel_confirm_s: int = 120
    max_live_episodes: int | None = None
    spend_cap_micro_usd: int | None = None
    continue_as_new_events: int | None = None
    continue_as_new_bytes: int = CONTINUE_AS_NEW_HISTORY_BYTES


class EpisodeActivities:
    def __init__(self, backend: JobsBackend, client: Client, config: EpisodeConfig) -> None:
        self._backend = backend
        self._client = client
        self._config = config

    @activity.defn
    @agent_errors
    async def prepare_episode(self, request: PrepareEpisode) -> EpisodeSetup:
        """Load the task, lock its prices, pin the base model, admit the episode."""

        try:
            task = load_task(request.task_id, self._config.tasks_dir)
        except TaskSpecError as err:
            raise ToolError(ErrorType.invalid_argument, str(err), field="task_id") from None
        prices = {p.name: p for p in await self._backend.hardware()}
        model = task.base_model
        repo_id = model.repo_id
        if self._backend.uses_local_models:
            if model.local is None:
                raise ToolError(
                    ErrorType.not_allowed,
                    f"task {task.id!r} has no local base model; it needs the hf backend",
                    field="task_id",
                )
            repo_id = model.local
        commit = await self._backend.resolve_model(repo_id, model.revision)
        config = self._config
        caps = Caps(
            account_workflow_id=config.account_workflow_id,
            spend_cap_micro_usd=config.spend_cap_micro_usd,
            max_live_episodes=config.max_live_episodes,
        )
        if caps.tracked:
            await self._admit(request.episode_id, caps)
        return EpisodeSetup(
            episode_id=request.episode_id,
            task=task,
            base_model=RepoRef(repo_id=repo_id, revision=commit),
            prices={
                name: prices[name] for name in [*task.flavors, task.eval_flavor] if name in prices
            },
            prices_simulated=self._backend.prices_simulated,
            cancel_confirm_s=config.cancel_confirm_s,
            watcher_workflow_id=config.watcher_workflow_id,
            caps=caps,
            session_workflow_id=request.session_workflow_id,
            continue_as_new_events=config.continue_as_new_events,
            continue_as_new_bytes=config.continue_as_new_bytes,
        )

    @activity.defn
    @agent_errors
    async def reserve_server_spend(self, spend: ServerSpend) -> None:
        from workflows.account import AccountWorkflow, ExposureCheck

        handle = self._client.get_workflow_handle_for(
            AccountWorkflow.run, spend.account_workflow_id
        )
        try:
            await handle.execute_update(
                AccountWorkflow.check_exposure,
                ExposureCheck(
                    episode_id=spend.episode_id,
                    committed_micro_usd=spend.committed_micro_usd,
                    cap_micro_usd=spend.cap_micro_usd,
                ),
            )
        except WorkflowUpdateFailedError as err:
            raise _as_tool_error(err) from None

    async def _admit(self, episode_id: str, caps: Caps) -> None:
        from workflows.account import AccountState, AccountWorkflow, Admission

        start = WithStartWorkflowOperation(
            AccountWorkflow.run,
            AccountState(),
            id=caps.account_workflow_id,
            task_queue=activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            await self._client.execute_update_with_start_workflow(
                AccountWorkflow.admit,
                Admission(
                    episode_id=episode_id,
                    max_live_episodes=caps.max_live_episodes,
                    spend_cap_micro_usd=caps.spend_cap_micro_usd,
                ),
                start_workflow_operation=start,
            )
        except WorkflowUpdateFailedError as err:
            raise _as_tool_error(err) from None


def _as_tool_error(err: WorkflowUpdateFailedError) -> ToolError:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in {t.value for t in ErrorType}:
        return ToolError(ErrorType(cause.type), cause.message)
    return ToolError(ErrorType.hf_error, f"the server's account could not be updated: {err}")
