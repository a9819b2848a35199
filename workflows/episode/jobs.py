"""The episode's jobs (workflow code): start them as ABANDON children, with their money
reserved first, take their reports, cancel them, and keep the server-wide account informed.

Every job of any role is a `JobWorkflow` child; the episode re-adopts them by id and cancels
them explicitly at its end (DESIGN §3). Each outside call here is listed: the job workflows and
the watcher by signal, the account by signal and, through an activity, by update.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from posttrain_common.contracts.activities import EpisodesApi, JobsApi
    from posttrain_common.contracts.episodes import EpisodeSetup, ServerSpend
    from posttrain_common.contracts.jobs import CheckScript, JobRole, RepoRef, ResolveDatasets
    from posttrain_common.failures import artifact_rejection, tool_error_of
    from posttrain_env.errors import ErrorType, ToolError
    from posttrain_env.models import JobState
    from workflows.cancellation import unawaited_child
    from workflows.episode.known import known_snapshot, live_known, next_known_change
    from workflows.episode.ledger import StorageHold
    from workflows.episode.operator import outside_job_action, remember_action
    from workflows.episode.rules import check_room_for_a_job, take_snapshot
    from workflows.episode.state import EpisodeCarry, JobRecord
    from workflows.ids import SIGNAL_LOOK_NOW, job_workflow_id, watcher_shard_id
    from workflows.job.contract import refused_start, rejected_artifact, submit_request
    from workflows.job.workflow import (
        JobInput,
        JobSnapshot,
        JobWorkflow,
        job_memo,
        job_start_attributes,
    )
    from workflows.operations.account import AccountWorkflow, Exposure
    from workflows.policies import (
        READ_RETRY,
        READ_TIMEOUT,
        SUBMIT_HEARTBEAT,
        SUBMIT_RETRY,
        SUBMIT_TIMEOUT,
    )
    from workflows.waiting import wait_until


# A `jobs_wait` asks only the shard that follows the waited job to look now (see
# `ask_watcher_to_look`). Asked at each `jobs_wait` on a live job.
WAIT_LOOKS_AT_ONE_SHARD_PATCH = "pt-wait-looks-at-one-shard-1"
# A job whose backend knows its whole run at the start (EpisodeSetup.known_runs: the replay
# backend) is asked for that run first, and kept in the episode's table with no workflow of its
# own (workflows/episode/known.py); before, every job was a child workflow the watcher followed.
# Asked only where the backend knows runs (so that no other history holds its marker), once, at
# the start of each run: code that has it has every earlier patch the episode asks in every run
# (pt-visibility-1, pt-visibility-reserved-1, the syntax check for the job's Python, pt-audit-1),
# so such a run asks none of them. Each patch asked costs a run two history events (its marker
# and the TemporalChangeVersion upsert Temporal's core adds): 8 fewer per replayed rollout.
KNOWN_RUNS_PATCH = "pt-known-runs-1"
# ... and a known-runs episode's `jobs_submit` has the script's syntax checked by the activity
# that starts the job (`start_known_job`), not by an activity of its own first: one activity and
# one workflow task fewer per job (6 history events). Asked as KNOWN_RUNS_PATCH was, instead of
# it: it implies it, and every patch that one implies.
KNOWN_START_CHECKS_SYNTAX_PATCH = "pt-known-runs-2"
# An episode that recorded no job Python (started before it was) is checked as this server's.
SERVER_PYTHON = "3.11"


class EpisodeJobs:
    def __init__(self, setup: EpisodeSetup, state: EpisodeCarry) -> None:
        self._setup = setup
        self._s = state
        # Jobs keep the operator's search attributes current (the episode's visibility patch).
        self.visible = False
        # This run took KNOWN_RUNS_PATCH (`asks_known_runs`): jobs are asked for their run.
        self.known_runs = False
        # ... and KNOWN_START_CHECKS_SYNTAX_PATCH: that start checks an agent script's syntax.
        self.known_start_checks_syntax = False
        # Bumped when a known job is started or cancelled: `follow_known` looks again.
        self._known_poked = 0

    async def start(
        self,
        role: JobRole,
        flavor: str,
        timeout_minutes: int,
        *,
        timeout_s: int | None = None,
        script: str = "",
        dependencies: list[str] | None = None,
        datasets: list[RepoRef] | None = None,
        artifact_ref: str | None = None,
        evaluated_job_id: str | None = None,
        reserve: bool = True,
    ) -> JobRecord:
        """Reserve, start the child, and wait until the job exists (or its start failed).
        Raises ToolError when it may not start (budget, caps, the job table's limit)."""
        check_room_for_a_job(self._s)
        self._s.job_counter += 1
        n = self._s.job_counter
        prefix = "job" if role is JobRole.agent else "eval"
        job_id = f"{prefix}-{workflow.uuid4().hex[:12]}"
        price = self._setup.prices.get(flavor)
        if price is None:
            raise ToolError(ErrorType.flavor_not_allowed, f"no price is known for {flavor!r}")
        reserved = 0
        hold = self._storage_hold() if role is JobRole.agent else None
        if reserve:
            kind = "job" if role is JobRole.agent else "dev"
            reservation = self._s.ledger.reserve(job_id, kind, price, timeout_minutes, hold)
            reserved = reservation.amount_micro_usd
            try:
                await self._account_reserve()
            except ToolError:
                self._s.ledger.release(job_id)
                raise
        record = JobRecord(
            job_id=job_id,
            workflow_id=job_workflow_id(self._setup.episode_id, n),
            role=role,
            flavor=flavor,
            timeout_minutes=timeout_minutes,
            reserved_micro_usd=reserved,
            evaluated_job_id=evaluated_job_id,
            created_at=workflow.now(),
            base_model_revision=self._setup.base_model.revision,
        )
        self._s.jobs[job_id] = record
        storage = self._setup.storage
        job_input = JobInput(
            job_id=job_id,
            role=role,
            episode_id=self._setup.episode_id,
            task_id=self._setup.task.id,
            flavor=flavor,
            timeout_s=timeout_s or timeout_minutes * 60,
            base_model=self._setup.base_model,
            script=script,
            dependencies=dependencies or [],
            datasets=datasets or [],
            artifact_ref=artifact_ref,
            artifact_cap_bytes=storage.artifact_cap_bytes if storage else None,
            storage_allowance_bytes=hold.bytes if hold else None,
            storage_cap_bytes=storage.cap_bytes if storage and hold else None,
            parent_workflow_id=workflow.info().workflow_id,
            watcher_workflow_id=self.watcher_of(record.workflow_id),
            visible=self.visible,
            start_reported_by_submit=True,
            reserved_micro_usd=reserved,
        )
        if self.known_runs:
            if await self._start_known(record, job_input):
                return self._started(record)
        child = await workflow.start_child_workflow(
            JobWorkflow.run,
            job_input,
            id=record.workflow_id,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            **self._visibility_at_start(job_input),
        )
        unawaited_child(child)  # its end comes by signal
        # Started, failed to start, or (an evaluation whose artifact was refused) final at once.
        await workflow.wait_condition(
            lambda: record.submitted or record.error is not None or record.final
        )
        return self._started(record)

    def asks_known_runs(self) -> bool:
        """Asked first in each run: True when this run asks the backend for known runs (and
        so takes every earlier patch of the episode without asking it)."""
        if not self._setup.known_runs:
            return False
        self.known_start_checks_syntax = workflow.patched(KNOWN_START_CHECKS_SYNTAX_PATCH)
        self.known_runs = self.known_start_checks_syntax or workflow.patched(KNOWN_RUNS_PATCH)
        return self.known_runs

    def _started(self, record: JobRecord) -> JobRecord:
        """The job once it started, or the typed error its start was refused with."""
        if record.error is not None:
            refused = ToolError.from_envelope(record.error)
            if refused.type is ErrorType.not_recorded:
                self._s.replay_misses += 1
            raise refused
        return record

    async def _start_known(self, record: JobRecord, job: JobInput) -> bool:
        """Start the job if its backend knows its run now, and keep that run in its record;
        False when the backend does not know it (nothing started: it gets a workflow)."""
        try:
            start = await workflow.execute_activity_method(
                JobsApi.start_known_job,
                submit_request(job, record.workflow_id, workflow.now()),
                start_to_close_timeout=SUBMIT_TIMEOUT,
                heartbeat_timeout=SUBMIT_HEARTBEAT,
                retry_policy=SUBMIT_RETRY,
            )
        except ActivityError as err:
            rejected = artifact_rejection(err)
            if rejected is not None:  # the evaluated artifact's fault: it scores 0, as invalid
                self.take(rejected_artifact(record.job_id, rejected))
            else:
                error = tool_error_of(err)
                if error.type is ErrorType.invalid_script and self.known_start_checks_syntax:
                    # Refused before it existed, as `jobs_submit`'s own check refuses: no job.
                    del self._s.jobs[record.job_id]
                    if record.reserved_micro_usd:
                        self._s.ledger.release(record.job_id)
                    raise error from None
                self.take(refused_start(record.job_id, error.envelope(), error.message))
            return True
        run = start.run
        if run is None:
            return False
        record.known = run
        record.submitted, record.backend_ref = True, run.ref
        record.created_at, record.replayed = run.created_at, run.replayed
        self.advance_known()
        self._known_poked += 1
        return True

    def advance_known(self) -> bool:
        """Bring every live known job to how its run stands now; True when one changed."""
        changed = False
        for record in live_known(self._s):
            snap = known_snapshot(record, workflow.now())
            if snap is not None:
                changed = self.take(snap) or changed
            if record.final:
                # Its record holds all it ended with: the carry keeps runs of live jobs only.
                record.known = None
        return changed

    async def follow_known(self, changed: Callable[[], Awaitable[None]]) -> None:
        """While known jobs are live, wake at each one's next change and apply it (`changed`
        is told). Runs for the episode's life; it waits without a timer while none is live."""
        while True:
            await workflow.wait_condition(lambda: bool(live_known(self._s)))
            if self.advance_known():
                await changed()
            due = next_known_change(self._s, workflow.now())
            limit = None if due is None else due - workflow.now()
            await wait_until(self._known_poke_since(self._known_poked), limit)

    def _known_poke_since(self, poked: int) -> Callable[[], bool]:
        """True once a known job was started or cancelled after `poked`, or none is live."""
        return lambda: self._known_poked != poked or not live_known(self._s)

    def _storage_hold(self) -> StorageHold | None:
        """What a new agent job's artifact may keep: the episode's storage left, at most the
        job's artifact cap, at the episode's storage price (None: storage is not counted)."""
        terms = self._setup.storage
        left = self._s.ledger.storage_left_bytes
        if terms is None or left is None:
            return None
        return StorageHold(
            bytes=min(terms.artifact_cap_bytes, left),
            micro_usd_per_tb_month=terms.micro_usd_per_tb_month,
            billed_days=terms.billed_days,
        )

    def _visibility_at_start(self, job: JobInput) -> dict[str, Any]:
        """A visible job's memo and first search attributes, given at its start."""
        if not job.visible:
            return {}
        attrs = job_start_attributes(job)
        return {
            "memo": job_memo(job),
            "search_attributes": TypedSearchAttributes(
                [SearchAttributePair(key, value) for key, value in attrs.items()]
            ),
        }

    def take(self, snap: JobSnapshot) -> bool:
        """Apply a job's report; False when it is about no live job of ours. The first report
        of a job whose own workflow was cancelled or terminated through Temporal is kept as an
        operator's action too (state only: no command)."""
        record = self._s.jobs.get(snap.job_id)
        if record is None or record.final:
            return False
        take_snapshot(self._s, record, snap)
        if record.state is JobState.cancelling and record.cancel_requested_at is None:
            record.cancel_requested_at = workflow.now()
        action = outside_job_action(record, snap, workflow.now())
        if action is not None:
            remember_action(self._s, action)
        return True

    async def cancel(self, record: JobRecord) -> None:
        if record.cancel_requested_at is None:
            record.cancel_requested_at = workflow.now()
        if record.known is not None:  # its run, cut now: no workflow to tell
            self.advance_known()
            self._known_poked += 1
            return
        handle = workflow.get_external_workflow_handle(record.workflow_id)
        try:
            await handle.signal(JobWorkflow.cancel)
        except FailureError:
            pass  # the job's workflow already finished; its final snapshot is on the way

    async def retry_cancel(self, record: JobRecord) -> None:
        """Have the job's workflow ask the backend to cancel again now (an operator)."""
        if record.known is not None:
            return  # cancelled when asked: nothing is pending
        handle = workflow.get_external_workflow_handle(record.workflow_id)
        try:
            await handle.signal(JobWorkflow.retry_cancel_now)
        except FailureError:
            workflow.logger.warning(
                "job %s: its workflow is not running; the reconciler restarts it", record.job_id
            )

    async def tell_gone(self, record: JobRecord, reason: str) -> None:
        """Tell the job's workflow an operator attested the job is gone (it stops following)."""
        if record.known is not None:
            return  # no workflow follows it
        handle = workflow.get_external_workflow_handle(record.workflow_id)
        try:
            await handle.signal(JobWorkflow.confirmed_gone, reason)
        except FailureError:
            pass  # its workflow is not running: nothing follows the job any more

    async def cancel_every_live_job(self) -> None:
        for record in list(self._s.jobs.values()):
            if record.live:
                await self.cancel(record)

    def watcher_of(self, job_workflow_id: str) -> str:
        """The watcher shard that follows this job (fixed by the episode's setup)."""
        setup = self._setup
        return watcher_shard_id(setup.watcher_workflow_id, setup.watch_shards, job_workflow_id)

    async def ask_watcher_to_look(self, waited: JobRecord) -> None:
        """Ask the shard that follows the waited job to look now (a `jobs_wait` is pending on
        it). Before WAIT_LOOKS_AT_ONE_SHARD_PATCH every shard of every live job was asked: up to
        10 awaited signals, and 10 looks at a whole shard each, per `jobs_wait`. A known job
        has no watcher: its changes come on time by themselves (`follow_known`)."""
        if waited.known is not None:
            return
        if workflow.patched(WAIT_LOOKS_AT_ONE_SHARD_PATCH):
            shards = [self.watcher_of(waited.workflow_id)]
        else:
            live = self._s.jobs.values()
            shards = sorted({self.watcher_of(r.workflow_id) for r in live if r.live})
        if self._setup.watch_shards <= 1:
            shards = [self._setup.watcher_workflow_id]  # as before sharding, jobs or not
        for shard in shards:
            handle = workflow.get_external_workflow_handle(shard)
            try:
                await handle.signal(SIGNAL_LOOK_NOW)
            except FailureError:
                pass  # that shard is not running, so it follows no job of ours

    async def check_syntax(self, script: str) -> None:
        """Raise ToolError(invalid_script) unless the script parses as the job's Python."""
        python = self._setup.job_python_version or SERVER_PYTHON
        try:
            await workflow.execute_activity_method(
                JobsApi.check_script,
                CheckScript(script=script, python=python),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None

    async def resolve_datasets(self, repo_ids: list[str]) -> list[RepoRef]:
        if not repo_ids:
            return []
        try:
            return await workflow.execute_activity_method(
                JobsApi.resolve_datasets,
                ResolveDatasets(repo_ids=repo_ids, denylist=self._setup.task.dataset_denylist),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None

    # -- the server-wide account -----------------------------------------------------------

    async def _account_reserve(self) -> None:
        caps = self._setup.caps
        if caps.spend_cap_micro_usd is None:
            return
        try:
            await workflow.execute_activity_method(
                EpisodesApi.reserve_server_spend,
                ServerSpend(
                    account_workflow_id=caps.account_workflow_id,
                    episode_id=self._setup.episode_id,
                    committed_micro_usd=self._s.ledger.committed_micro_usd,
                    cap_micro_usd=caps.spend_cap_micro_usd,
                ),
                start_to_close_timeout=READ_TIMEOUT,
                retry_policy=READ_RETRY,
            )
        except ActivityError as err:
            raise tool_error_of(err) from None

    async def account_report(self) -> None:
        caps = self._setup.caps
        if caps.tracked:
            handle = workflow.get_external_workflow_handle(caps.account_workflow_id)
            try:
                await handle.signal(
                    AccountWorkflow.exposure,
                    Exposure(
                        episode_id=self._setup.episode_id,
                        committed_micro_usd=self._s.ledger.committed_micro_usd,
                    ),
                )
            except FailureError:
                pass

    async def account_retire(self) -> None:
        caps = self._setup.caps
        if caps.tracked:
            handle = workflow.get_external_workflow_handle(caps.account_workflow_id)
            try:
                await handle.signal(AccountWorkflow.retire, self._setup.episode_id)
            except FailureError:
                pass
