"""The local hub: base models and datasets in folders, addressed by repo id and revision.

    <root>/models/<repo>/<revision>/...        an imported copy, never changed afterwards
    <root>/models/<repo>/refs/main             the revision of the latest import
    <root>/datasets/...                        the same for datasets

`<repo>` is the repo id with `/` written as `--` (as in Hugging Face's cache; a repo id may not
contain `--` itself), so `org/name` and `org` never share a folder. A revision is a content hash
(40 hex digits, like a commit) computed at import: it pins the exact files, and `main` resolves
to the latest import. Imports copy (following links in the source, as in a Hugging Face cache
snapshot); a job reads a revision's folder through a read-only mount.

A model that a task generates on this machine (its `[base_model] local`, written by
tasks/models/; `tasks.registry.generated_model`) is generated and imported on first use.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["models", "datasets"]
KINDS: tuple[Kind, ...] = ("models", "datasets")

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")
REVISION = re.compile(r"[0-9a-f]{40}")


class HubError(ValueError):
    """A repo id, folder or revision the hub cannot use; the message says which and why."""


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.fullmatch(repo_id) or ".." in repo_id or "--" in repo_id:
        raise HubError(
            f"{repo_id!r} is not a repo id: use `name` or `org/name` with letters, digits, "
            "'.', '_' and '-' (no '--' or '..', at most 96 characters each)"
        )
    return repo_id


@dataclass(frozen=True)
class HubRepo:
    kind: Kind
    repo_id: str
    main: str
    revisions: tuple[str, ...]


class LocalHub:
    def __init__(self, root: Path) -> None:
        self.root = root

    # -- import ----------------------------------------------------------------------------------

    def add(self, kind: Kind, repo_id: str, folder: Path) -> str:
        """Copy `folder` in as the repo's newest revision; returns the revision (`main` then
        points at it). Importing identical files again gives the same revision."""
        check_repo_id(repo_id)
        if not folder.is_dir():
            raise HubError(f"{folder} is not a folder")
        self.root.mkdir(parents=True, exist_ok=True)
        incoming_root = self.root / ".incoming"
        incoming_root.mkdir(exist_ok=True)
        with self._lock():
            incoming = Path(tempfile.mkdtemp(dir=incoming_root))
            try:
                revision = _copy_hashed(folder, incoming)
                repo = self._repo_dir(kind, repo_id)
                target = repo / revision
                repo.mkdir(parents=True, exist_ok=True)
                if target.exists():
                    shutil.rmtree(incoming)
                else:
                    os.chmod(incoming, 0o755)
                    os.rename(incoming, target)
                (repo / "refs").mkdir(exist_ok=True)
                tmp = repo / "refs" / ".main.tmp"
                tmp.write_text(revision + "\n")
                os.replace(tmp, repo / "refs" / "main")
            finally:
                shutil.rmtree(incoming, ignore_errors=True)
        return revision

    def add_model(self, repo_id: str, folder: Path) -> str:
        return self.add("models", repo_id, folder)

    def add_dataset(self, repo_id: str, folder: Path) -> str:
        return self.add("datasets", repo_id, folder)

    def ensure_generated(self, repo_id: str) -> None:
        """Generate and import a model the tasks generate (tasks.registry.generated_model)
        unless the hub already has it; nothing for any other repo id."""
        from tasks.registry import generated_model  # lazy: `hub` commands need no task spec

        generate = generated_model(repo_id)
        if generate is None or self._main(self._repo_dir("models", repo_id)) is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock("generate"):
            if self._main(self._repo_dir("models", repo_id)) is not None:
                return  # another process generated it while we waited
            with tempfile.TemporaryDirectory(dir=self.root) as scratch:
                generate(Path(scratch))
                self.add("models", repo_id, Path(scratch))

    # -- lookup ----------------------------------------------------------------------------------

    def resolve(self, kind: Kind, repo_id: str, revision: str = "main") -> str:
        """The revision `revision` names (`main`: the latest import). Raises HubError."""
        check_repo_id(repo_id)
        repo = self._repo_dir(kind, repo_id)
        main = self._main(repo)
        what = "model" if kind == "models" else "dataset"
        if main is None:
            raise HubError(f"the local hub has no {what} {repo_id!r}")
        if revision == "main":
            return main
        if REVISION.fullmatch(revision) and (repo / revision).is_dir():
            return revision
        raise HubError(f"the local hub's {what} {repo_id!r} has no revision {revision!r}")

    def path(self, kind: Kind, repo_id: str, revision: str) -> Path:
        """The folder of an exact revision. Raises HubError when it is not there."""
        if not REVISION.fullmatch(revision):
            raise HubError(f"{revision!r} is not a revision (40 hex digits)")
        folder = self._repo_dir(kind, check_repo_id(repo_id)) / revision
        if not folder.is_dir():
            raise HubError(f"the local hub has no {kind[:-1]} {repo_id}@{revision}")
        return folder

    def list(self) -> list[HubRepo]:
        repos = []
        for kind in KINDS:
            base = self.root / kind
            if not base.is_dir():
                continue
            for repo in sorted(base.iterdir()):
                main = self._main(repo)
                if main is None:
                    continue
                revisions = tuple(
                    sorted(p.name for p in repo.iterdir() if REVISION.fullmatch(p.name))
                )
                repos.append(HubRepo(kind, repo.name.replace("--", "/"), main, revisions))
        return repos

    # -- internals -------------------------------------------------------------------------------

    def _repo_dir(self, kind: Kind, repo_id: str) -> Path:
        return self.root / kind / repo_id.replace("/", "--")

    @staticmethod
    def _main(repo: Path) -> str | None:
        try:
            value = (repo / "refs" / "main").read_text().strip()
        except FileNotFoundError:
            return None
        return value if REVISION.fullmatch(value) else None

    @contextmanager
    def _lock(self, name: str = "import") -> Iterator[None]:
        with open(self.root / f".{name}.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _copy_hashed(source: Path, target: Path) -> str:
    """Copy the files under `source` to `target` (folders 0755, files 0644) and return the
    content hash: sha1 over each file's relative path and sha256, in path order."""
    entries: list[tuple[str, str]] = []
    for folder, dirs, names in os.walk(source, followlinks=False):
        dirs.sort()
        for name in dirs:
            if os.path.islink(os.path.join(folder, name)):
                raise HubError(
                    f"{os.path.join(folder, name)} links to a folder; copy it in instead"
                )
        for name in sorted(names):
            src = Path(folder, name)
            rel = src.relative_to(source).as_posix()
            if not src.is_file():  # follows a file link; refuses fifos, sockets, broken links
                raise HubError(f"{src} is not a regular file")
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            digest = hashlib.sha256()
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                while chunk := fin.read(1 << 20):
                    digest.update(chunk)
                    fout.write(chunk)
            os.chmod(dst, 0o644)
            entries.append((rel, digest.hexdigest()))
    if not entries:
        raise HubError(f"{source} holds no files")
    combined = hashlib.sha1()
    for rel, digest in sorted(entries):
        combined.update(f"{rel}\0{digest}\n".encode())
    return combined.hexdigest()
