"""The activities' interfaces, as workflows call them (`workflow.execute_activity_method`).

Each class lists one group of activities with their inputs and results; the implementations in
`activities/` subclass it and override every method (a test checks that none is left out), so a
workflow depends on these signatures only and loads no activity code, and pyright checks that an
implementation keeps the signature. Activity names are the method names: renaming one changes
the commands of every workflow that calls it (see the docs/development.md, "Changing workflow
code").
"""

from __future__ import annotations

from temporalio import activity

from posttrain_common.campaigns.retry import RetryPick
from posttrain_common.contracts.audit import WriteAudit
from posttrain_common.contracts.campaigns import (
    AgentTurn,
    CallRef,
    CallState,
    CampaignPlan,
    CheckAgents,
    FinishAttempt,
    OpenConversation,
    PickRetries,
    PlanCampaign,
    ReopenCampaign,
    Reopened,
    TurnSummary,
)
from posttrain_common.contracts.contamination import CheckContamination, ContaminationReport
from posttrain_common.contracts.episodes import EpisodeSetup, PrepareEpisode, ServerSpend
from posttrain_common.contracts.jobs import (
    BackendJob,
    CheckScript,
    JobLogs,
    JobRef,
    KeepOutputs,
    LogLines,
    ObserveJobs,
    OrphanJob,
    OrphanSearch,
    RepoRef,
    ResolveDatasets,
    ScoreResult,
    SubmitJob,
)
from posttrain_common.contracts.known_runs import KnownStart
from posttrain_common.contracts.reconcile import FindStranded, StrandedRun, StrandedSearch
from posttrain_common.contracts.retention import RetentionReport, SweepRetention


class Unimplemented(NotImplementedError):
    """An interface method that its implementation did not override."""


class JobsApi:
    """Start, watch, cancel and read jobs on the backend
    (`activities.jobs.activities.JobsActivities`)."""

    @activity.defn
    async def submit_job(self, job: SubmitJob) -> BackendJob:
        """Start the job unless one with its key exists (a retried submit), then watch it."""
        raise Unimplemented

    @activity.defn
    async def start_known_job(self, job: SubmitJob) -> KnownStart:
        """Start the job if its backend knows its whole run now (a replayed one), and answer
        that run with, for an evaluation that succeeds, its score; else start nothing."""
        raise Unimplemented

    @activity.defn
    async def observe_jobs(self, observe: ObserveJobs) -> dict[str, BackendJob]:
        """The current state of many jobs in one call (unknown refs are left out)."""
        raise Unimplemented

    @activity.defn
    async def cancel_job(self, job: JobRef) -> BackendJob:
        raise Unimplemented

    @activity.defn
    async def job_logs(self, job: JobLogs) -> LogLines:
        """The end of the job's log, within the `jobs_logs` limits."""
        raise Unimplemented

    @activity.defn
    async def read_score(self, job: JobRef) -> ScoreResult:
        raise Unimplemented

    @activity.defn
    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """Measure an ended agent job's outputs and keep them within its caps (or delete them
        all): the job as it ends, with `stored_bytes` and any refusal."""
        raise Unimplemented

    @activity.defn
    async def resolve_datasets(self, datasets: ResolveDatasets) -> list[RepoRef]:
        raise Unimplemented

    @activity.defn
    async def check_script(self, check: CheckScript) -> None:
        """Raise invalid_script unless the script parses as the job's Python version."""
        raise Unimplemented


class EpisodesApi:
    """Set episodes up and keep the server-wide caps
    (`activities.episodes.activities.EpisodeActivities`)."""

    @activity.defn
    async def prepare_episode(self, request: PrepareEpisode) -> EpisodeSetup:
        """Load the task, lock its prices, pin the base model, admit the episode."""
        raise Unimplemented

    @activity.defn
    async def reserve_server_spend(self, spend: ServerSpend) -> None:
        raise Unimplemented


class ReaperApi:
    """Find and cancel orphaned Hugging Face jobs
    (`activities.backends.hf.reaper.ReaperActivities`)."""

    @activity.defn
    async def find_orphan_jobs(self) -> OrphanSearch:
        raise Unimplemented

    @activity.defn
    async def cancel_orphan_job(self, orphan: OrphanJob) -> BackendJob:
        raise Unimplemented


class ReconcilerApi:
    """Find runs of our workflows closed from outside, and wind each down
    (`activities.jobs.reconciler.ReconcilerActivities`)."""

    @activity.defn
    async def find_stranded_workflows(self, request: FindStranded) -> StrandedSearch:
        raise Unimplemented

    @activity.defn
    async def wind_down_workflow(self, run: StrandedRun) -> str:
        """What was done, in words."""
        raise Unimplemented


class AuditApi:
    """Write an episode's audit record when it ends (`activities.records.audit.AuditActivities`)."""

    @activity.defn
    async def write_audit(self, request: WriteAudit) -> str:
        """Read the episode's history and the backend's job facts; write the record; its
        file's name."""
        raise Unimplemented


class RetentionApi:
    """Delete the job folders of episodes that ended long enough ago
    (`activities.records.retention.RetentionActivities`)."""

    @activity.defn
    async def sweep_retention(self, request: SweepRetention) -> RetentionReport:
        """One bounded sweep over the audit records: what it deleted, refused or left."""
        raise Unimplemented


class ContaminationApi:
    """The grader-side contamination check
    (`activities.contamination.activities.ContaminationActivities`):
    on the main worker, never in a job, not charged to the agent."""

    @activity.defn
    async def check_contamination(self, check: CheckContamination) -> ContaminationReport:
        """Look for the task's test items in the episode's scripts and mounted datasets: the
        counts for the agent, the evidence for the audit record."""
        raise Unimplemented


class CampaignsApi:
    """Plan campaigns, keep their conversations and records, and carry a rollout's tool calls to
    its episode as the gateway does (`activities.campaigns.activities.CampaignActivities`)."""

    @activity.defn
    async def plan_campaign(self, plan: PlanCampaign) -> CampaignPlan:
        """Check the tasks and the budget, pin each task's base model, describe the campaign."""
        raise Unimplemented

    @activity.defn
    async def open_conversation(self, request: OpenConversation) -> str:
        """Store the brief as a new conversation; its head."""
        raise Unimplemented

    @activity.defn
    async def send_call(self, call: CallRef) -> CallState:
        """Send the call as an update (accepted, not awaited), then look for its answer."""
        raise Unimplemented

    @activity.defn
    async def collect_answer(self, call: CallRef) -> CallState:
        """The call's answer, added to the conversation, if the episode has given it."""
        raise Unimplemented

    @activity.defn
    async def finish_attempt(self, finish: FinishAttempt) -> None:
        """Append the attempt's record (once, whatever the retries)."""
        raise Unimplemented

    @activity.defn
    async def pick_retries(self, pick: PickRetries) -> list[RetryPick]:
        """The rollouts whose deciding attempt ended as `pick.only` selects, from the records."""
        raise Unimplemented

    @activity.defn
    async def reopen_campaign(self, reopen: ReopenCampaign) -> Reopened:
        """A finished campaign's plan (as pinned) and counters (from its records)."""
        raise Unimplemented


class AgentsApi:
    """Agent turns, on the agent task queue only
    (`activities.campaigns.agent_turns.AgentTurnActivities`,
    in `posttrain-env agent-worker`: no broker secret in that process)."""

    @activity.defn
    async def agent_turn(self, turn: AgentTurn) -> TurnSummary:
        """Run one turn of the agent in a process of its own; store it; summarize it."""
        raise Unimplemented

    @activity.defn
    async def check_agents(self, check: CheckAgents) -> None:
        """Build every agent once (in its own process): raise agent_invalid for one that cannot."""
        raise Unimplemented
