"""Campaign activities: plan a campaign, keep its conversations and records, and carry a
rollout's tool calls to its episode exactly as the gateway does (an update sent with a
deterministic id, accepted but not awaited; the answer read back through `result_of`).

No activity here waits for a tool's answer: a `jobs_wait` or a grading may take many minutes,
and the rollout waits for it on a signal instead (an activity held open that long would also
stall the test server's clock). The rollout's activities heartbeat while they run, so a worker
killed mid-call is noticed within the rollout's short heartbeat timeout, not after the call's
whole start-to-close timeout (a minute, measured: the rollout then stalled for it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.backends.interface import JobsBackend
from activities.campaigns.store import CampaignStore
from activities.episodes.activities import pinned_base_model
from activities.heartbeat import heartbeating
from activities.ports import EpisodeCalls
from posttrain_common.campaigns.records import CampaignMeta, RepoRevision, read_records
from posttrain_common.campaigns.retry import RetryPick, pick_retries, rebuild
from posttrain_common.campaigns.spec import CampaignSpec, SpecError, check_carried_size
from posttrain_common.contracts.activities import CampaignsApi
from posttrain_common.contracts.campaigns import (
    CallRef,
    CallState,
    CampaignPlan,
    FinishAttempt,
    OpenConversation,
    PickRetries,
    PlanCampaign,
    ReopenCampaign,
    Reopened,
    TaskPlan,
)
from posttrain_common.contracts.episode_calls import ToolResult, episode_over, tool_call
from posttrain_common.contracts.jobs import RepoRef
from posttrain_common.failures import campaign_invalid
from posttrain_env.agents.conversation import AgentCall, Message
from posttrain_env.agents.prompts import error_data
from posttrain_env.errors import ToolError
from posttrain_env.models import TaskSpec, usd
from tasks.registry import TaskSpecError, load_task

# How often a rollout's activity tells Temporal it is alive (the rollout's heartbeat timeout,
# `workflows/campaign/rollout.py` CALL_HEARTBEAT, is a few of these). The first beat comes
# after one period: most calls end within milliseconds, and a beat is a server write.
HEARTBEAT_S = 2.0


class CampaignConfig(BaseModel):
    tasks_dir: Path
    project_version: str = ""


def check_tasks(spec: CampaignSpec, tasks_dir: Path) -> dict[str, TaskSpec]:
    """Every task of the spec, loaded; and the budget checked against the costliest rollout's
    worst case. Raises SpecError (the CLI checks this before anything starts)."""
    tasks: dict[str, TaskSpec] = {}
    for task_id in spec.tasks:
        try:
            tasks[task_id] = load_task(task_id, tasks_dir)
        except TaskSpecError as err:
            raise SpecError(f"tasks: {err}") from None
    worst = worst_cases(spec, tasks)
    key = max(worst, key=lambda k: worst[k])
    if worst[key] > spec.budget_micro_usd:
        raise SpecError(
            f"budget_usd: ${spec.budget_usd} is below the worst case of one rollout of {key} "
            f"(${usd(worst[key])}: the task's budget plus the agent's llm_cap_usd), so it could "
            "never run"
        )
    return tasks


def worst_cases(spec: CampaignSpec, tasks: dict[str, TaskSpec]) -> dict[str, int]:
    """Micro-USD a rollout of each task and agent may cost at most, by "<task>/<agent>"."""
    return {
        f"{task_id}/{agent.name}": tasks[task_id].budget_micro_usd + agent.llm_cap_micro_usd
        for task_id in spec.tasks
        for agent in spec.agents
    }


class CampaignActivities(CampaignsApi):
    def __init__(
        self,
        backend: JobsBackend,
        store: CampaignStore,
        calls: EpisodeCalls,
        config: CampaignConfig,
    ) -> None:
        self._backend = backend
        self._store = store
        self._calls = calls
        self._config = config

    @activity.defn
    async def plan_campaign(self, plan: PlanCampaign) -> CampaignPlan:
        spec = plan.spec
        try:
            check_carried_size(spec)  # a spec that reached the workflow without `parse_spec`
            tasks = check_tasks(spec, self._config.tasks_dir)
            pinned = {
                task_id: await pinned_base_model(self._backend, task)
                for task_id, task in tasks.items()
            }
        except (SpecError, ToolError) as err:
            message = err.message if isinstance(err, ToolError) else str(err)
            raise campaign_invalid(message) from None
        worst = worst_cases(spec, tasks)
        if await asyncio.to_thread(self._store.read_meta, plan.campaign_id) is None:
            meta = CampaignMeta(
                campaign_id=plan.campaign_id,
                spec=spec.model_dump(mode="json"),
                created_at=plan.created_at.isoformat().replace("+00:00", "Z"),
                project_version=self._config.project_version,
                base_models={
                    t: RepoRevision(repo_id=r.repo_id, revision=r.revision)
                    for t, r in pinned.items()
                },
                worst_case_usd={k: usd(v) for k, v in worst.items()},
                rollouts=spec.rollouts,
            )
            await asyncio.to_thread(self._store.write_meta, meta)
        return CampaignPlan(
            tasks={
                task_id: TaskPlan(
                    task_id=task_id,
                    budget_micro_usd=task.budget_micro_usd,
                    base_model=pinned[task_id],
                )
                for task_id, task in tasks.items()
            },
            # No worst case by cell: the campaign derives it (its carry stays small).
        )

    @activity.defn
    async def open_conversation(self, request: OpenConversation) -> str:
        async with heartbeating(HEARTBEAT_S, first_after_s=HEARTBEAT_S):
            return await asyncio.to_thread(
                self._store.start_conversation, request.campaign_id, request.brief
            )

    @activity.defn
    async def send_call(self, call: CallRef) -> CallState:
        async with heartbeating(HEARTBEAT_S, first_after_s=HEARTBEAT_S):
            return await self._send(call)

    @activity.defn
    async def collect_answer(self, call: CallRef) -> CallState:
        async with heartbeating(HEARTBEAT_S, first_after_s=HEARTBEAT_S):
            return await self._collect(call)

    @activity.defn
    async def finish_attempt(self, finish: FinishAttempt) -> None:
        async with heartbeating(HEARTBEAT_S, first_after_s=HEARTBEAT_S):
            await self._finish(finish)

    async def _send(self, call: CallRef) -> CallState:
        agent_call = await self._call(call)
        if agent_call.arguments is None or agent_call.problem is not None:
            # Never reaches the episode (it could not be a tool call): no step is used.
            problem = agent_call.problem or "the call has no arguments"
            answer = Message(
                role="tool", call_id=agent_call.id, tool=agent_call.tool, data=error_data(problem)
            )
            head = await asyncio.to_thread(
                self._store.extend, call.campaign_id, call.conversation, [answer]
            )
            return CallState(answered=True, conversation=head, local=True)
        request = tool_call(
            call.request_id, agent_call.tool, agent_call.arguments, "rollout", call.reply_to
        )
        if not await self._calls.send(call.episode_id, request):
            return await self._answer(call, agent_call, await self._after_the_end(call))
        # The episode has just accepted the call, so it was running: an answer not there yet
        # comes by signal, or the episode's end is found by `collect_answer` (no describe now).
        return await self._collect(call, accepted=True)

    async def _collect(self, call: CallRef, *, accepted: bool = False) -> CallState:
        result = await self._calls.result_of(call.episode_id, call.request_id)
        if result is None:
            if accepted or await self._calls.is_running(call.episode_id):
                return CallState(answered=False, conversation=call.conversation)
            # Completed, and no answer kept (dropped from its recent answers): none will come.
            result = await self._after_the_end(call)
        return await self._answer(call, await self._call(call), result)

    async def _finish(self, finish: FinishAttempt) -> None:
        record = finish.record
        if finish.episode_id is not None:
            status = await self._calls.status(finish.episode_id)
            record = record.model_copy(
                update={
                    "steps_used": status.steps_used,
                    "job_ids": [str(job.get("job_id")) for job in status.jobs],
                    "service_spend": status.service_spend,
                }
            )
        record = record.model_copy(update={"project_version": self._config.project_version})
        record.total_usd = round(record.service_spend.settled.usd + record.llm.usd, 6)
        await asyncio.to_thread(self._store.append_record, record)

    @activity.defn
    async def pick_retries(self, pick: PickRetries) -> list[RetryPick]:
        folder = self._store.folder(pick.campaign_id)
        records = await asyncio.to_thread(read_records, folder)
        return pick_retries(pick.spec, records, pick.only, pick.skip)

    @activity.defn
    async def reopen_campaign(self, reopen: ReopenCampaign) -> Reopened:
        meta = await asyncio.to_thread(self._store.read_meta, reopen.campaign_id)
        if meta is None:
            raise campaign_invalid(
                f"campaign {reopen.campaign_id} has no campaign.json in its folder"
            )
        try:
            tasks = check_tasks(reopen.spec, self._config.tasks_dir)
        except SpecError as err:
            raise campaign_invalid(str(err)) from None
        records = await asyncio.to_thread(read_records, self._store.folder(reopen.campaign_id))
        plan = CampaignPlan(
            tasks={
                task_id: TaskPlan(
                    task_id=task_id,
                    budget_micro_usd=task.budget_micro_usd,
                    # The commit pinned when the campaign started, never resolved again.
                    base_model=RepoRef(
                        repo_id=meta.base_models[task_id].repo_id,
                        revision=meta.base_models[task_id].revision,
                    ),
                )
                for task_id, task in tasks.items()
            },
        )
        return Reopened(plan=plan, rebuilt=rebuild(reopen.spec, records))

    # -- helpers -------------------------------------------------------------------------------

    async def _call(self, call: CallRef) -> AgentCall:
        stored = await asyncio.to_thread(
            self._store.load_turn, call.campaign_id, call.attempt_key, call.number
        )
        if stored is None or call.index >= len(stored.turn.calls):
            raise ApplicationError(
                f"turn {call.number} of {call.attempt_key} is not stored", non_retryable=True
            )
        return stored.turn.calls[call.index]

    async def _after_the_end(self, call: CallRef) -> ToolResult:
        status = await self._calls.status(call.episode_id)
        assert status.metadata is not None
        over = episode_over(status.end)
        return ToolResult(
            tool="",
            data=over.envelope(),
            done=True,
            reward=status.end.reward if status.end else None,
            metadata=status.metadata,
        )

    async def _answer(self, call: CallRef, agent_call: AgentCall, result: ToolResult) -> CallState:
        meta = result.metadata
        spend = meta.service_spend
        answer = Message(
            role="tool",
            call_id=agent_call.id,
            tool=agent_call.tool,
            data=result.worded_for("rollout").data,  # this path's edge: what to do after the end
            steps_left=meta.steps_left,
            time_left_s=meta.time_left_s,
            spend_usd={"settled": spend.settled.usd, "reserved": spend.reserved.usd},
            done=result.done,
        )
        head = await asyncio.to_thread(
            self._store.extend, call.campaign_id, call.conversation, [answer]
        )
        return CallState(answered=True, conversation=head, done=result.done)
