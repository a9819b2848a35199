"""What a task family's `fetch.py` may ask for, and how it writes what it fetched.

`posttrain-env tasks fetch <task>` (posttrain_server/commands/tasks_fetch.py) writes the files a
real member needs that the repository does not ship (its contamination check's test items, the
published data its evaluator embeds): it imports `tasks/<family>/fetch.py` and calls its
`fetch(source, folder)`, which asks `source` (a `FetchSource`) for pinned downloads and writes
its files into the family's `folder` with `write_file`, returning their names. The source is
the command's: every download pinned (a wheel by name, version and SHA-256; a Hub dataset's
file by commit, checked against the SHA-256 the Hub lists for it), read without any token.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol

# The module of a family's folder that `tasks fetch` runs.
FETCH_MODULE = "fetch.py"


class FetchError(RuntimeError):
    """A download or a conversion failed; the message says what to do."""


class FetchSource(Protocol):
    def pypi_file(self, package: str, filename: str, sha256: str) -> Path:
        """`filename` of `package` from the package index (PyPI), checked against `sha256`:
        a local path (kept in the command's cache). Raises FetchError."""
        ...

    def hub_dataset_file(self, repo_id: str, revision: str, path: str) -> Path:
        """A public dataset's file at the commit `revision`, without a token, checked against
        the SHA-256 the Hub lists for it at that commit: a local path. Raises FetchError."""
        ...

    def run_script(self, script: Path, arguments: list[str]) -> None:
        """Run a PEP 723 script of the family with `uv run --script` (its pinned packages in
        an environment of its own, not the server's), e.g. to read Parquet with pyarrow.
        Raises FetchError if it fails."""
        ...


def write_file(folder: Path, name: str, data: bytes) -> str:
    """Write `folder/name` whole or not at all (a temporary file renamed over it); `name`."""
    target = folder / name
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return name
