"""The labels every Hugging Face job of ours carries, and the backend ref that names a job.

Labels are how the backend finds its own jobs again: by idempotency key (a retried submit), by
deployment (the watcher's one listing call, the orphan reaper). Hub label keys and values hold at
most 100 characters of `[A-Za-z0-9_-]`, so anything else (a workflow id has `/` in it) is hashed.

The ref is opaque to everyone but this backend, and crosses workflow history: it holds the
namespace the job runs in, the Hub's job id and the job's folder in that namespace's
`jobs-artifacts` bucket (`run_uv_job` uploads the script to `<folder>/` and mounts that folder
at `/data`, so `/data/outputs` is `<folder>/outputs/`), never anything secret.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from huggingface_hub import JobInfo, constants

from activities.backends.interface import JobRequest
from posttrain_common.contracts.jobs import JobRole, KeepOutputs
from posttrain_common.keys import ServerKey

LABEL_DEPLOYMENT = "posttrain-deployment"
LABEL_KEY = "posttrain-key"
LABEL_EPISODE = "posttrain-episode"
LABEL_TASK = "posttrain-task"
LABEL_ROLE = "posttrain-role"
LABEL_JOB = "posttrain-job"
LABEL_TIMEOUT = "posttrain-timeout-s"
# An agent job's caps on what its outputs may keep (bytes), so that the look that sees it ended
# measures them (activities/backends/hf/backend.py, `observe`) with no activity of its own.
LABEL_ARTIFACT_CAP = "posttrain-artifact-cap"
LABEL_STORAGE_LEFT = "posttrain-storage-left"
LABEL_STORAGE_CAP = "posttrain-storage-cap"

_LABEL_VALUE = re.compile(r"[A-Za-z0-9_-]{1,100}")
_JOB_ID = re.compile(r"[A-Za-z0-9]{1,64}")
_FOLDER = re.compile(r"[A-Za-z0-9._-]{1,128}")
# A Hub user or organization name (a bucket id's first part).
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def _digest(purpose: str, value: str, length: int = 40) -> str:
    return hashlib.sha256(f"{purpose}\0{value}".encode()).hexdigest()[:length]


def key_label(key: str) -> str:
    """The idempotency label of the job whose workflow id is `key` (always hashed: fixed shape)."""
    return "k" + _digest("posttrain-key", key)


def label_value(value: str) -> str:
    """`value` itself when the Hub accepts it as a label value, otherwise a hash of it."""
    return value if _LABEL_VALUE.fullmatch(value) else "h" + _digest("posttrain-label", value)


def deployment_id(key: ServerKey) -> str:
    """This deployment's label value: derived from the server key that every process of one
    deployment holds (docs/security.md, "One key per deployment"), so two deployments sharing a
    Hugging
    Face namespace never watch, adopt or reap each other's jobs. The key itself never leaves."""
    return key.deployment_label()


def job_labels(request: JobRequest, deployment: str) -> dict[str, str]:
    labels = {
        LABEL_DEPLOYMENT: deployment,
        LABEL_KEY: key_label(request.key),
        LABEL_EPISODE: label_value(request.episode_id),
        LABEL_TASK: label_value(request.task_id),
        LABEL_ROLE: request.role.value,
        LABEL_JOB: label_value(request.job_id),
        LABEL_TIMEOUT: str(int(request.timeout_s)),
    }
    allowance = request.storage_allowance_bytes
    if request.role is JobRole.agent and allowance is not None:
        labels[LABEL_ARTIFACT_CAP] = str(request.artifact_cap_bytes or allowance)
        labels[LABEL_STORAGE_LEFT] = str(allowance)
        if request.storage_cap_bytes is not None:
            labels[LABEL_STORAGE_CAP] = str(request.storage_cap_bytes)
    return labels


def outputs_caps(labels: dict[str, str] | None, ref: str, now: datetime) -> KeepOutputs | None:
    """The caps an agent job's labels carry (None: not an agent job's, or no storage counted)."""
    labels = labels or {}
    try:
        cap, left = int(labels[LABEL_ARTIFACT_CAP]), int(labels[LABEL_STORAGE_LEFT])
        whole = int(labels[LABEL_STORAGE_CAP]) if LABEL_STORAGE_CAP in labels else None
    except (KeyError, ValueError):
        return None
    return KeepOutputs(
        ref=ref,
        key=labels.get(LABEL_KEY, ""),
        now=now,
        artifact_cap_bytes=cap,
        storage_allowance_bytes=left,
        storage_cap_bytes=whole,
    )


@dataclass(frozen=True)
class HfRef:
    """A job as this backend names it: `<namespace>/<hub job id>[:<artifacts folder>]`.

    The namespace is the one the job was started in, and every later call on the job uses it,
    so a change of POSTTRAIN_NAMESPACE (or of the token's user) while jobs run never loses one.
    Refs made before the namespace was stored (`<hub job id>[:<folder>]`) still decode, with
    `namespace=None`: calls on them use the backend's current namespace, as they always did.
    """

    job_id: str
    folder: str | None = None
    namespace: str | None = None

    def encode(self) -> str:
        ref = self.job_id if self.namespace is None else f"{self.namespace}/{self.job_id}"
        return ref if self.folder is None else f"{ref}:{self.folder}"

    @classmethod
    def decode(cls, ref: str) -> HfRef:
        """Raises ValueError for a ref this backend did not make."""
        named, _, folder = ref.partition(":")
        namespace, _, job_id = named.rpartition("/")
        if (
            not _JOB_ID.fullmatch(job_id)
            or (folder and not _FOLDER.fullmatch(folder))
            or ("/" in named and not _NAMESPACE.fullmatch(namespace))
        ):
            raise ValueError(f"not a Hugging Face job ref: {ref!r}")
        return cls(job_id, folder or None, namespace or None)

    @classmethod
    def of(cls, info: JobInfo, namespace: str) -> HfRef:
        return cls(info.id, artifacts_folder(info), namespace)


def carries(info: JobInfo, labels: dict[str, str]) -> bool:
    """True when the job carries every one of `labels`. The Hub's `label=` filter is a request,
    not a guarantee (a server may ignore it or lag): every listing is checked again here, so a
    job without this deployment's labels is never adopted, watched or reaped."""
    own = info.labels or {}
    return all(own.get(key) == value for key, value in labels.items())


def artifacts_folder(info: JobInfo) -> str | None:
    """The job's folder in the `jobs-artifacts` bucket: the path of its `/data` bucket volume."""
    for volume in info.volumes or []:
        if (
            volume.type == "bucket"
            and volume.mount_path == constants.HF_JOBS_ARTIFACTS_MOUNT_PATH
            and volume.source.endswith("/" + constants.HF_JOBS_ARTIFACTS_BUCKET_NAME)
            and volume.path
            and _FOLDER.fullmatch(volume.path.strip("/"))
        ):
            return volume.path.strip("/")
    return None


def timeout_of(info: JobInfo) -> int | None:
    """The timeout we gave the job, from its label (JobInfo itself does not carry it)."""
    value = (info.labels or {}).get(LABEL_TIMEOUT, "")
    return int(value) if value.isdigit() else None
