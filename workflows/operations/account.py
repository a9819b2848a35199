"""AccountWorkflow: the server-wide caps over all live episodes of a namespace and task queue.

`POSTTRAIN_MAX_LIVE_EPISODES` and `POSTTRAIN_SPEND_CAP_USD` (reserved + settled of live
episodes). Episodes are admitted and their reservations checked by Updates (sent from
activities), their exposure reported and their retirement announced by Signals.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from posttrain_env.errors import ErrorType
    from posttrain_env.limits import MAX_TRACKED_EPISODES
    from posttrain_env.models import usd
    from workflows.ids import SIGNAL_EXPOSURE, SIGNAL_RETIRE
    from workflows.operations.account_contract import (
        AccountState,
        Admission,
        Exposure,
        ExposureCheck,
    )

# A cancel of the account from outside (the Temporal UI, `temporal workflow cancel`) is not
# obeyed: the server-wide caps would forget every live episode. It continues as new.
ACCOUNT_OUTSIDE_CANCEL_PATCH = "pt-account-outside-cancel-1"


@workflow.defn
class AccountWorkflow:
    @workflow.init
    def __init__(self, state: AccountState) -> None:
        self._live = dict(state.live)

    @workflow.run
    async def run(self, state: AccountState) -> None:
        try:
            await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        except asyncio.CancelledError:
            if not workflow.patched(ACCOUNT_OUTSIDE_CANCEL_PATCH):
                raise
            workflow.logger.warning(
                "the server-wide account was cancelled from outside; it goes on with %d live "
                "episodes (it is never cancelled: the caps would forget them)",
                len(self._live),
            )
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self.resume_input())

    @workflow.query
    def resume_input(self) -> AccountState:
        """What a new run needs to go on from here (the reconciler merges it into the running
        account when this run was terminated from outside)."""
        return AccountState(live=dict(self._live))

    @workflow.update
    def admit(self, admission: Admission) -> None:
        if admission.episode_id in self._live:
            return
        # The carry holds every live episode: bounded even when no count is set.
        limit = min(admission.max_live_episodes or MAX_TRACKED_EPISODES, MAX_TRACKED_EPISODES)
        if len(self._live) >= limit:
            raise ApplicationError(
                f"the server runs its maximum of {limit} live episodes; try again when one ends",
                {"limit": limit},
                type=ErrorType.limit_reached.value,
                non_retryable=True,
            )
        cap = admission.spend_cap_micro_usd
        if cap is not None and sum(self._live.values()) >= cap:
            raise ApplicationError(
                f"the server-wide spend cap of ${usd(cap):.6f} is used by live episodes; try "
                "again when one ends",
                {"cap_usd": usd(cap)},
                type=ErrorType.budget_exhausted.value,
                non_retryable=True,
            )
        self._live[admission.episode_id] = 0

    @workflow.update
    def check_exposure(self, check: ExposureCheck) -> None:
        """Accept the episode's new committed total unless the server-wide cap is exceeded."""
        others = sum(v for k, v in self._live.items() if k != check.episode_id)
        if others + check.committed_micro_usd > check.cap_micro_usd:
            raise ApplicationError(
                f"the server-wide spend cap of ${usd(check.cap_micro_usd):.6f} would be "
                "exceeded; wait for running jobs to finish or use a shorter timeout",
                {"cap_usd": usd(check.cap_micro_usd)},
                type=ErrorType.budget_exhausted.value,
                non_retryable=True,
            )
        self._live[check.episode_id] = check.committed_micro_usd

    @workflow.signal(name=SIGNAL_EXPOSURE)
    def exposure(self, exposure: Exposure) -> None:
        if exposure.episode_id in self._live:
            self._live[exposure.episode_id] = exposure.committed_micro_usd

    @workflow.signal
    def adopt(self, exposure: Exposure) -> None:
        """A live episode a terminated run of the account counted (the reconciler)."""
        self._live.setdefault(exposure.episode_id, exposure.committed_micro_usd)

    @workflow.signal(name=SIGNAL_RETIRE)
    def retire(self, episode_id: str) -> None:
        self._live.pop(episode_id, None)

    @workflow.query
    def live(self) -> dict[str, int]:
        return dict(self._live)
