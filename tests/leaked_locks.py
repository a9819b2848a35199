"""Release the time-skipping locks the test server leaks when a child closes after its parent.

The time-skipping test server (temporal-test-server 1.40) takes a lock when a child workflow
closes, for its parent to release as it records the child's end. A parent run that has already
closed never records it, so the lock is never released (temporalio/sdk-java#2642, open; the
server applies no ABANDON either). From then on every skip passes in real time: a campaign
test whose jobs run 30 minutes of workflow time then runs them in real time and misses its
deadline. Our workflows start children with ABANDON, and closing after the parent is normal
for them (an episode writes its audit record after telling its rollout it ended; a job may end
after its episode), so the race is ours to live with; a real server takes no such lock.

`LeakedLocks.release()` finds every such close exactly: a closed child whose parent run has
closed without recording the child's end. It looks only at closes it has not judged before,
and reads a parent's history once it is closed (a closed history no longer changes).
`LeakedLocks.skip()` keeps releasing while a skip is in flight (`watching`): a lock leaked
in the middle of a skip would otherwise make the rest of it pass in real time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.api.testservice.v1 import SleepRequest, UnlockTimeSkippingRequest
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    ListClosedWorkflowExecutionsRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

# The events in which a parent records its child's end.
CHILD_END_EVENTS = {
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT,
}
PAGE_SIZE = 1000
CONTINUED_AS_NEW = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW
WATCH_PERIOD_S = 0.5
NO_ANSWER = {RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.CANCELLED}

SKIP_DEADLINE = timedelta(minutes=5)

Run = tuple[str, str]  # (workflow id, run id)


def nothing_locked(err: RPCError) -> bool:
    """The test server's answer to an unlock with no lock held: its "unbalanced lock and
    unlock" exception, which gRPC-Java sends as UNKNOWN "Application error processing RPC"."""
    return err.status is RPCStatusCode.UNKNOWN and "Application error processing RPC" in str(err)


async def skip_time(
    client: Client, duration: timedelta, deadline: timedelta = SKIP_DEADLINE
) -> None:
    """`WorkflowEnvironment.sleep` with a deadline of minutes: the server skips time once the
    tasks in flight are done, which on a loaded machine (or at 10,000 jobs) outlasts the SDK's
    default RPC deadline ("Timeout expired")."""
    request = SleepRequest()
    request.duration.FromTimedelta(duration)
    await client.test_service.unlock_time_skipping_with_sleep(request, timeout=deadline)


@dataclass(frozen=True)
class _Described:
    closed: bool
    parent: Run | None


class LeakedLocks:
    def __init__(self, client: Client, period_s: float = WATCH_PERIOD_S) -> None:
        """`period_s`: how often `watching` looks for leaks."""
        self._client = client
        self._period_s = period_s
        self._judged: set[Run] = set()  # closed runs already looked at
        self._parents: dict[Run, Run | None] = {}  # closed run -> its parent's run
        self._ended_children: dict[Run, set[str]] = {}  # closed parent run -> children it saw end
        self.released = 0

    async def release(self) -> int:
        """Release one lock for each child seen closed after its parent since the last call;
        return how many."""
        leaked = 0
        for child, parent in await self._new_closes():
            if child[0] not in await self._children_ended_by(parent):
                # A deadline of minutes: a release cut short on a loaded machine may still
                # have been applied, and could then be neither counted nor tried again.
                try:
                    await self._client.test_service.unlock_time_skipping(
                        UnlockTimeSkippingRequest(), timeout=SKIP_DEADLINE
                    )
                except RPCError as err:
                    if not nothing_locked(err):
                        raise
                    # No lock is held at all, so time skips: nothing is left to release (a
                    # release whose answer was lost had been applied after all). CI's default
                    # set once failed on this answer.
                else:
                    leaked += 1
                    self.released += 1  # counted as it is applied: a later call may fail
            # Judged once decided: a call that fails before leaves it for the next one.
            self._judged.add(child)
        return leaked

    async def skip(self, duration: timedelta, deadline: timedelta = SKIP_DEADLINE) -> None:
        """`skip_time`, releasing leaked locks while it is in flight."""
        async with self.watching():
            await skip_time(self._client, duration, deadline)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Release leaked locks every `period_s` while the body runs (a skip)."""

        async def watch() -> None:
            while True:
                try:
                    await self.release()
                except RPCError as err:  # no answer in time on a loaded machine: next period
                    if err.status not in NO_ANSWER:
                        raise
                await asyncio.sleep(self._period_s)

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            if watcher.done():
                watcher.result()  # it failed: say why
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher

    async def _new_closes(self) -> list[tuple[Run, Run]]:
        """Closed children not judged yet whose parent run has closed, each with its parent's
        run. A child whose parent is still open is left for a later call: the parent may yet
        record its end."""
        judged: list[tuple[Run, Run]] = []
        for run in await self._closed_runs():
            if run in self._judged:
                continue
            if run not in self._parents:  # the listing leaves the parent out: describe has it
                self._parents[run] = (await self._describe(run)).parent
            parent = self._parents[run]
            if parent is None:
                self._judged.add(run)
            elif parent in self._ended_children or (await self._describe(parent)).closed:
                judged.append((run, parent))
        return judged

    async def _closed_runs(self) -> list[Run]:
        runs: list[Run] = []
        page = b""
        while True:
            listed = await self._client.workflow_service.list_closed_workflow_executions(
                ListClosedWorkflowExecutionsRequest(
                    namespace=self._client.namespace,
                    maximum_page_size=PAGE_SIZE,
                    next_page_token=page,
                )
            )
            runs.extend(
                (info.execution.workflow_id, info.execution.run_id)
                for info in listed.executions
                # A run that continued as new has not ended for its parent: the chain goes on.
                if info.status != CONTINUED_AS_NEW
            )
            page = listed.next_page_token
            if not page:
                return runs

    async def _describe(self, run: Run) -> _Described:
        described = await self._client.workflow_service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(
                namespace=self._client.namespace,
                execution=WorkflowExecution(workflow_id=run[0], run_id=run[1]),
            )
        )
        info = described.workflow_execution_info
        parent = info.parent_execution
        return _Described(
            closed=info.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING,
            parent=(parent.workflow_id, parent.run_id) if parent.workflow_id else None,
        )

    async def _children_ended_by(self, parent: Run) -> set[str]:
        """The children whose end the closed parent run recorded."""
        if parent not in self._ended_children:
            handle = self._client.get_workflow_handle(parent[0], run_id=parent[1])
            ended: set[str] = set()
            async for event in handle.fetch_history_events():
                if event.event_type in CHILD_END_EVENTS:
                    attributes = getattr(event, _attributes_field(event.event_type))
                    ended.add(attributes.workflow_execution.workflow_id)
            self._ended_children[parent] = ended
        return self._ended_children[parent]


def _attributes_field(event_type: EventType.ValueType) -> str:
    """`EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED` ->
    `child_workflow_execution_completed_event_attributes`."""
    name = EventType.Name(event_type).removeprefix("EVENT_TYPE_").lower()
    return f"{name}_event_attributes"
