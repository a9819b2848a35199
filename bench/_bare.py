"""The baseline of bench/tool_latency.py: a trivial workflow whose update returns its argument.

In its own module because workflows cannot be defined in `__main__` (the sandbox refuses them).
"""

from __future__ import annotations

from temporalio import workflow


@workflow.defn
class BareWorkflow:
    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)
        await workflow.wait_condition(workflow.all_handlers_finished)

    @workflow.update
    async def echo(self, value: str) -> str:
        return value

    @workflow.signal
    def finish(self) -> None:
        self._done = True
