"""`posttrain-env tasks fetch <task>`: write the files a real member needs that the repository
does not ship (docs/tasks.md, "Fetching a real member's data").

    posttrain-env tasks fetch t1_tool_call          BFCL's test data, from the bfcl-eval wheel
    posttrain-env tasks fetch math_word_problems    GSM8K's test problems, from the Hub

The task's family folder (under POSTTRAIN_TASKS_DIR, or the shipped tasks) holds a `fetch.py`
(tasks/fetching.py says what it may do); it runs here, at deploy time, with `CommandSource`:

- wheels from the package index (`UV_DEFAULT_INDEX`, `UV_INDEX_URL` or `PIP_INDEX_URL` if set,
  else PyPI) by its JSON simple API (PEP 691), each pinned by file name and SHA-256: the index
  must list that hash and the bytes must have it;
- a public Hub dataset's files at a commit, read without any token (huggingface_hub with
  `token=False`; the broker's token is never used), each checked against the SHA-256 the Hub
  lists for it at that commit (its LFS object id) or its git blob id;
- the family's PEP 723 scripts, run with `uv run --script` in an environment of their own,
  without the server's HF settings;

downloads kept in `--cache` (default `$XDG_CACHE_HOME/posttrain-env/fetch`) by hash, so a second
fetch, or the suite, reads them again without asking. It writes whole files only (a temporary
file renamed), then says which, and where the task now stands (`tasks list`'s readiness).
Exit status 0 when the member is ready, 1 when the fetch failed (the message says why), 2 for
a task that has nothing to fetch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urljoin

import httpx
import httpx2

from activities.backends.local.plan import INSTALLER_PASS_THROUGH
from tasks.fetching import FETCH_MODULE, FetchError
from tasks.registry import (
    TASKS_DIR,
    TaskSpecError,
    load_task,
    missing_evaluation_files,
    missing_test_items,
)

DEFAULT_INDEX = "https://pypi.org/simple"
# The package index's own names for it, as uv and pip read them.
INDEX_SETTINGS = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# A download larger than this is not what any pin here names (the BFCL wheel is 1.9 MB, GSM8K's
# test split 0.4 MB): stop rather than fill the disk.
MAX_DOWNLOAD_BYTES = 512 * 1024 * 1024
HTTP_TIMEOUT = httpx.Timeout(60.0, connect=20.0)
SCRIPT_TIMEOUT_S = 1800.0
# What a fetch script is given of this process's environment: what reaching an index needs.
# Nothing of Hugging Face (no token, no endpoint): a script reads the files handed to it.
# (The proxies and certificates an installer may need: the local backend's own list.)
SCRIPT_ENV = ("PATH", "HOME", "LANG", "UV_CACHE_DIR", *INSTALLER_PASS_THROUGH, *INDEX_SETTINGS)


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "posttrain-env" / "fetch"


def add_fetch_command(commands: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    fetch = commands.add_parser(
        "fetch",
        help="write a real member's test items and data (from PyPI or the Hub, pinned)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    fetch.add_argument("task", help="the task (or any member of its family) to fetch for")
    fetch.add_argument(
        "--cache", type=Path, default=None, help="where downloads are kept (default: user cache)"
    )


class CommandSource:
    """The fetch's downloads (tasks.fetching.FetchSource), pinned and checked."""

    def __init__(
        self, cache: Path, *, index: str | None = None, hub_endpoint: str | None = None
    ) -> None:
        self._cache = cache
        self._index = (index or _configured_index()).rstrip("/")
        self._hub_endpoint = hub_endpoint

    def pypi_file(self, package: str, filename: str, sha256: str) -> Path:
        cached = self._cache / "sha256" / sha256 / filename
        if cached.is_file() and _sha256(cached) == sha256:
            return cached
        page = f"{self._index}/{_normalized(package)}/"
        with httpx.Client(timeout=HTTP_TIMEOUT, follow_redirects=True) as client:
            try:
                listing = client.get(page, headers={"Accept": SIMPLE_JSON})
                listing.raise_for_status()
                files = listing.json().get("files", [])
            except (httpx.HTTPError, ValueError) as exc:
                raise FetchError(
                    f"the package index at {page} did not list {package}: {exc}"
                ) from None
            (entry,) = [f for f in files if f.get("filename") == filename] or [None]
            if entry is None:
                raise FetchError(f"the package index at {page} has no {filename}")
            listed = (entry.get("hashes") or {}).get("sha256")
            if listed is not None and listed != sha256:
                raise FetchError(
                    f"the package index lists {filename} with SHA-256 {listed}, not the pinned "
                    f"{sha256}: refusing it"
                )
            url = urljoin(str(listing.url), entry["url"])
            return self._download(client, url, {}, cached, sha256=sha256)

    def hub_dataset_file(self, repo_id: str, revision: str, path: str) -> Path:
        from huggingface_hub import HfApi, get_session, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=self._hub_endpoint, token=False)
        folder = path.rpartition("/")[0] or None
        try:
            entries = api.list_repo_tree(
                repo_id, path_in_repo=folder, revision=revision, repo_type="dataset", token=False
            )
            entry = next((e for e in entries if isinstance(e, RepoFile) and e.path == path), None)
        except HfHubHTTPError as exc:
            raise FetchError(f"the Hub did not list {repo_id}@{revision}: {exc}") from None
        if entry is None:
            raise FetchError(f"{repo_id}@{revision} has no file {path!r}")
        sha256 = entry.lfs.sha256 if entry.lfs is not None else None
        key = sha256 or f"git-{entry.blob_id}"
        cached = self._cache / "sha256" / key / Path(path).name
        if cached.is_file() and _digest_matches(cached, sha256, entry.blob_id):
            return cached
        url = hf_hub_url(
            repo_id, path, repo_type="dataset", revision=revision, endpoint=api.endpoint
        )
        headers = api._build_hf_headers(token=False)  # pyright: ignore[reportPrivateUsage]
        client = get_session()
        return self._download(client, url, headers, cached, sha256=sha256, blob_id=entry.blob_id)

    def run_script(self, script: Path, arguments: list[str]) -> None:
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
        if uv is None:
            raise FetchError("uv is not installed beside this Python (it is a dependency)")
        env = {name: os.environ[name] for name in SCRIPT_ENV if name in os.environ}
        try:
            done = subprocess.run(
                [uv, "run", "--no-config", "--quiet", "--script", str(script), *arguments],
                env=env,
                capture_output=True,
                text=True,
                timeout=SCRIPT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise FetchError(f"{script.name} ran past {SCRIPT_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            raise FetchError(f"{script.name} failed ({done.returncode}): {done.stderr[-2000:]}")

    def _download(
        self,
        client: Any,  # httpx's, or huggingface_hub's session (httpx2: the fake Hub's too)
        url: str,
        headers: dict[str, str],
        target: Path,
        *,
        sha256: str | None,
        blob_id: str | None = None,
    ) -> Path:
        """Stream `url` into `target` (whole or not at all), checking the bytes' digest."""
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        digest, size = hashlib.sha256(), 0
        try:
            with os.fdopen(handle, "wb") as out, client.stream("GET", url, headers=headers) as got:
                if got.status_code >= 400:
                    raise FetchError(f"GET {url} answered {got.status_code}")
                for chunk in got.iter_bytes():
                    size += len(chunk)
                    if size > MAX_DOWNLOAD_BYTES:
                        raise FetchError(f"{url} is larger than {MAX_DOWNLOAD_BYTES} bytes")
                    digest.update(chunk)
                    out.write(chunk)
            if not _digest_matches(Path(temporary), sha256, blob_id):
                raise FetchError(
                    f"{url} does not have the pinned digest ({sha256 or blob_id}): refusing it"
                )
            os.replace(temporary, target)
        except (httpx.HTTPError, httpx2.HTTPError) as exc:
            raise FetchError(f"GET {url} failed: {exc}") from None
        finally:
            Path(temporary).unlink(missing_ok=True)
        return target


def run_fetch(args: argparse.Namespace, tasks_dir: Path = TASKS_DIR) -> int:
    """`tasks fetch <task>`: the exit status (0 ready, 1 failed, 2 nothing to fetch)."""
    try:
        spec = load_task(args.task, tasks_dir)
    except TaskSpecError as exc:
        print(f"tasks fetch: {exc}", file=sys.stderr)
        return 2
    folder = tasks_dir / (spec.family or spec.id)
    module_path = folder / FETCH_MODULE
    if not module_path.is_file():
        print(
            f"tasks fetch: task {spec.id!r} needs nothing fetched ({folder.name}/ has no "
            f"{FETCH_MODULE})",
            file=sys.stderr,
        )
        return 2
    source = CommandSource(args.cache or default_cache())
    try:
        written = _family_module(module_path).fetch(source, folder)
    except FetchError as exc:
        print(f"tasks fetch {spec.id}: {exc}", file=sys.stderr)
        return 1
    for name in written:
        print(f"wrote {folder / name}")
    problem = missing_evaluation_files(spec, tasks_dir) or missing_test_items(spec, tasks_dir)
    if problem:
        print(f"tasks fetch {spec.id}: still not ready: {problem}", file=sys.stderr)
        return 1
    print(f"{spec.id}: ready (its evaluator's files and contamination test items are here)")
    return 0


def _family_module(path: Path) -> ModuleType:
    name = f"posttrain_fetch_{path.parent.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FetchError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _configured_index() -> str:
    for name in INDEX_SETTINGS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_INDEX


def _normalized(name: str) -> str:
    """A project's name as the simple API addresses it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _digest_matches(path: Path, sha256: str | None, blob_id: str | None) -> bool:
    if sha256 is not None:
        return _sha256(path) == sha256
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob_id
