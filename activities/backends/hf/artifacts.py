"""`/model` for an evaluation: the evaluated job's `outputs/` folder in the namespace's
`jobs-artifacts` bucket, mounted read-only, and nothing else of the bucket.

Before it is mounted, the folder's size is checked against the task's artifact cap (Hugging Face
cannot stop a job at the cap while it writes, so the cap is enforced here, before any evaluation
reads the artifact). An empty folder gets a placeholder file: mounting a missing folder fails
the job, which would count as an infrastructure fault (`score_failed`), whereas an empty artifact
is the agent's doing and scores 0.

The folder is listed by an exact prefix, `<folder>/outputs/` with its slash, and every entry is
checked against it again: the Hub matches prefixes character by character, so without the slash
`/data/outputs.log` or `/data/outputs_x/` would count against the cap and hide an empty folder.
"""

from __future__ import annotations

from huggingface_hub import HfApi, Volume
from huggingface_hub.errors import BucketNotFoundError

from activities.backends.hf.calls import HubCalls
from activities.backends.hf.labels import HfRef
from activities.backends.hf.submission import artifact_volume, artifacts_bucket, outputs_prefix
from activities.backends.interface import ArtifactRejected
from posttrain_env.errors import ErrorType, ToolError

GIB = 1024**3


async def evaluated_outputs(
    calls: HubCalls, api: HfApi, namespace: str, evaluated: HfRef | None, cap_bytes: int
) -> Volume:
    """The read-only `/model` volume of an evaluation of `evaluated`. Raises ToolError:
    hf_error when the job or its folder is unknown; ArtifactRejected when it is over the cap."""
    if evaluated is None:
        raise ToolError(ErrorType.hf_error, "the evaluation names no job of this backend")
    if evaluated.folder is None:
        raise ToolError(
            ErrorType.hf_error, f"the outputs of Hugging Face job {evaluated.job_id} are not found"
        )
    # The evaluated job's own namespace: it may differ from today's (a setting changed).
    namespace = evaluated.namespace or namespace
    bucket, prefix = artifacts_bucket(namespace), outputs_prefix(evaluated.folder) + "/"
    try:
        entries = await calls.listing(
            f"listing the outputs of job {evaluated.job_id}",
            api.list_bucket_tree,
            bucket,
            prefix=prefix,
            recursive=True,
            keep=(BucketNotFoundError,),
            in_namespace=namespace,
        )
    except BucketNotFoundError:
        entries = []
    files = [
        entry
        for entry in entries
        if getattr(entry, "type", "") == "file" and str(entry.path).startswith(prefix)
    ]
    size = sum(int(getattr(entry, "size", 0) or 0) for entry in files)
    if size > cap_bytes:
        # The artifact's fault, not the infrastructure's: it scores 0, never unscored.
        raise ArtifactRejected(
            f"the job's outputs hold {size / GIB:.2f} GiB, over this task's cap of "
            f"{cap_bytes / GIB:.2f} GiB; write a smaller checkpoint to /data/outputs"
        )
    if not files:
        await calls.call(
            f"preparing the empty outputs of job {evaluated.job_id}",
            api.batch_bucket_files,
            bucket,
            add=[(b"", f"{prefix}.keep")],
            in_namespace=namespace,
        )
    return artifact_volume(namespace, evaluated.folder)
