"""A stand-in episode workflow for the reaper tests (its own module: the workflow sandbox
re-imports a workflow's module, and the test modules import huggingface_hub)."""

from __future__ import annotations

from temporalio import workflow


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
