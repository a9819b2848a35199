"""DeploymentWorkflow: where a deployment records its server key's fingerprint, so that every
process (gateway, worker, all-in-one server) can check at start that it holds the same key as
the others (docs/security.md, "One key per deployment"; posttrain_server/deployment_key.py).

One per Temporal namespace and task queue, started by whichever process comes first with
`USE_EXISTING`, found by the others. The fingerprint is in its memo (read by describe, which
needs no worker) and its input. It waits forever on nothing: its history is its start and one
workflow task, never more. Terminating it (`posttrain-env key forget`) lets the next process to
start record a new key's fingerprint.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.operations.deployment_contract import DeploymentInput

# The memo field that holds the fingerprint.
MEMO_KEY_FINGERPRINT = "key_fingerprint"


def deployment_workflow_id(namespace: str, task_queue: str) -> str:
    return f"posttrain-deployment/{namespace}/{task_queue}"


@workflow.defn
class DeploymentWorkflow:
    @workflow.run
    async def run(self, given: DeploymentInput) -> None:
        # Nothing to do, ever: no timer, no activity, so the history never grows.
        await workflow.wait_condition(lambda: False)
