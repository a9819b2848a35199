"""The deployment's server key, resolved once per process from the settings, and checked against
the fingerprint every other process of the deployment recorded (docs/security.md, "One
key per deployment").

- `POSTTRAIN_SERVER_KEY_FILE` or `POSTTRAIN_SERVER_KEY` (at most one; `Settings` refuses both):
  that key.
- Neither, on the embedded Temporal (no `TEMPORAL_ADDRESS`): `<state_dir>/server.key`, created
  on first use. Every process of such a deployment runs on this machine, on one state dir.
- Neither, with `TEMPORAL_ADDRESS`: refused. Processes on other machines would each create a
  key of their own, and a score line one worker's grader wrote would not verify on another (the
  reward silently 0).

Then `check_deployment` starts or finds the task queue's `DeploymentWorkflow` and compares the
fingerprint in its memo with this key's: a process with another key refuses to start. Both raise
`ServerKeyError`, which the entry points turn into exit status 2 with its message.

The gateway imports this module too: nothing here loads a backend or an activity.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError

from posttrain_common.failures import workflow_is_gone
from posttrain_common.keys import KEY_FILE_SETTING, KEY_HEX_SETTING, ServerKey, ServerKeyError
from posttrain_common.settings import Settings
from workflows.operations.deployment import (
    MEMO_KEY_FINGERPRINT,
    DeploymentInput,
    DeploymentWorkflow,
    deployment_workflow_id,
)


@dataclass(frozen=True)
class DeploymentKey:
    key: ServerKey
    # Where the key came from, for messages: a setting (and the file), or the implicit file.
    source: str

    @property
    def fingerprint(self) -> str:
        return self.key.fingerprint()


class DeploymentKeyMismatch(ServerKeyError):
    """This process's key is not the one the deployment recorded."""


def resolve_server_key(settings: Settings) -> DeploymentKey:
    """This process's server key. Raises ServerKeyError naming the setting to fix."""
    if settings.server_key_file is not None:
        path = settings.server_key_file.expanduser()
        return DeploymentKey(ServerKey.from_file(path), f"{KEY_FILE_SETTING}={path}")
    if settings.server_key is not None:
        key = ServerKey.from_hex(settings.server_key.get_secret_value())
        return DeploymentKey(key, KEY_HEX_SETTING)
    if settings.temporal_is_external:
        raise ServerKeyError(
            f"TEMPORAL_ADDRESS is set but no server key is given: set {KEY_FILE_SETTING} to the "
            "deployment's key file (the same file on every gateway and worker; "
            f"`posttrain-env key new PATH` makes one), or {KEY_HEX_SETTING} to the key in hex. "
            "With an external Temporal no key is ever created implicitly: processes on other "
            "machines would each make their own, and their graders' scores would not verify"
        )
    path = settings.server_key_path
    return DeploymentKey(
        ServerKey.load_or_create(path), f"{path} (the state dir's; {KEY_FILE_SETTING} unset)"
    )


async def check_deployment(client: Client, task_queue: str, key: DeploymentKey) -> None:
    """Start the deployment's `DeploymentWorkflow` with this key's fingerprint, or find the one
    that runs, and compare. Raises DeploymentKeyMismatch naming both fingerprints."""
    workflow_id = deployment_workflow_id(client.namespace, task_queue)
    handle = await client.start_workflow(
        DeploymentWorkflow.run,
        DeploymentInput(key_fingerprint=key.fingerprint),
        id=workflow_id,
        task_queue=task_queue,
        memo={MEMO_KEY_FINGERPRINT: key.fingerprint},
        # Another process started it first: its fingerprint is the deployment's.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # Terminated for a new key (`posttrain-env key forget`): the next start records it.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    description = await handle.describe()
    recorded = await description.memo_value(MEMO_KEY_FINGERPRINT, None, type_hint=str)
    if recorded != key.fingerprint:
        raise DeploymentKeyMismatch(
            f"the server key of this process ({key.source}, fingerprint {key.fingerprint}) is "
            f"not the deployment's: the deployment on task queue {task_queue!r} of namespace "
            f"{client.namespace!r} was started with the key of fingerprint {recorded}. Give "
            f"every gateway and worker the same {KEY_FILE_SETTING} (or {KEY_HEX_SETTING}); to "
            "change the deployment's key, stop every process and run `posttrain-env key forget` "
            '(docs/security.md, "One key per deployment")'
        )


async def forget_deployment(client: Client, task_queue: str) -> bool:
    """Terminate the deployment's workflow, so that the next process to start records its own
    key's fingerprint. False when none was running."""
    handle = client.get_workflow_handle(deployment_workflow_id(client.namespace, task_queue))
    try:
        await handle.terminate("posttrain-env key forget: the deployment's key changes")
    except RPCError as err:
        if workflow_is_gone(err):
            return False
        raise
    return True
