"""When a long-lived workflow (episode, rollout, campaign) should continue as new."""

from __future__ import annotations

from temporalio import workflow


def history_is_long(max_bytes: int, max_events: int | None) -> bool:
    """Past `max_bytes` of history (Temporal terminates a workflow whose history reaches
    50 MB), past `max_events` when it is set (tests lower it to exercise the path), and
    otherwise when Temporal suggests it."""
    info = workflow.info()
    if info.get_current_history_size() >= max_bytes:
        return True
    if max_events is not None:
        return info.get_current_history_length() >= max_events
    return info.is_continue_as_new_suggested()
