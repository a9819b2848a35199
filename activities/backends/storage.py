"""Where a backend keeps its jobs' folders, as the audit record (artifact sizes) and retention
(deletion) see it: one small interface per backend, beside `JobsBackend`.

A folder is named by the job's backend ref (the one `JobsBackend.submit` returned). Every
implementation acts only inside its own job root: a ref that names anything else, or a folder
that is a link, is refused (`StorageRefused`), never followed.
"""

from __future__ import annotations

from typing import Protocol


class StorageRefused(Exception):
    """The storage will not touch this folder. `lasting`: it never will (outside its root, a
    link, not a ref of this backend); otherwise not yet (the job has not ended)."""

    def __init__(self, message: str, *, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


class JobStorage(Protocol):
    name: str  # the backend's name: records of other backends are not this storage's

    async def artifact_bytes(self, ref: str) -> int | None:
        """The size of the job's outputs (its artifact), or None when they are not there."""
        ...

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        """Delete the job's folder (all of it but the artifact when `keep_artifact`); the bytes
        deleted. Idempotent: a folder already gone deletes nothing and returns 0. Raises
        StorageRefused; TransientBackendError or ToolError when the backend fails."""
        ...

    async def held_bytes(self) -> dict[str, int] | None:
        """What this backend's job folders hold on this host, by holder: `running` (what
        running jobs may still take), `live` (artifacts of live episodes), `retained`
        (artifacts of ended episodes kept for retention). None where the host's disk is not
        this backend's to count (its folders live elsewhere)."""
        ...


class NoStorage:
    """A backend that keeps no folders (the fake): nothing to measure or delete."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def artifact_bytes(self, ref: str) -> int | None:
        return None

    async def delete(self, ref: str, *, keep_artifact: bool) -> int:
        return 0

    async def held_bytes(self) -> dict[str, int] | None:
        return None
