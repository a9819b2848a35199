"""Inputs checked without the broker's token: datasets an agent names, and the task's base model.

Every lookup goes through an `HfApi(token=False)`, so it sees exactly what the public sees: a
private dataset is indistinguishable from a missing one, and neither is allowed. Repo ids are
validated before any call is made. A dataset must exist, be public, ungated, not disabled and not
on the task's denylist; its revision is resolved to the commit it points at now, and that commit
is what the job mounts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from huggingface_hub import DatasetInfo, HfApi, RepoFile, get_session, hf_hub_url
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HFValidationError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import hf_raise_for_status, validate_repo_id

from activities.backends.hf.calls import HubCalls
from activities.backends.interface import DatasetBytes
from activities.contamination.dataset_bytes import read_until
from posttrain_env.errors import ErrorType, ToolError

_COMMIT = re.compile(r"[0-9a-f]{40}")
# Entries of a dataset's tree listed at most for the contamination check (a page of the Hub's
# listing holds 1000): the files past them are not read, and the dataset counts as cut.
MAX_LISTED_ENTRIES = 10_000


def repo_id_problem(repo_id: object) -> str | None:
    """Why `repo_id` is not a repo id the Hub would accept, or None."""
    if not isinstance(repo_id, str) or not repo_id:
        return "a repo id is a non-empty string such as 'owner/name'"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        return str(err)
    return None


def _refuse(repo_id: str, why: str) -> ToolError:
    return ToolError(
        ErrorType.dataset_not_allowed, f"dataset {repo_id!r} {why}", dataset=repo_id, reason=why
    )


def _denied(repo_id: str, denylist: Sequence[str]) -> bool:
    denied = {entry.casefold() for entry in denylist}
    return repo_id.casefold() in denied


def dataset_refusal(info: DatasetInfo) -> str | None:
    """Why a dataset the Hub describes cannot be mounted, or None."""
    if info.private:
        return "is private; only public datasets are allowed"
    if info.gated:  # False, or "auto" / "manual"
        return f"is gated ({info.gated}); only ungated datasets are allowed"
    if info.disabled:
        return "is disabled on Hugging Face"
    if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
        return "has no resolvable commit"
    return None


async def resolve_dataset(
    calls: HubCalls, public: HfApi, repo_id: str, denylist: Sequence[str]
) -> str:
    """The dataset's current commit. Raises ToolError(dataset_not_allowed) with the reason."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise _refuse(str(repo_id), f"is not a valid repo id: {problem}")
    if _denied(repo_id, denylist):
        raise _refuse(repo_id, "is on this task's denylist")
    try:
        info = await calls.call(
            f"looking up dataset {repo_id!r}",
            public.dataset_info,
            repo_id,
            keep=(RepositoryNotFoundError, DisabledRepoError),
        )
    except GatedRepoError:
        raise _refuse(repo_id, "is gated; only ungated datasets are allowed") from None
    except DisabledRepoError:
        raise _refuse(repo_id, "is disabled on Hugging Face") from None
    except RepositoryNotFoundError:
        # Without a token the Hub answers the same for a private dataset and a missing one.
        raise _refuse(repo_id, "does not exist or is not public") from None
    # A renamed dataset redirects: the denylist applies to its current name too.
    if isinstance(info.id, str) and _denied(info.id, denylist):
        raise _refuse(repo_id, f"is on this task's denylist (as {info.id!r})")
    refusal = dataset_refusal(info)
    if refusal:
        raise _refuse(repo_id, refusal)
    assert info.sha is not None
    return info.sha


async def resolve_model(calls: HubCalls, public: HfApi, repo_id: str, revision: str) -> str:
    """The commit `revision` of the public model `repo_id` points at (once per episode)."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise ToolError(
            ErrorType.hf_error, f"the task's base model {repo_id!r} is invalid: {problem}"
        )
    try:
        info = await calls.call(
            f"looking up model {repo_id!r}",
            public.model_info,
            repo_id,
            revision=revision,
            keep=(RepositoryNotFoundError, RevisionNotFoundError),
        )
    except RevisionNotFoundError:
        raise ToolError(
            ErrorType.hf_error,
            f"the task's base model {repo_id!r} has no revision {revision!r}; fix the task spec",
        ) from None
    except RepositoryNotFoundError:
        raise ToolError(
            ErrorType.hf_error,
            f"the task's base model {repo_id!r} does not exist or is not public; fix the task spec",
        ) from None
    if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
        raise ToolError(
            ErrorType.hf_error, f"the base model {repo_id!r}@{revision} has no resolvable commit"
        )
    return info.sha


async def read_dataset(
    calls: HubCalls, public: HfApi, repo_id: str, revision: str, max_bytes: int
) -> DatasetBytes:
    """The first `max_bytes` of the public dataset at the commit `revision` (the contamination
    check), in one Hub call under the activity's budget, without the token: its files listed
    (`GET /api/datasets/<repo>/tree/<commit>?recursive=True`, page by page, the first
    MAX_LISTED_ENTRIES entries) and read in path order, each by a streamed
    `GET /datasets/<repo>/resolve/<commit>/<path>` asking for its first bytes only (`Range`),
    as `HfFileSystem` reads a range; a file stored in LFS or Xet is redirected by the Hub to
    its storage and read there. Only `file` entries are read, and only paths that stay inside
    the dataset (no empty, `.` or `..` segment): nothing else is ever fetched. Compressed files
    are decompressed as `activities/contamination/dataset_bytes.py` says."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise ToolError(ErrorType.not_allowed, f"dataset {repo_id!r} is invalid: {problem}")
    if not _COMMIT.fullmatch(revision):
        # What a job mounted is always a commit; a branch would read what is there now.
        raise ToolError(ErrorType.not_allowed, f"dataset {repo_id!r}: {revision!r} is no commit")
    return await calls.call(
        f"reading dataset {repo_id!r}", _read_public, public, repo_id, revision, max_bytes
    )


def _read_public(public: HfApi, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
    entries = public.list_repo_tree(
        repo_id, recursive=True, revision=revision, repo_type="dataset", token=False
    )
    listed = list(itertools.islice(entries, MAX_LISTED_ENTRIES + 1))
    files = sorted(
        (entry.path, entry.size)
        for entry in listed[:MAX_LISTED_ENTRIES]
        if isinstance(entry, RepoFile) and _inside(entry.path)
    )
    session = get_session()
    headers = public._build_hf_headers(token=False)

    def reader(path: str, size: int):  # type: ignore[no-untyped-def]
        def read_at_most(n: int) -> bytes:
            if size == 0:  # nothing to read (and a range of an empty file is unsatisfiable)
                return b""
            url = hf_hub_url(
                repo_id, path, repo_type="dataset", revision=revision, endpoint=public.endpoint
            )
            # A server that ignores Range sends the whole file: read only what is wanted.
            with session.stream(
                "GET", url, headers={**headers, "Range": f"bytes=0-{n - 1}"}, follow_redirects=True
            ) as response:
                if response.status_code == 416:  # the range starts past the end: empty
                    return b""
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)  # HfHubHTTPError, translated by `calls`
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) >= n:
                        break
            return bytes(data[:n])

        return read_at_most

    read = read_until(((path, reader(path, size)) for path, size in files), max_bytes)
    if len(listed) > MAX_LISTED_ENTRIES:  # entries past the listing's cap were never read
        return DatasetBytes(files=read.files, cut=True)
    return read


def _inside(path: str) -> bool:
    """A path in the repo that names nothing outside it once it is put in a URL."""
    parts = path.split("/")
    return bool(path) and all(part not in ("", ".", "..") for part in parts)
