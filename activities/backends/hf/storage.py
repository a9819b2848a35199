"""Hugging Face job folders as `activities.backends.storage.JobStorage` sees them: a job's folder
in its
namespace's `jobs-artifacts` bucket (`<folder>/` holds the uploaded script, `<folder>/outputs/`
what the job left; see `activities/backends/hf/labels.py`).

Only paths under the job's own folder are ever deleted: the folder comes from the job's ref
(checked by `HfRef.decode`), is listed by its exact prefix with its slash, and every listed path
is checked against that prefix again (the Hub matches prefixes character by character, so
`<folder>` alone would also match `<folder>x/`). Deletion uses the same calls the backend
already makes (`list_bucket_tree`, `batch_bucket_files`), each bounded by `HubCalls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote

from huggingface_hub import HfApi
from huggingface_hub.errors import BucketNotFoundError
from huggingface_hub.utils import get_session, hf_raise_for_status

from activities.backends.hf.calls import HubCalls
from activities.backends.hf.labels import HfRef
from activities.backends.hf.submission import artifacts_bucket, outputs_prefix
from activities.backends.interface import DatasetBytes
from activities.backends.storage import StorageRefused
from activities.contamination.dataset_bytes import outputs_order, read_until
from posttrain_env.errors import ErrorType, ToolError

# Paths per delete request: one job's folder rarely holds more; a larger one takes several.
DELETE_BATCH = 500
# Beside a job's outputs, once they were refused and deleted: `<folder>/<this><size>`, so that
# a retried measurement finds the same verdict though the outputs are gone.
REFUSED_MARKER = ".posttrain-outputs-refused-"


class HfJobStorage:
    name = "hf"

    def __init__(self, calls: HubCalls, api: HfApi, namespace: Callable[[], Awaitable[str]]):
        """`api` holds the broker's token; `namespace` answers the backend's current one (for
        refs made before a ref named its namespace)."""
        self._calls = calls
        self._api = api
        self._namespace = namespace

    async def artifact_bytes(self, ref: str) -> int | None:
        try:
            bucket, folder = await self._where(ref)
        except StorageRefused:
            return None
        # An empty or missing outputs folder is an artifact of 0 bytes (the Hub has no
        # empty folders).
        return sum((await self._files(bucket, outputs_prefix(folder) + "/")).values())

    async def held_bytes(self) -> dict[str, int] | None:
        return None  # its folders are not on this host's disk

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        bucket, folder = await self._where(ref)
        files = await self._files(bucket, folder + "/")
        if keep_artifact:
            kept = outputs_prefix(folder) + "/"
            files = {path: size for path, size in files.items() if not path.startswith(kept)}
        await self._delete(bucket, sorted(files), f"deleting the folder of job {ref}")
        return sum(files.values())

    async def keep_outputs(self, ref: str, over: Callable[[int], object | None]) -> int:
        """The apparent bytes the job's outputs hold, as `over` judges them: when it refuses
        them (not None), they are deleted whole, after a marker that keeps their size for a
        retried call; the size is returned either way. Raises StorageRefused."""
        bucket, folder = await self._where(ref)
        files = await self._files(bucket, folder + "/")
        marker = folder + "/" + REFUSED_MARKER
        for path in files:
            if path.startswith(marker) and path[len(marker) :].isdigit():
                return int(path[len(marker) :])  # refused and deleted already
        prefix = outputs_prefix(folder) + "/"
        outputs = sorted(path for path in files if path.startswith(prefix))
        size = sum(files[path] for path in outputs)
        if over(size) is None:
            return size
        await self._calls.call(
            f"marking the outputs of job {ref} refused",
            self._api.batch_bucket_files,
            bucket,
            add=[(b"", f"{marker}{size}")],
            in_namespace=bucket.split("/")[0],
        )
        await self._delete(bucket, outputs, f"deleting the refused outputs of job {ref}")
        return size

    async def _delete(self, bucket: str, paths: list[str], what: str) -> None:
        """Delete `paths` of `bucket`, DELETE_BATCH at a time (`what`: the call's name)."""
        for start in range(0, len(paths), DELETE_BATCH):
            await self._calls.call(
                what,
                self._api.batch_bucket_files,
                bucket,
                delete=paths[start : start + DELETE_BATCH],
                in_namespace=bucket.split("/")[0],
            )

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        """The job's `outputs/` files (the contamination check), listed by their exact prefix
        and read in `outputs_order`, each by a streamed `GET /buckets/<bucket>/resolve/<path>`
        with the broker's token asking for its first bytes only (`Range`), in one call under
        the activity's budget. Not yet checked against the live Hub (the same route the
        library's `get_bucket_file_metadata` asks with HEAD); the HTTP-level fake Hub serves
        it (`tests/hf/test_http_hub.py`)."""
        try:
            bucket, folder = await self._where(ref)
        except StorageRefused as exc:
            raise ToolError(ErrorType.not_allowed, str(exc)) from None
        prefix = outputs_prefix(folder) + "/"
        files = await self._files(bucket, prefix)
        return await self._calls.call(
            f"reading the outputs of job {ref}", self._read, bucket, prefix, files, max_bytes
        )

    def _read(
        self, bucket: str, prefix: str, files: dict[str, int], max_bytes: int
    ) -> DatasetBytes:
        session = get_session()
        headers = self._api._build_hf_headers()

        def reader(path: str, size: int) -> Callable[[int], bytes]:
            def read_at_most(n: int) -> bytes:
                if size == 0 or n <= 0:
                    return b""
                url = f"{self._api.endpoint}/buckets/{bucket}/resolve/{quote(path, safe='')}"
                with session.stream(
                    "GET",
                    url,
                    headers={**headers, "Range": f"bytes=0-{n - 1}"},
                    follow_redirects=True,
                ) as response:
                    if response.status_code == 416:
                        return b""
                    if response.status_code >= 400:
                        response.read()
                        hf_raise_for_status(response)
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) >= n:
                            break
                return bytes(data[:n])

            return read_at_most

        readers = [
            (path.removeprefix(prefix), reader(path, size)) for path, size in sorted(files.items())
        ]
        return read_until(outputs_order(readers), max_bytes)

    async def _where(self, ref: str) -> tuple[str, str]:
        """(bucket id, folder) of the job; StorageRefused for a ref without a folder of ours."""
        try:
            hf = HfRef.decode(ref)
        except ValueError:
            raise StorageRefused(f"{ref!r} is not a Hugging Face job's ref") from None
        # HfRef admits `.` and `..` as folder names: never a job's (run_uv_job makes them).
        if hf.folder is None or hf.folder.strip(".") == "":
            raise StorageRefused(f"the ref {ref!r} names no folder of its job")
        namespace = hf.namespace or await self._namespace()
        return artifacts_bucket(namespace), hf.folder

    async def _files(self, bucket: str, prefix: str) -> dict[str, int]:
        """path -> size of every file under `prefix` (nothing when the bucket is gone)."""
        try:
            entries = await self._calls.listing(
                f"listing {bucket}/{prefix}",
                self._api.list_bucket_tree,
                bucket,
                prefix=prefix,
                recursive=True,
                keep=(BucketNotFoundError,),
                in_namespace=bucket.split("/")[0],
            )
        except BucketNotFoundError:
            return {}
        return {
            str(entry.path): int(getattr(entry, "size", 0) or 0)
            for entry in entries
            if getattr(entry, "type", "") == "file" and str(entry.path).startswith(prefix)
        }
