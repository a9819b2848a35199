"""An episode's audit record, read from its Temporal history (every run of it, following
continue-as-new): the tool calls (update accepted/completed events), the jobs (child starts and
the `job_changed` signals they sent; a job whose run was known at its start, which has no
workflow, from its `start_known_job` activity: its request and its run, as the run ends unless
cut; the audit activity then takes each job's final state and charge from the episode itself),
the end (the run's result).

It decodes workflow models, so it lives with the wiring (the roof); the audit activity reaches
it through `activities.ports.EpisodeTrail`, and `posttrain-env episodes export` uses it too.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client

from posttrain_common.contracts.audit import (
    AuditCall,
    AuditEnd,
    AuditEvaluation,
    AuditJob,
    AuditRecord,
    AuditStateChange,
)
from posttrain_common.contracts.episode_calls import ToolCall, ToolResult
from posttrain_common.contracts.jobs import JobRole, JobSpec, SubmitJob
from posttrain_common.contracts.known_runs import KnownStart
from posttrain_env.models import EpisodeEnd
from workflows.episode.ledger import billed_minutes
from workflows.episode.workflow import EpisodeInput
from workflows.ids import SIGNAL_JOB_CHANGED, episode_workflow_id
from workflows.job.workflow import JobInput, JobSnapshot

# The activity that starts a job whose run its backend knows (`JobsApi.start_known_job`).
KNOWN_START_ACTIVITY = "start_known_job"
MAX_RUNS = 10_000  # continue-as-new chains are long only in theory; never loop forever


async def _first_run_of(client: Client, workflow_id: str, run_id: str = "") -> str:
    """The first run of the continue-as-new chain `run_id` (default: the latest run) belongs
    to. Described raw: the SDK's `describe()` also decodes every search attribute, and one it
    cannot decode (the time-skipping server keeps a Datetime attribute upserted to None, such
    as a cleared PtCancelPendingSince, as a null payload) would fail the audit record for an
    attribute it never reads."""
    described = await client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
        )
    )
    info = described.workflow_execution_info
    return info.first_run_id or info.execution.run_id


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Trail:
    def __init__(self) -> None:
        self.record: AuditRecord | None = None
        self.prices: dict[str, int] = {}
        self.calls: dict[str, AuditCall] = {}  # update id -> call
        self.jobs: dict[str, AuditJob] = {}  # job id -> job
        self.snapshots: dict[str, JobSnapshot] = {}  # job id -> its latest report
        self.refs: dict[str, str] = {}  # backend ref -> job id
        self.scripts: dict[str, str] = {}
        self.end: EpisodeEnd | None = None
        self.ended_at: datetime | None = None
        # This run's `start_known_job` activities: scheduled event id -> job id.
        self.known_starts: dict[int, str] = {}


async def read_trail(client: Client, episode_id: str) -> AuditRecord:
    """The record of `episode_id` as its history tells it (installed versions and artifact
    sizes are the backend's to add). Raises RPCError (NOT_FOUND) for an unknown episode."""
    workflow_id = episode_workflow_id(episode_id)
    chains = [await _first_run_of(client, workflow_id)]
    # A run the reconciler started after the last one was terminated: that one's chain first.
    for _ in range(MAX_RUNS):
        previous = await _wound_down_from(client, workflow_id, chains[0])
        if previous is None:
            break
        chains.insert(0, await _first_run_of(client, workflow_id, previous))
    trail = _Trail()
    for first_run in chains:
        run_id: str | None = first_run
        for _ in range(MAX_RUNS):
            handle = client.get_workflow_handle(workflow_id, run_id=run_id)
            next_run: str | None = None
            async for event in handle.fetch_history_events():
                next_run = await _take(client, trail, event) or next_run
            if next_run is None:
                break
            run_id = next_run
    return _finish(trail)


async def _wound_down_from(client: Client, workflow_id: str, run_id: str | None) -> str | None:
    """The terminated run that the run `run_id` winds down (None: it winds down none)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        attrs = event.workflow_execution_started_event_attributes
        (inp,) = await client.data_converter.decode(attrs.input.payloads, [EpisodeInput])
        return inp.wind_down.previous_run_id if inp.wind_down else None
    return None


async def _take(client: Client, trail: _Trail, event: HistoryEvent) -> str | None:
    """Apply one event; the next run's id when the event continues the workflow as new."""
    decode = client.data_converter.decode
    at = event.event_time.ToDatetime().replace(tzinfo=UTC)
    kind = event.event_type
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        trail.known_starts = {}  # event ids are a run's own
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and trail.record is None:
        (inp,) = await decode(
            event.workflow_execution_started_event_attributes.input.payloads, [EpisodeInput]
        )
        setup = inp.setup
        trail.prices = {name: p.micro_usd_per_minute for name, p in setup.prices.items()}
        trail.record = AuditRecord(
            episode_id=setup.episode_id,
            task_id=setup.task.id,
            base_model=setup.base_model.repo_id,
            base_model_revision=setup.base_model.revision,
            backend=setup.backend,
            deployment=setup.deployment,
            campaign_id=setup.campaign_id,
            started_at=at,
        )
    elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
        request = event.workflow_execution_update_accepted_event_attributes.accepted_request
        if request.input.name != "call_tool":
            return None  # an operator's repair: the record has it from the episode itself
        (call,) = await decode(request.input.args.payloads, [ToolCall])
        arguments = dict(call.arguments)
        script = arguments.get("script")
        if isinstance(script, str):
            digest = sha256(script)
            trail.scripts[digest] = script
            arguments["script"] = {"sha256": digest}
        trail.calls[request.meta.update_id] = AuditCall(
            request_id=call.request_id,
            tool=call.tool,
            path=call.path,
            arguments=arguments,
            accepted_at=at,
        )
    elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
        attrs = event.workflow_execution_update_completed_event_attributes
        audit_call = trail.calls.get(attrs.meta.update_id)
        if audit_call is not None and attrs.outcome.HasField("success"):
            (result,) = await decode(attrs.outcome.success.payloads, [ToolResult])
            audit_call.answered_at = at
            error = result.data.get("error")
            if isinstance(error, dict):
                audit_call.error_type = str(error.get("type"))
            else:
                audit_call.result = result.data
    elif kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
        attrs = event.start_child_workflow_execution_initiated_event_attributes
        (job,) = await decode(attrs.input.payloads, [JobInput])
        _take_job(trail, job, attrs.workflow_id)
    elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name == KNOWN_START_ACTIVITY:
            (request,) = await decode(attrs.input.payloads, [SubmitJob])
            _take_job(trail, request, request.key)
            trail.known_starts[event.event_id] = request.job_id
    elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
        attrs = event.activity_task_completed_event_attributes
        job_id = trail.known_starts.pop(attrs.scheduled_event_id, None)
        if job_id is not None:
            (start,) = await decode(attrs.result.payloads, [KnownStart])
            _take_known_run(trail, job_id, start, at)
    elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        attrs = event.workflow_execution_signaled_event_attributes
        if attrs.signal_name == SIGNAL_JOB_CHANGED:
            (snap,) = await decode(attrs.input.payloads, [JobSnapshot])
            _take_snapshot(trail, snap, at)
    elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        payloads = event.workflow_execution_completed_event_attributes.result.payloads
        (trail.end,) = await decode(payloads, [EpisodeEnd])
        trail.ended_at = at
    elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return None


def _take_known_run(trail: _Trail, job_id: str, start: KnownStart, at: datetime) -> None:
    """A job started with its whole run known: reported as that run ends unless cut short
    (the audit activity overrides its final state and charge with the episode's own)."""
    run = start.run
    if run is None:  # its backend did not know it: it got a workflow, whose trail follows
        trail.jobs.pop(job_id, None)
        return
    end = run.view(run.ends_at)
    if end.started_at is not None:
        running = run.view(end.started_at)
        _take_snapshot(
            trail,
            JobSnapshot(job_id=job_id, state=running.state, backend=running),
            max(at, end.started_at),
        )
    _take_snapshot(
        trail,
        JobSnapshot(
            job_id=job_id,
            state=end.state,
            backend=end,
            score=run.score_at_end(end.state),
            message=end.message,
            final=True,
        ),
        max(at, end.finished_at or at),
    )


def _take_job(trail: _Trail, job: JobSpec, workflow_id: str) -> None:
    price = trail.prices.get(job.flavor, 0)
    script_sha = None
    if job.role is JobRole.agent:
        script_sha = sha256(job.script)
        trail.scripts[script_sha] = job.script
    reserved = 0 if job.role is JobRole.grader else price * math.ceil(job.timeout_s / 60)
    trail.jobs[job.job_id] = AuditJob(
        job_id=job.job_id,
        workflow_id=workflow_id,
        role=job.role.value,
        flavor=job.flavor,
        timeout_s=job.timeout_s,
        script_sha256=script_sha,
        dependencies=list(job.dependencies),
        datasets={d.repo_id: d.revision for d in job.datasets},
        base_model=job.base_model.repo_id,
        base_model_revision=job.base_model.revision,
        evaluated_job_id=trail.refs.get(job.artifact_ref or ""),
        reserved_micro_usd=reserved,
    )


def _take_snapshot(trail: _Trail, snap: JobSnapshot, at: datetime) -> None:
    job = trail.jobs.get(snap.job_id)
    if job is None:
        return
    trail.snapshots[snap.job_id] = snap
    if snap.backend is not None:
        job.backend_job_id = snap.backend.ref
        trail.refs[snap.backend.ref] = snap.job_id
        job.started_at = snap.backend.started_at
        job.finished_at = snap.backend.finished_at
        job.running_s = snap.backend.running_s
        job.replayed = True if snap.backend.replayed else None
    last = job.state_changes[-1].state if job.state_changes else None
    if snap.state.value != last:
        job.state_changes.append(
            AuditStateChange(state=snap.state.value, at=at, message=snap.message)
        )
    if snap.final:
        job.final_state = snap.state.value
        if job.role != JobRole.grader.value and snap.error is None:
            job.settled_micro_usd = trail.prices.get(job.flavor, 0) * billed_minutes(job.running_s)


def _finish(trail: _Trail) -> AuditRecord:
    record = trail.record
    if record is None:
        raise ValueError("the episode's history has no start event")
    record.calls = list(trail.calls.values())
    record.jobs = list(trail.jobs.values())
    record.scripts = trail.scripts
    for job in record.jobs:
        snap = trail.snapshots.get(job.job_id)
        if job.role == JobRole.agent.value:
            continue
        score = snap.score if snap else None
        record.evaluations.append(
            AuditEvaluation(
                job_id=job.job_id,
                role=job.role,
                split="hidden" if job.role == JobRole.grader.value else "dev",
                evaluated_job_id=job.evaluated_job_id,
                valid=score.valid if score else None,
                score=score.score if score else None,
                reason=score.reason if score else "",
            )
        )
    record.final_spend_micro_usd = sum(j.settled_micro_usd or 0 for j in record.jobs)
    if trail.end is not None:
        record.end = AuditEnd(
            reason=trail.end.reason.value,
            reward=trail.end.reward,
            invalid_score=trail.end.invalid_score,
            replayed=trail.end.replayed,
            replay_miss=trail.end.replay_miss,
            replay_misses=trail.end.replay_misses,
        )
        record.ended_at = trail.ended_at
    return record
