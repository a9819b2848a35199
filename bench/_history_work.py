"""Where a bench level's history events and workflow tasks go, by workflow type: every event
of every workflow of the namespace whose time falls in the level's window (so long-lived
workflows, a session or a watcher shard, count only what the level added to them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


@dataclass
class HistoryWork:
    events: Counter[str] = field(default_factory=Counter)  # by workflow type
    tasks: Counter[str] = field(default_factory=Counter)  # workflow tasks completed, by type
    kinds: Counter[str] = field(default_factory=Counter)  # events by workflow type and kind

    def per(self, n: int) -> HistoryWork:
        """Per one of `n` (rollouts)."""
        n = max(1, n)
        return HistoryWork(
            Counter({k: v / n for k, v in self.events.items()}),  # type: ignore[misc]
            Counter({k: v / n for k, v in self.tasks.items()}),  # type: ignore[misc]
            Counter({k: v / n for k, v in self.kinds.items()}),  # type: ignore[misc]
        )

    def line(self) -> str:
        """`events E (type e, ...), workflow tasks T (type t, ...)`."""
        events = ", ".join(f"{k} {v:.1f}" for k, v in self.events.most_common())
        tasks = ", ".join(f"{k} {v:.1f}" for k, v in self.tasks.most_common())
        return (
            f"history events {sum(self.events.values()):.1f} ({events}); "
            f"workflow tasks {sum(self.tasks.values()):.1f} ({tasks})"
        )


async def history_work(address: str, since: float, until: float) -> HistoryWork:
    """The events of every workflow run whose time is in [since, until] (unix seconds)."""
    client = await Client.connect(address)
    work = HistoryWork()
    async for execution in client.list_workflows():
        closed = execution.close_time
        if closed is not None and closed.timestamp() < since:
            continue
        if execution.start_time.timestamp() > until:
            continue
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        kind = execution.workflow_type
        for event in history.events:
            at = event.event_time.ToMicroseconds() / 1e6
            if since <= at <= until:
                work.events[kind] += 1
                name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
                work.kinds[f"{kind}:{name}"] += 1
                if event.event_type == COMPLETED:
                    work.tasks[kind] += 1
    return work
