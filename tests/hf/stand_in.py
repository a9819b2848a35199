"""Workflows for the hf tests: a stand-in episode for the reaper tests, and one activity attempt
(their own module: the workflow sandbox re-imports a workflow's module, and the test modules
import huggingface_hub)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy


@workflow.defn
class StandInEpisode:
    """An episode workflow as the reaper sees one: running until told to finish."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.run
    async def run(self, finish_now: bool) -> None:
        await workflow.wait_condition(lambda: finish_now or self._finish)

    @workflow.signal
    def finish(self) -> None:
        self._finish = True


@workflow.defn
class OneAttempt:
    """Runs one attempt of the activity named `activity`, under `timeout_s` start-to-close,
    and returns what it returns (a timeout fails the workflow)."""

    @workflow.run
    async def run(self, activity: str, timeout_s: float) -> float:
        return await workflow.execute_activity(
            activity,
            start_to_close_timeout=timedelta(seconds=timeout_s),
            retry_policy=RetryPolicy(maximum_attempts=1),
            result_type=float,
        )
