"""What a job is started with: its one uploaded file, its volumes, and the checks that keep every
secret out of it (DESIGN §6).

Every job runs the launcher: an agent job with the agent's script embedded in it, a dev or
grader evaluation with the task's evaluator. `run_uv_job` uploads that file to the namespace's
`jobs-artifacts` bucket and mounts the job's folder read-write at `/data`. Everything else is
mounted read-only: the base model at `/base_model` and each dataset at `/datasets/<repo_id>`,
both at pinned commits, and, for an evaluation, the evaluated job's `outputs/` folder at
`/model`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from huggingface_hub import Volume, constants

from activities.backends.hf.inputs import repo_id_problem
from activities.backends.interface import JobRequest
from activities.jobs.activities import HIDDEN_SEED_SECRET
from job_launcher.builder import LauncherConfig, build_launcher
from job_launcher.requirements import script_exclude_newer
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.errors import ErrorType, ToolError

BASE_MODEL_MOUNT = "/base_model"
DATASETS_MOUNT = "/datasets"
ARTIFACT_MOUNT = "/model"
OUTPUTS = "outputs"  # the launcher's `<data_dir>/outputs`: the only folder a job writes
LAUNCHER_FILE = "launcher.py"
# Names a job's environment may never carry, whatever their value.
_TOKEN_NAME = re.compile(r"TOKEN|HF_|HUGGING_?FACE|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _refuse(why: str) -> ToolError:
    return ToolError(ErrorType.hf_error, f"the broker refused to start this job: {why}")


def check_request(request: JobRequest, token: str) -> None:
    """Refuse a request that would hand a job a secret it must not have (a broker bug, never
    the agent's doing: ToolError(hf_error), not retried)."""
    if request.role is JobRole.grader:
        if set(request.secrets) != {HIDDEN_SEED_SECRET}:
            raise _refuse(f"a grader job gets exactly one secret, {HIDDEN_SEED_SECRET}")
    elif request.secrets:
        raise _refuse(f"{request.role.value} jobs get no secrets")
    for name in request.env:
        if _TOKEN_NAME.search(name):
            raise _refuse(f"environment variable {name!r} is not allowed in a job")
    if token:
        carried = [request.script, *request.env.values(), *request.secrets.values()]
        carried += [request.job_id, request.episode_id, request.task_id, *request.dependencies]
        if any(token in text for text in carried):
            raise _refuse("the broker's token appeared in the job's script or environment")
    for ref in [request.base_model, *request.datasets]:
        problem = repo_id_problem(ref.repo_id)
        if problem or not _COMMIT.fullmatch(ref.revision):
            raise _refuse(f"{ref.repo_id!r}@{ref.revision!r} is not a repo pinned to a commit")


def job_file(request: JobRequest, launcher: LauncherConfig, python: str) -> tuple[str, str]:
    """(file name, text) of the one file the job runs on Python `python` (the image's): the
    launcher, with the agent's script or, for an evaluation, the task's evaluator embedded
    (DESIGN §6 item 4: every job runs under it). The evaluator's PEP 723 dependencies are
    installed from wheels and its `exclude-newer` honoured, as `uv run` would; the launcher
    hands it the nonce, the task's parameters and a grader's seed from the job's environment
    and secrets. Raises ToolError(invalid_script or invalid_dependency) for an agent script
    the launcher refuses."""
    if request.role is JobRole.agent:
        text = build_launcher(request.script, request.dependencies, launcher, python=python)
        return LAUNCHER_FILE, text
    if not request.script:
        raise _refuse("the evaluation has no evaluator script")
    config = replace(
        launcher,
        pass_env=tuple(sorted({*request.env, *request.secrets})),
        exclude_newer=script_exclude_newer(request.script),
    )
    return LAUNCHER_FILE, build_launcher(request.script, [], config, python=python)


def input_volumes(request: JobRequest) -> list[Volume]:
    """The read-only, pinned repo mounts every job gets (repo mounts are read-only on the Hub;
    `read_only=True` says so explicitly anyway)."""
    model = request.base_model
    volumes = [
        Volume(
            type="model",
            source=model.repo_id,
            mount_path=BASE_MODEL_MOUNT,
            revision=model.revision,
            read_only=True,
        )
    ]
    for dataset in request.datasets:
        volumes.append(
            Volume(
                type="dataset",
                source=dataset.repo_id,
                mount_path=f"{DATASETS_MOUNT}/{dataset.repo_id}",
                revision=dataset.revision,
                read_only=True,
            )
        )
    return volumes


def artifacts_bucket(namespace: str) -> str:
    return f"{namespace}/{constants.HF_JOBS_ARTIFACTS_BUCKET_NAME}"


def outputs_prefix(folder: str) -> str:
    return f"{folder}/{OUTPUTS}"


def artifact_volume(namespace: str, folder: str) -> Volume:
    """The evaluated job's outputs, and nothing else of the bucket, read-only at /model."""
    return Volume(
        type="bucket",
        source=artifacts_bucket(namespace),
        mount_path=ARTIFACT_MOUNT,
        path=outputs_prefix(folder),
        read_only=True,
    )


def job_name(request: JobRequest) -> str:
    """The job's `name` label (the library would otherwise derive one from the file name)."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", request.job_id)[:60]
    return f"posttrain-{request.role.value}-{safe}"
