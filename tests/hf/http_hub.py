"""A fake Hugging Face Hub that answers Hub-shaped HTTP underneath the real `HfApi`.

`HubHttp` is an httpx2 transport: installed as the network of the backend's own client factory
(`activities.backends.hf.http.install_hub_client(limits, transport=...)`), every request the real
`HfApi` makes goes through the production `BoundedTransport`, the library's `http_backoff`,
`paginate`, `hf_raise_for_status` and SSE reader, and only then reaches this fake. The jobs,
buckets, repos, prices and clock are a `FakeHub`'s (tests/hf/fake_hub.py), so a job's stages
follow the same plans as under the recording fake.

What it models of the real Hub, each as a control a test sets:

- pagination of `list_jobs` and of a bucket's tree (a `Link: rel="next"` header per page);
- listing lag: a new job shows in `list_jobs` only after `listing_lag` listings that should
  have shown it (`inspect_job` knows it at once);
- a server that ignores the `label=` filter (`ignore_label_filter`);
- a request that hangs (`hang`): it waits as a real socket would, for the read timeout the
  request carries, then the client sees `ReadTimeout`; a job creation that hung still lands
  afterwards (`lands_after_requests` later, or when the test says: `land_now`), as on a server
  that finished the work after the client gave up, unless `lands=False`. A request that
  carries no timeout at all is recorded in `unbounded`;
- a slow route (`slow`): every request to it answers after a delay (inside its timeouts);
- a body that trickles (`trickle`): chunks slower than the whole call may take;
- a log replay cut short (`cut_logs`): the stream sends its first lines, then is silent for
  the request's read timeout, which the library's no-follow reader takes for the end of the
  replay (a slow Hub, or a read near its deadline);
- canned answers (`answer`): 402, 403, 429 with `RateLimit` headers, 5xx;
- the steps of `run_uv_job`: bucket creation (409 when it exists), the xet write token and
  upload (through `FakeXet`, which stands in for hf_xet's own client), the bucket batch;
- bucket prefixes matched character by character, as the Hub does;
- a 404 on a job's URL (the library raises `JobNotFoundError`), per namespace;
- tokens with or without Jobs and bucket-write permission (`scopes`);
- datasets with files at several commits (`add_dataset`): the recursive tree listing of a
  commit (directories listed too, paginated), and each file at
  `/datasets/<repo>/resolve/<commit>/<path>`, a regular one answered by the Hub itself and
  one stored in LFS redirected (302, `X-Linked-Size`, `X-Linked-Etag`) to its storage host
  (`CDN_HOST`), both honouring `Range` as the Hub and its CDN do (206, `Content-Range`); an
  unknown repo, commit or path is the Hub's 404 with its `X-Error-Code`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx2
from huggingface_hub import constants

from tests.hf.fake_hub import FakeHub, FakeJob, _iso, dataset_json

# A request without any timeout waits at most this long here (and is recorded in `unbounded`):
# long enough to fail every bound a test asserts, short enough not to hang the suite.
UNBOUNDED_WAIT_S = 3.0

ROUTES: list[tuple[str, str, re.Pattern[str]]] = [
    (name, method, re.compile(pattern))
    for name, method, pattern in [
        ("whoami", "GET", r"/api/whoami-v2"),
        ("hardware", "GET", r"/api/jobs/hardware"),
        ("list_jobs", "GET", r"/api/jobs/(?P<ns>[^/]+)"),
        ("create_job", "POST", r"/api/jobs/(?P<ns>[^/]+)"),
        ("inspect_job", "GET", r"/api/jobs/(?P<ns>[^/]+)/(?P<id>[^/]+)"),
        ("cancel_job", "POST", r"/api/jobs/(?P<ns>[^/]+)/(?P<id>[^/]+)/cancel"),
        ("job_logs", "GET", r"/api/jobs/(?P<ns>[^/]+)/(?P<id>[^/]+)/logs"),
        ("create_bucket", "POST", r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)"),
        ("bucket_info", "GET", r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)"),
        ("xet_token", "GET", r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)/xet-write-token"),
        ("bucket_batch", "POST", r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)/batch"),
        ("bucket_tree", "GET", r"/api/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)/tree(?P<prefix>/.*)?"),
        ("bucket_file", "GET", r"/buckets/(?P<ns>[^/]+)/(?P<name>[^/]+)/resolve/(?P<path>.+)"),
        ("dataset_info", "GET", r"/api/datasets/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>.+))?"),
        ("model_info", "GET", r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>.+))?"),
        (
            "dataset_tree",
            "GET",
            r"/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<path>/.*)?",
        ),
        (
            "dataset_file",
            "GET",
            r"/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)",
        ),
        ("lfs_file", "GET", r"/repos/[0-9a-f]{2}/[0-9a-f]{2}/(?P<oid>[0-9a-f]{64})"),
    ]
]
# Where the Hub redirects a file stored in LFS (as huggingface.co sends them to its CDN).
CDN_HOST = "cdn-lfs.hf.co"
# Routes answered without a token: public reads (and the storage host, by signed URL).
PUBLIC_ROUTES = frozenset(
    {"hardware", "dataset_info", "model_info", "dataset_tree", "dataset_file", "lfs_file"}
)


@dataclass
class RepoBlob:
    data: bytes
    lfs: bool  # stored in LFS: the Hub redirects its downloads to CDN_HOST

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Scopes:
    """What a token may do (a fine-grained token may lack either)."""

    jobs: bool = True
    bucket_write: bool = True


@dataclass
class Seen:
    route: str
    method: str
    path: str
    params: list[tuple[str, str]]
    at: Any  # the fake Hub's clock when the request arrived
    timeout: dict[str, float | None]
    token: str | None
    range: str | None = None  # the `Range` header asked for
    host: str = ""


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass
class Hang:
    lands_after_requests: int = 0  # a hung job creation is carried out this many requests later
    lands: bool = True  # False: the hung creation never happens on the Hub
    released: threading.Event = field(default_factory=threading.Event)


@dataclass
class Trickle:
    chunks: int
    every_s: float


class HubHttp(httpx2.BaseTransport):
    def __init__(self, hub: FakeHub, *, page_size: int = 2) -> None:
        self.hub = hub
        self.page_size = page_size
        self.namespaces = {hub.namespace}
        self.scopes: dict[str, Scopes] = {}  # token -> scopes; unknown hf_ tokens: all
        self.listing_lag = 0
        self.ignore_label_filter = False
        self.seen: list[Seen] = []
        self.unbounded: list[Seen] = []
        self.hung_for: list[float] = []  # real seconds each hung request waited
        self.files: dict[str, bytes] = {}  # "<bucket>/<path>" -> bytes (uploads)
        self.blobs: dict[str, bytes] = {}  # xet hash -> bytes
        self.xet_upload_s = 0.0  # how long hf_xet's own upload takes (our deadlines miss it)
        # repo id -> commit -> path -> the file (`add_dataset`)
        self.dataset_commits: dict[str, dict[str, dict[str, RepoBlob]]] = {}
        self.tree_page_size = 1000  # the Hub's own page of a tree listing
        self._job_namespace: dict[str, str] = {}
        self._listed: dict[str, int] = {}
        self._answers: dict[str, list[Answer]] = {}
        self._hangs: dict[str, list[Hang]] = {}
        self._trickles: dict[str, Trickle] = {}
        self._delays: dict[str, float] = {}  # route -> seconds before each answer
        self._log_cuts: list[int] = []  # lines each next log replay sends before its silence
        self._pending: list[list[Any]] = []  # [requests to go, job spec, namespace]
        self._ids = itertools.count(0x6890000000000000000A0000)

    # -- test controls -------------------------------------------------------------------------

    def answer(
        self,
        route: str,
        status: int,
        times: int = 1,
        *,
        message: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next `times` requests to `route` get this answer (and nothing else happens)."""
        body = {"error": message or f"fake {status}"}
        self._answers.setdefault(route, []).extend(
            Answer(status, dict(headers or {}), body) for _ in range(times)
        )

    def hang(self, route: str, *, lands_after_requests: int = 0, lands: bool = True) -> Hang:
        hang = Hang(lands_after_requests, lands)
        self._hangs.setdefault(route, []).append(hang)
        return hang

    def trickle(self, route: str, chunks: int, every_s: float) -> None:
        self._trickles[route] = Trickle(chunks, every_s)

    def slow(self, route: str, seconds: float) -> None:
        """Every request to `route` waits `seconds` before it is answered."""
        self._delays[route] = seconds

    def cut_logs(self, *after_lines: int) -> None:
        """The next log replays (one per number) send that many lines, then fall silent until
        the request's read timeout ends them."""
        self._log_cuts.extend(after_lines)

    def add_dataset(
        self,
        repo_id: str,
        commit: str,
        files: dict[str, bytes],
        *,
        lfs: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """A public dataset's files at `commit`, which becomes what `dataset_info` answers (its
        `main`); earlier commits stay readable, as on the Hub. Paths in `lfs` are stored in LFS."""
        self.dataset_commits.setdefault(repo_id, {})[commit] = {
            path: RepoBlob(data, path in lfs) for path, data in files.items()
        }
        self.hub.datasets[repo_id] = dataset_json(
            repo_id, commit, siblings=[{"rfilename": path} for path in sorted(files)]
        )

    def land_now(self) -> list[FakeJob]:
        """Hung creations still pending land now (the Hub carried them out at last)."""
        with self.hub._lock:
            pending, self._pending = self._pending, []
            return [self._create(spec, namespace) for _, spec, namespace in pending]

    def requests_to(self, route: str) -> list[Seen]:
        return [seen for seen in self.seen if seen.route == route]

    def namespace_of(self, job_id: str) -> str:
        return self._job_namespace[job_id]

    # -- the transport -------------------------------------------------------------------------

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.read()
        path = unquote(request.url.path)
        route, match = self._route(request.method, path, request.url.host)
        token = _bearer(request)
        seen = Seen(
            route=route,
            method=request.method,
            path=path,
            params=list(request.url.params.multi_items()),
            at=self.hub.clock(),
            timeout=dict(request.extensions.get("timeout") or {}),
            token=token,
            range=request.headers.get("range"),
            host=request.url.host,
        )
        with self.hub._lock:
            self.seen.append(seen)
            self._land_pending()
            hang = self._hangs[route].pop(0) if self._hangs.get(route) else None
            canned = self._answers[route].pop(0) if self._answers.get(route) else None
        if hang is not None:
            self._hang(request, seen, hang, route, match)
        if self._delays.get(route):
            time.sleep(self._delays[route])
        if canned is not None:
            return _json(request, canned.status, canned.body, canned.headers)
        with self.hub._lock:
            response = self._serve(route, match, request, token)
        trickle = self._trickles.pop(route, None)
        if trickle is not None:  # the same answer, as a stream that arrives piece by piece
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=_Trickling(response.content, trickle),
                request=request,
            )
        return response

    def _route(self, method: str, path: str, host: str) -> tuple[str, re.Match[str]]:
        for name, verb, pattern in ROUTES:
            match = pattern.fullmatch(path)
            if match and verb == method and (host == CDN_HOST) == (name == "lfs_file"):
                return name, match
        raise AssertionError(f"the fake Hub has no route for {method} {host}{path}")

    def _hang(
        self, request: httpx2.Request, seen: Seen, hang: Hang, route: str, match: re.Match[str]
    ) -> None:
        """Wait as a socket with no answer does: for the request's read timeout."""
        read = seen.timeout.get("read")
        if read is None:
            self.unbounded.append(seen)
        started = time.monotonic()
        released = hang.released.wait(UNBOUNDED_WAIT_S if read is None else read)
        self.hung_for.append(time.monotonic() - started)
        if released:
            return
        if route == "create_job" and hang.lands:  # the Hub finishes after the client gave up
            with self.hub._lock:
                spec, namespace = json.loads(request.content), match["ns"]
                if hang.lands_after_requests <= 0:
                    self._create(spec, namespace)
                else:
                    self._pending.append([hang.lands_after_requests, spec, namespace])
        raise httpx2.ReadTimeout("the fake Hub did not answer in time", request=request)

    def _land_pending(self) -> None:
        """One more request reached the Hub: creations that hung land when their turn comes."""
        for pending in list(self._pending):
            pending[0] -= 1
            if pending[0] <= 0:
                self._pending.remove(pending)
                self._create(pending[1], pending[2])

    # -- the Hub's routes ----------------------------------------------------------------------

    def _serve(
        self, route: str, match: re.Match[str], request: httpx2.Request, token: str | None
    ) -> httpx2.Response:
        needs_token = route not in PUBLIC_ROUTES
        if needs_token and token is None:
            return _json(request, 401, {"error": "Invalid credentials in Authorization header"})
        scopes = self.scopes.get(token or "", Scopes())
        namespace = match.groupdict().get("ns")
        if namespace is not None and namespace not in self.namespaces:
            return _json(request, 403, {"error": f"no access to {namespace}"})
        if route in ("create_job", "cancel_job") and not scopes.jobs:
            return _json(request, 403, {"error": "this token cannot write Jobs"})
        return getattr(self, "_" + route)(match, request, scopes)

    def _whoami(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        return _json(request, 200, {"type": "user", "name": self.hub.namespace})

    def _hardware(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        return _json(request, 200, self.hub.hardware)

    def _create_job(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        job = self._create(json.loads(request.content), match["ns"])
        return _json(request, 200, self.hub._job_json(job))

    def _create(self, spec: dict[str, Any], namespace: str) -> FakeJob:
        labels = spec.get("labels") or {}
        plan = self.hub.plan_for(labels) if self.hub.plan_for else self.hub.plan
        data = next((v for v in spec.get("volumes") or [] if v.get("mountPath") == "/data"), None)
        job = FakeJob(
            id=f"{next(self._ids):024x}",
            spec=spec,
            plan=plan,
            created_at=self.hub.clock(),
            folder=data.get("path") if data else None,
        )
        self.hub.jobs[job.id] = job
        self._job_namespace[job.id] = namespace
        return job

    def _list_jobs(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        params = request.url.params
        stages = params.get_list("stage")
        wanted = dict(label.split("=", 1) for label in params.get_list("label"))
        matching = []
        for job in self.hub.jobs.values():
            if self._job_namespace.get(job.id, self.hub.namespace) != match["ns"]:
                continue
            data = self.hub._job_json(job)
            labels = data.get("labels") or {}
            if not self.ignore_label_filter and any(labels.get(k) != v for k, v in wanted.items()):
                continue
            if stages and data["status"]["stage"] not in stages:
                continue
            if "cursor" not in params:  # a new listing (not a later page of one)
                self._listed[job.id] = self._listed.get(job.id, 0) + 1
            if self._listed.get(job.id, 0) <= self.listing_lag:
                continue  # not yet visible to listings
            matching.append(data)
        return self._page(request, matching)

    def _page(self, request: httpx2.Request, items: list[Any]) -> httpx2.Response:
        start = int(request.url.params.get("cursor", "0"))
        page = items[start : start + self.page_size]
        headers = {}
        if start + self.page_size < len(items):
            following = request.url.copy_set_param("cursor", str(start + self.page_size))
            headers["Link"] = f'<{following}>; rel="next"'
        return _json(request, 200, page, headers)

    def _inspect_job(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        job = self._job(match)
        if job is None:
            return _json(request, 404, {"error": "Job not found"})
        return _json(request, 200, self.hub._job_json(job))

    def _cancel_job(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        job = self._job(match)
        if job is None:
            return _json(request, 404, {"error": "Job not found"})
        if job.cancel_at is None and self.hub._stage(job)[0] in ("SCHEDULING", "RUNNING"):
            job.cancel_at = self.hub.clock()
        return _json(request, 200, {})

    def _job_logs(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        job = self._job(match)
        if job is None:
            return _json(request, 404, {"error": "Job not found"})
        stage, started, _, _ = self.hub._stage(job)
        nonce = (job.spec.get("environment") or {}).get("POSTTRAIN_NONCE", "")
        lines = [line.replace("{nonce}", nonce) for line in job.plan.logs]
        lines = lines if stage != "SCHEDULING" else []
        tail = request.url.params.get("tail")
        lines = lines[-int(tail) :] if tail else lines
        stamp = _iso(started or job.created_at)
        body = "".join(
            f"data: {json.dumps({'timestamp': stamp, 'data': line})}\n\n" for line in lines
        )
        headers = {
            "content-type": "text/event-stream",
            "date": format_datetime(self.hub.clock().astimezone(UTC), usegmt=True),
        }
        if self._log_cuts:
            events = body.encode().split(b"\n\n")[: self._log_cuts.pop(0)]
            sent = b"".join(event + b"\n\n" for event in events)
            silence = float(request.extensions.get("timeout", {}).get("read") or UNBOUNDED_WAIT_S)
            stream = _FallingSilent(sent, silence, request)
            return httpx2.Response(200, headers=headers, stream=stream, request=request)
        return httpx2.Response(200, headers=headers, content=body.encode(), request=request)

    def _job(self, match: re.Match[str]) -> FakeJob | None:
        job = self.hub.jobs.get(match["id"])
        if job is None or self._job_namespace.get(job.id, self.hub.namespace) != match["ns"]:
            return None
        return job

    # -- buckets -------------------------------------------------------------------------------

    def _create_bucket(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        bucket = f"{match['ns']}/{match['name']}"
        if not scopes.bucket_write:
            return _json(request, 403, {"error": "this token cannot create buckets"})
        url = f"https://huggingface.co/buckets/{bucket}"
        if bucket in self.hub.buckets:
            return _json(request, 409, {"error": "You already created this bucket", "url": url})
        self.hub.buckets[bucket] = {}
        return _json(request, 200, {"url": url})

    def _bucket_info(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        bucket = f"{match['ns']}/{match['name']}"
        if bucket not in self.hub.buckets:
            return _json(request, 404, {"error": "not found"}, {"X-Error-Code": "RepoNotFound"})
        files = self.hub.buckets[bucket]
        return _json(
            request,
            200,
            {
                "id": bucket,
                "private": True,
                "createdAt": _iso(self.hub.clock()),
                "size": sum(files.values()),
                "totalFiles": len(files),
            },
        )

    def _xet_token(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        if not scopes.bucket_write:
            return _json(request, 403, {"error": "this token cannot write to this bucket"})
        return _json(request, 200, {"accessToken": "xet-fake", "exp": 2**31, "casUrl": "x"})

    def _bucket_batch(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        bucket = f"{match['ns']}/{match['name']}"
        if not scopes.bucket_write:
            return _json(request, 403, {"error": "this token cannot write to this bucket"})
        for line in request.content.decode().splitlines():
            operation = json.loads(line)
            if operation["type"] == "addFile":
                data = self.blobs[operation["xetHash"]]
                self.hub.buckets.setdefault(bucket, {})[operation["path"]] = len(data)
                self.files[f"{bucket}/{operation['path']}"] = data
        return _json(request, 200, {"failed": []})

    def _bucket_tree(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        bucket = f"{match['ns']}/{match['name']}"
        if bucket not in self.hub.buckets:
            return _json(request, 404, {"error": "not found"}, {"X-Error-Code": "RepoNotFound"})
        prefix = (match["prefix"] or "/")[1:]
        entries = [
            {"type": "file", "path": path, "size": size, "xetHash": "0" * 64}
            for path, size in sorted(self.hub.buckets[bucket].items())
            if path.startswith(prefix)  # character by character, as the Hub matches
        ]
        return self._page(request, entries)

    def _bucket_file(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        """A bucket file's bytes, honouring `Range` (the route `get_bucket_file_metadata` asks
        with HEAD; the contamination check reads a job's outputs with GET)."""
        bucket = f"{match['ns']}/{match['name']}"
        if bucket not in self.hub.buckets:
            return _json(request, 404, {"error": "not found"}, REPO_NOT_FOUND_HEADER)
        data = self.files.get(f"{bucket}/{match['path']}")
        if data is None:
            return _json(request, 404, {"error": "Entry not found"}, ENTRY_NOT_FOUND_HEADER)
        return _ranged(request, data, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'})

    def put_file(self, bucket: str, path: str, data: bytes) -> None:
        """A file a job wrote into its bucket folder (e.g. under `outputs/`)."""
        with self.hub._lock:
            self.files[f"{bucket}/{path}"] = data
            self.hub.buckets.setdefault(bucket, {})[path] = len(data)

    # -- repos ---------------------------------------------------------------------------------

    def _dataset_info(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        known = self.hub.datasets.get(match["repo"], 404)
        if isinstance(known, int):
            return _json(request, known, {"error": "nope"}, {"X-Error-Code": "RepoNotFound"})
        return _json(request, 200, known)

    def _model_info(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        data = self.hub.models.get(match["repo"])
        if data is None:
            return _json(request, 404, {"error": "nope"}, {"X-Error-Code": "RepoNotFound"})
        if match["rev"] not in (None, "main", data["sha"]):
            return _json(request, 404, {"error": "nope"}, {"X-Error-Code": "RevisionNotFound"})
        return _json(request, 200, data)

    # -- dataset files -------------------------------------------------------------------------

    def _commit_files(
        self, request: httpx2.Request, repo_id: str, rev: str
    ) -> tuple[str, dict[str, RepoBlob]] | httpx2.Response:
        """The commit `rev` names and its files, or the Hub's 404."""
        commits = self.dataset_commits.get(repo_id)
        if commits is None:
            return _json(request, 404, {"error": "Repository not found"}, REPO_NOT_FOUND_HEADER)
        if rev == "main":
            rev = self.hub.datasets[repo_id]["sha"]  # type: ignore[index]
        files = commits.get(rev)
        if files is None:
            return _json(request, 404, {"error": "Invalid rev id"}, REVISION_NOT_FOUND_HEADER)
        return rev, files

    def _dataset_tree(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        found = self._commit_files(request, match["repo"], match["rev"])
        if isinstance(found, httpx2.Response):
            return found
        files = found[1]
        folder = (match["path"] or "/")[1:]
        recursive = request.url.params.get("recursive") in ("True", "true", "1")
        entries: dict[str, dict[str, Any]] = {}
        for path, blob in sorted(files.items()):
            if folder and not path.startswith(folder + "/"):
                continue
            rest = path[len(folder) + 1 :] if folder else path
            parts = rest.split("/")
            if not recursive and len(parts) > 1:  # only the folder's own entries
                sub = f"{folder}/{parts[0]}" if folder else parts[0]
                entries[sub] = {"type": "directory", "oid": "0" * 40, "size": 0, "path": sub}
                continue
            for depth in range(1, len(parts)):  # a recursive listing names folders too
                sub = "/".join(([folder] if folder else []) + parts[:depth])
                entries[sub] = {"type": "directory", "oid": "0" * 40, "size": 0, "path": sub}
            entries[path] = _file_entry(path, blob)
        listed = [entries[key] for key in sorted(entries)]
        start = int(request.url.params.get("cursor", "0"))
        page = listed[start : start + self.tree_page_size]
        headers = {}
        if start + self.tree_page_size < len(listed):
            following = request.url.copy_set_param("cursor", str(start + self.tree_page_size))
            headers["Link"] = f'<{following}>; rel="next"'
        return _json(request, 200, page, headers)

    def _dataset_file(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        found = self._commit_files(request, match["repo"], match["rev"])
        if isinstance(found, httpx2.Response):
            return found
        commit, files = found
        blob = files.get(match["path"])
        if blob is None:
            return _json(
                request, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}
            )
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_git_oid(blob.data)}"'}
        if blob.lfs:  # the Hub answers with where its storage keeps the bytes
            digest = blob.sha256
            headers |= {
                "Location": f"https://{CDN_HOST}/repos/{digest[:2]}/{digest[2:4]}/{digest}"
                "?Expires=2000000000&Signature=fake",
                "X-Linked-Size": str(len(blob.data)),
                "X-Linked-Etag": f'"{digest}"',
            }
            return httpx2.Response(302, headers=headers, request=request)
        return _ranged(request, blob.data, headers)

    def _lfs_file(self, match: re.Match[str], request: httpx2.Request, scopes: Scopes) -> Any:
        for commits in self.dataset_commits.values():
            for files in commits.values():
                for blob in files.values():
                    if blob.lfs and blob.sha256 == match["oid"]:
                        return _ranged(request, blob.data, {"ETag": f'"{match["oid"]}"'})
        return httpx2.Response(403, content=b"<Error>AccessDenied</Error>", request=request)


REPO_NOT_FOUND_HEADER = {"X-Error-Code": "RepoNotFound"}
REVISION_NOT_FOUND_HEADER = {"X-Error-Code": "RevisionNotFound"}
ENTRY_NOT_FOUND_HEADER = {"X-Error-Code": "EntryNotFound"}
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _file_entry(path: str, blob: RepoBlob) -> dict[str, Any]:
    """A file as the Hub's tree listing describes it."""
    entry: dict[str, Any] = {
        "type": "file",
        "oid": _git_oid(blob.data if not blob.lfs else b"lfs pointer " + blob.sha256.encode()),
        "size": len(blob.data),
        "path": path,
    }
    if blob.lfs:
        entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": 134}
    return entry


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _ranged(request: httpx2.Request, data: bytes, headers: dict[str, str]) -> httpx2.Response:
    """`data` as a server that honours a single `Range: bytes=a-b` sends it (206), else 200."""
    asked = _RANGE.fullmatch(request.headers.get("range", ""))
    headers = {**headers, "Accept-Ranges": "bytes"}
    if asked is None:
        return httpx2.Response(200, headers=headers, content=data, request=request)
    start = int(asked[1])
    end = min(int(asked[2]) if asked[2] else len(data) - 1, len(data) - 1)
    if start >= len(data):
        headers["Content-Range"] = f"bytes */{len(data)}"
        return httpx2.Response(416, headers=headers, request=request)
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return httpx2.Response(206, headers=headers, content=data[start : end + 1], request=request)


def _bearer(request: httpx2.Request) -> str | None:
    value = request.headers.get("authorization", "")
    return value.removeprefix("Bearer ") if value.startswith("Bearer ") else None


def _json(
    request: httpx2.Request, status: int, body: Any, headers: dict[str, str] | None = None
) -> httpx2.Response:
    return httpx2.Response(status, json=body, headers=headers or {}, request=request)


class _Trickling(httpx2.SyncByteStream):
    """A body sent a piece at a time, each piece well inside the read timeout."""

    def __init__(self, content: bytes, trickle: Trickle) -> None:
        self._content = content
        self._trickle = trickle

    def __iter__(self) -> Iterator[bytes]:
        size = max(1, len(self._content) // self._trickle.chunks)
        for start in range(0, len(self._content), size):
            time.sleep(self._trickle.every_s)
            yield self._content[start : start + size]


class _FallingSilent(httpx2.SyncByteStream):
    """A body that stops short: its first bytes, then no byte until the read timeout."""

    def __init__(self, sent: bytes, silence_s: float, request: httpx2.Request) -> None:
        self._sent = sent
        self._silence_s = silence_s
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        if self._sent:
            yield self._sent
        time.sleep(self._silence_s)
        raise httpx2.ReadTimeout("no event within the read timeout", request=self._request)


# -- hf_xet, which uploads a job's script with a client of its own ------------------------------


@dataclass
class _XetInfo:
    hash: str
    file_size: int


@dataclass
class _Uploaded:
    xet_info: _XetInfo


class _Upload:
    def __init__(self, result: _Uploaded) -> None:
        self._result = result

    def result(self) -> _Uploaded:
        return self._result


class _Commit:
    def __init__(self, http: HubHttp) -> None:
        self._http = http

    def __enter__(self) -> _Commit:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start_upload_file(self, path: str, sha256: object = None) -> _Upload:
        return self.start_upload_bytes(Path(path).read_bytes())

    def start_upload_bytes(self, data: bytes, sha256: object = None) -> _Upload:
        time.sleep(self._http.xet_upload_s)  # hf_xet's own client: no deadline of ours
        digest = hashlib.sha256(data).hexdigest()
        self._http.blobs[digest] = bytes(data)
        return _Upload(_Uploaded(_XetInfo(digest, len(data))))


class FakeXet:
    """Stands in for `hf_xet.XetSession`: first asks the Hub for a write token (through the
    library's client here; hf_xet would make that request itself) and refuses as hf_xet does
    when the token may not write, then keeps uploaded bytes for the fake Hub's batch route."""

    def __init__(self, http: HubHttp) -> None:
        self._http = http

    def new_upload_commit(self, **kwargs: Any) -> _Commit:
        from hf_xet import XetAuthenticationError  # type: ignore[attr-defined]
        from huggingface_hub.utils import get_session

        response = get_session().get(
            kwargs["token_refresh_url"], headers=kwargs.get("token_refresh_headers") or {}
        )
        if response.status_code in (401, 403):
            raise XetAuthenticationError(f"{response.status_code} for the xet write token")
        response.raise_for_status()
        return _Commit(self._http)


ARTIFACTS = constants.HF_JOBS_ARTIFACTS_BUCKET_NAME
