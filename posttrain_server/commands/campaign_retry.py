"""`posttrain-env campaign retry <id> --only unscored|errors`: new attempts for those rollouts.

A running campaign takes the `retry` update. One that has ended (`completed` or
`budget_stopped`) is started again under the same id with `reopen`: it rebuilds its counters
from its records and runs only the retries (see `workflows/campaign/workflow.py`). Both paths pick
the
rollouts inside the workflow, from the records, so two `retry` at once never give a rollout two
new attempts, and no attempt that ran runs again (a new attempt has a new workflow id).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.client import Client

    from posttrain_common.campaigns.retry import RetryOnly
    from workflows.campaign.contract import RetryAnswer

# A campaign that ended in one of these can be taken up again; not one cancelled or invalid.
REOPENABLE = ("completed", "budget_stopped")
TRIES = 3
ANSWER_POLL_S = 0.5


class RetryRefused(Exception):
    """The campaign cannot take retries; the message says why."""


async def retry_campaign(
    client: Client,
    campaign_id: str,
    only: RetryOnly,
    *,
    campaign_root: Path,
    task_queue: str,
    agent_task_queue: str,
) -> RetryAnswer:
    """Queue the retries; what was queued. Raises RetryRefused."""
    from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError, RPCStatusCode

    from posttrain_common.campaigns.records import CampaignMeta, read_records
    from posttrain_common.campaigns.retry import pick_retries
    from posttrain_common.campaigns.spec import CampaignSpec
    from workflows.campaign.contract import CampaignInput, Reopen, RetryAnswer, RetryRequest
    from workflows.campaign.workflow import CampaignWorkflow
    from workflows.ids import campaign_workflow_id

    request = RetryRequest(only=only)
    workflow_id = campaign_workflow_id(campaign_id)
    handle = client.get_workflow_handle_for(CampaignWorkflow.run, workflow_id)
    for _ in range(TRIES):
        try:
            return await handle.execute_update(CampaignWorkflow.retry, request)
        except WorkflowUpdateFailedError:
            pass  # ending, or ended between two runs: wait for its end below
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise
        # It has ended (or is ending): take it up again from its records.
        try:
            final = await handle.result()
        except WorkflowFailureError as err:  # terminated or failed: its end is unknown
            raise RetryRefused(f"campaign {campaign_id} did not end normally: {err}") from None
        if final.phase.value not in REOPENABLE:
            raise RetryRefused(
                f"campaign {campaign_id} ended {final.phase.value}: nothing to retry"
            )
        folder = campaign_root / campaign_id
        try:
            meta = CampaignMeta.model_validate_json((folder / "campaign.json").read_bytes())
        except FileNotFoundError:
            raise RetryRefused(
                f"no campaign.json in {folder} (is POSTTRAIN_CAMPAIGNS_DIR set?)"
            ) from None
        spec = CampaignSpec.model_validate(meta.spec)
        if not pick_retries(spec, read_records(folder), only):
            # Nothing selected: no need to start it again (the workflow would pick none).
            return RetryAnswer(only=only, queued=0)
        try:
            await client.start_workflow(
                CampaignWorkflow.run,
                CampaignInput(
                    campaign_id=campaign_id,
                    spec=spec,
                    agent_task_queue=agent_task_queue,
                    reopen=Reopen(created_at=final.created_at, budget_stop=final.budget_stop),
                    retry=request,
                ),
                id=workflow_id,
                task_queue=task_queue,
                # `run` refuses a used id; taking the same campaign up again is what this is.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            continue  # another `retry` took it up first: ask that run
        while True:
            status = await handle.query(CampaignWorkflow.status)
            if status.last_retry is not None or status.phase.final:
                return status.last_retry or RetryAnswer(only=only, queued=0)
            await asyncio.sleep(ANSWER_POLL_S)
    raise RetryRefused(f"campaign {campaign_id} kept ending and starting: try again")
