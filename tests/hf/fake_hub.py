"""A recording fake of `huggingface_hub.HfApi`: no network, the library's own types and errors.

`FakeHub` is the service (jobs, buckets, datasets, models, prices, a clock); `hub.api(token)`
gives an `HfApi` stand-in bound to one token, as `HfApi(token=...)` is. Every call is checked
against the real `HfApi` method's signature (a wrong keyword fails here as it would there) and
recorded with its bound arguments, which api made it and, for `run_uv_job`, the uploaded file's
text, so tests assert on what was really sent.

Results are the library's own objects built from Hub-shaped JSON (`JobInfo(**json)`,
`JobHardwareInfo(**json)`, `DatasetInfo(**json)`, ...), and errors are raised by the library's
own `hf_raise_for_status` on a Hub-shaped response, so `RepositoryNotFoundError`,
`JobNotFoundError` etc. are exactly what the real client raises.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import (
    DatasetInfo,
    HfApi,
    JobHardwareInfo,
    JobInfo,
    ModelInfo,
    Volume,
    constants,
)
from huggingface_hub._buckets import BucketFile
from huggingface_hub._jobs_api import DEFAULT_UV_IMAGE, _create_job_spec
from huggingface_hub.utils import hf_raise_for_status

ENDPOINT = "https://huggingface.co"
REPO_NOT_FOUND = {"X-Error-Code": "RepoNotFound"}
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

HARDWARE_JSON: list[dict[str, Any]] = [
    {
        "name": "cpu-basic",
        "prettyName": "CPU Basic",
        "cpu": "2 vCPU",
        "ram": "16 GB",
        "ephemeralStorage": "50 GB",
        "accelerator": None,
        "unitCostMicroUSD": 167,
        "unitCostUSD": 0.000167,
        "unitLabel": "minute",
    },
    {
        "name": "cpu-upgrade",
        "prettyName": "CPU Upgrade",
        "cpu": "8 vCPU",
        "ram": "32 GB",
        "ephemeralStorage": "50 GB",
        "accelerator": None,
        "unitCostMicroUSD": 500,
        "unitCostUSD": 0.0005,
        "unitLabel": "minute",
    },
    {
        "name": "t4-small",
        "prettyName": "Nvidia T4 - small",
        "cpu": "4 vCPU",
        "ram": "15 GB",
        "ephemeralStorage": "50 GB",
        "accelerator": {
            "type": "gpu",
            "model": "T4",
            "quantity": "1",
            "vram": "16 GB",
            "manufacturer": "Nvidia",
        },
        "unitCostMicroUSD": 6667,
        "unitCostUSD": 0.006667,
        "unitLabel": "minute",
    },
]


def dataset_json(repo_id: str, sha: str, **overrides: Any) -> dict[str, Any]:
    """What `GET /api/datasets/<repo_id>` answers for a public dataset."""
    return {
        "_id": "65f0c0ffee0000000000beef",
        "id": repo_id,
        "author": repo_id.split("/")[0],
        "sha": sha,
        "lastModified": "2025-11-03T10:00:00.000Z",
        "createdAt": "2024-05-01T08:00:00.000Z",
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 1234,
        "likes": 7,
        "tags": ["task_categories:text-generation", "size_categories:1K<n<10K"],
        "cardData": {"license": "mit"},
        "siblings": [{"rfilename": "README.md"}, {"rfilename": "data/train.parquet"}],
        **overrides,
    }


def model_json(repo_id: str, sha: str, **overrides: Any) -> dict[str, Any]:
    return {
        "_id": "65f0c0ffee0000000000cafe",
        "id": repo_id,
        "modelId": repo_id,
        "author": repo_id.split("/")[0],
        "sha": sha,
        "lastModified": "2025-10-01T10:00:00.000Z",
        "private": False,
        "gated": False,
        "disabled": False,
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["transformers", "safetensors", "llama"],
        "siblings": [{"rfilename": "config.json"}, {"rfilename": "model.safetensors"}],
        **overrides,
    }


def http_error(status: int, method: str, url: str, **headers: str) -> Exception:
    """The exception huggingface_hub raises for this response."""
    response = httpx2.Response(
        status,
        request=httpx2.Request(method, url),
        headers=headers,
        json={"error": headers.get("X-Error-Message", f"fake {status}")},
    )
    try:
        hf_raise_for_status(response)
    except Exception as err:  # the library's own choice of class
        return err
    raise AssertionError(f"{status} did not raise")


@dataclass
class JobPlan:
    """How a fake job goes: seconds of fake-clock time in each stage."""

    scheduling_s: float = 5.0
    running_s: float = 60.0
    outcome: str = "COMPLETED"  # or "ERROR"
    message: str | None = None
    # After cancel_job: seconds until the stage is CANCELED; None: never (unconfirmed).
    cancel_after_s: float | None = 0.0
    logs: list[str] = field(default_factory=list)
    outputs: dict[str, int] = field(default_factory=dict)  # file under outputs/ -> size


@dataclass
class Call:
    method: str
    token: str | bool | None  # the token of the HfApi the call was made on
    args: dict[str, Any]  # bound to the real HfApi signature (defaults not applied)
    script_text: str | None = None


@dataclass
class FakeJob:
    id: str
    spec: dict[str, Any]  # what the library sent (camelCase), as `_create_job_spec` builds it
    plan: JobPlan
    created_at: datetime
    folder: str | None
    cancel_at: datetime | None = None
    forced_stage: str | None = None
    outputs_written: bool = False  # a job writes its outputs once (they may be deleted later)


@dataclass
class Failure:
    status: int
    after: bool = False  # the call takes effect, then the connection "drops" (raises)
    headers: dict[str, str] = field(default_factory=dict)


class FakeHub:
    def __init__(self, namespace: str = "alice", clock: Callable[[], datetime] | None = None):
        self.namespace = namespace
        self.now = T0
        self._clock = clock
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[Call] = []
        self.hardware = [dict(h) for h in HARDWARE_JSON]
        self.datasets: dict[str, dict[str, Any] | int] = {}  # JSON, or an HTTP status
        self.models: dict[str, dict[str, Any]] = {}
        self.buckets: dict[str, dict[str, int]] = {}  # bucket id -> path -> size
        self.plan = JobPlan()
        self.plan_for: Callable[[dict[str, str]], JobPlan] | None = None
        self._failures: dict[str, list[Failure]] = {}
        self._ids = itertools.count(0x68780D00BBE36D38803F0000)
        self._lock = threading.RLock()

    # -- test controls -------------------------------------------------------------------------

    def api(self, token: str | bool) -> FakeHfApi:
        return FakeHfApi(self, token)

    def clock(self) -> datetime:
        return self._clock() if self._clock is not None else self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def fail(self, method: str, status: int, times: int = 1, *, after: bool = False) -> None:
        """The next `times` calls of `method` fail with `status` (after taking effect if
        `after`: a connection that drops once the Hub has done the work)."""
        self._failures.setdefault(method, []).extend(Failure(status, after) for _ in range(times))

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def count(self, *methods: str) -> int:
        return sum(1 for call in self.calls if call.method in methods)

    def info(self, job_id: str) -> JobInfo:
        with self._lock:
            return JobInfo(**self._job_json(self.jobs[job_id]), endpoint=ENDPOINT)

    def force_stage(self, job_id: str, stage: str | None) -> None:
        self.jobs[job_id].forced_stage = stage

    # -- the service ---------------------------------------------------------------------------

    def _call(self, api: FakeHfApi, method: str, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(getattr(HfApi, method)).bind(api, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        with self._lock:
            call = Call(method, api.token, arguments)
            if method == "run_uv_job" and Path(str(arguments["script"])).is_file():
                call.script_text = Path(str(arguments["script"])).read_text()
            self.calls.append(call)
            queued = self._failures.get(method) or []
            failure = queued.pop(0) if queued else None
            if failure is not None and not failure.after:
                raise self._error(method, failure.status, failure.headers)
            result = getattr(self, "_" + method)(api, **arguments)
            if isinstance(result, Iterator):
                result = list(result)  # state is read now, under the lock
            if failure is not None:
                raise self._error(method, failure.status, failure.headers)
            return iter(result) if isinstance(result, list) and method in _ITERATING else result

    def _error(self, method: str, status: int, headers: dict[str, str]) -> Exception:
        verb = "POST" if method in ("run_uv_job", "cancel_job") else "GET"
        return http_error(status, verb, f"{ENDPOINT}/api/jobs/{self.namespace}", **headers)

    def _ns(self, api: FakeHfApi, namespace: str | None) -> str:
        if api.token is False or api.token is None:
            raise http_error(401, "GET", f"{ENDPOINT}/api/jobs/{namespace or '?'}")
        if namespace is None:
            namespace = self.namespace  # the library would call whoami
        if namespace != self.namespace:
            raise http_error(403, "GET", f"{ENDPOINT}/api/jobs/{namespace}")
        return namespace

    def _run_uv_job(self, api: FakeHfApi, script: str, **kw: Any) -> JobInfo:
        namespace = self._ns(api, kw.get("namespace"))
        volumes: list[Volume] = list(kw.get("volumes") or [])
        uv_args: list[str] = []
        for dependency in kw.get("dependencies") or []:
            uv_args += ["--with", dependency]
        if kw.get("python"):
            uv_args += ["--python", kw["python"]]
        folder = None
        target = script
        if Path(script).is_file():  # as the library: upload to jobs-artifacts, mount at /data
            if any(v.mount_path == constants.HF_JOBS_ARTIFACTS_MOUNT_PATH for v in volumes):
                raise ValueError("Mount path '/data' is reserved for Jobs artifacts")
            folder = f"{self.clock().strftime('%Y%m%dT%H%M%S')}-{next(self._ids) % 0xFFFFFF:06x}"
            bucket = f"{namespace}/{constants.HF_JOBS_ARTIFACTS_BUCKET_NAME}"
            name = Path(script).name
            self.buckets.setdefault(bucket, {})[f"{folder}/{name}"] = Path(script).stat().st_size
            volumes.append(
                Volume(
                    type="bucket", source=bucket, mount_path="/data", path=folder, read_only=False
                )
            )
            target = f"/data/{name}"
        spec = _create_job_spec(
            image=kw.get("image") or DEFAULT_UV_IMAGE,
            command=["uv", "run", *uv_args, target, *(kw.get("script_args") or [])],
            env=kw.get("env"),
            secrets=kw.get("secrets"),
            flavor=kw.get("flavor"),
            timeout=kw.get("timeout"),
            name=kw.get("name") or "uv-job",
            labels=kw.get("labels"),
            volumes=volumes,
        )
        labels = spec.get("labels") or {}
        plan = self.plan_for(labels) if self.plan_for else self.plan
        job = FakeJob(
            id=f"{next(self._ids):024x}",
            spec=spec,
            plan=plan,
            created_at=self.clock(),
            folder=folder,
        )
        self.jobs[job.id] = job
        return JobInfo(**self._job_json(job), endpoint=ENDPOINT)

    def _list_jobs(self, api: FakeHfApi, **kw: Any) -> Iterator[JobInfo]:
        self._ns(api, kw.get("namespace"))
        wanted = kw.get("labels") or {}
        status = kw.get("status")
        stages = [status] if isinstance(status, str) else list(status or [])
        upper = [str(s).upper() for s in stages]
        for job in self.jobs.values():
            # Filtered before the job's JSON is built: the scale bench lists 10,000 jobs.
            labels = job.spec.get("labels") or {}
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            if stages and self._stage(job)[0] not in upper:
                continue
            yield JobInfo(**self._job_json(job), endpoint=ENDPOINT)

    def _inspect_job(self, api: FakeHfApi, job_id: str, **kw: Any) -> JobInfo:
        namespace = self._ns(api, kw.get("namespace"))
        if job_id not in self.jobs:
            raise http_error(404, "GET", f"{ENDPOINT}/api/jobs/{namespace}/{job_id}")
        return JobInfo(**self._job_json(self.jobs[job_id]), endpoint=ENDPOINT)

    def _cancel_job(self, api: FakeHfApi, job_id: str, **kw: Any) -> None:
        namespace = self._ns(api, kw.get("namespace"))
        if job_id not in self.jobs:
            raise http_error(404, "POST", f"{ENDPOINT}/api/jobs/{namespace}/{job_id}/cancel")
        job = self.jobs[job_id]
        if job.cancel_at is None and self._stage(job)[0] in ("SCHEDULING", "RUNNING"):
            job.cancel_at = self.clock()

    def _fetch_job_logs(self, api: FakeHfApi, job_id: str, **kw: Any) -> Iterator[str]:
        self._ns(api, kw.get("namespace"))
        job = self.jobs[job_id]
        # "{nonce}" in a planned line stands for the job's own nonce (evaluators print it).
        nonce = (job.spec.get("environment") or {}).get("POSTTRAIN_NONCE", "")
        lines = [line.replace("{nonce}", nonce) for line in job.plan.logs]
        lines = lines if self._stage(job)[0] != "SCHEDULING" else []
        tail = kw.get("tail")
        yield from lines[-tail:] if tail else lines

    def _list_jobs_hardware(self, api: FakeHfApi, **kw: Any) -> list[JobHardwareInfo]:
        return [JobHardwareInfo(**h) for h in self.hardware]

    def _dataset_info(self, api: FakeHfApi, repo_id: str, **kw: Any) -> DatasetInfo:
        known = self.datasets.get(repo_id, 404)
        if isinstance(known, int):
            raise http_error(known, "GET", f"{ENDPOINT}/api/datasets/{repo_id}", **REPO_NOT_FOUND)
        if known.get("private") and api.token is False:
            raise http_error(401, "GET", f"{ENDPOINT}/api/datasets/{repo_id}", **REPO_NOT_FOUND)
        return DatasetInfo(**known)

    def _model_info(self, api: FakeHfApi, repo_id: str, **kw: Any) -> ModelInfo:
        revision = kw.get("revision")
        if repo_id not in self.models:
            raise http_error(404, "GET", f"{ENDPOINT}/api/models/{repo_id}", **REPO_NOT_FOUND)
        data = self.models[repo_id]
        if revision not in (None, "main", data["sha"]):
            url = f"{ENDPOINT}/api/models/{repo_id}/revision/{revision}"
            raise http_error(404, "GET", url, **{"X-Error-Code": "RevisionNotFound"})
        return ModelInfo(**data)

    def _whoami(self, api: FakeHfApi, **kw: Any) -> dict[str, Any]:
        self._ns(api, None)
        return {"type": "user", "id": "5e9ecfc04957053f60648a3e", "name": self.namespace}

    def _list_bucket_tree(self, api: FakeHfApi, bucket_id: str, **kw: Any) -> list[BucketFile]:
        self._ns(api, bucket_id.split("/")[0])
        prefix = kw.get("prefix") or ""
        files = self.buckets.get(bucket_id, {})
        return [
            BucketFile(type="file", path=path, size=size, xetHash="0" * 64)
            for path, size in sorted(files.items())
            if path.startswith(prefix)  # as the Hub: character by character
        ]

    def _batch_bucket_files(self, api: FakeHfApi, bucket_id: str, **kw: Any) -> None:
        self._ns(api, bucket_id.split("/")[0])
        for content, path in kw.get("add") or []:
            self.buckets.setdefault(bucket_id, {})[path] = len(content)
        for path in kw.get("delete") or []:
            # As the Hub: deleting a path that is not there is no error.
            self.buckets.get(bucket_id, {}).pop(path, None)

    # -- a job at the fake clock's time ----------------------------------------------------------

    def _stage(self, job: FakeJob) -> tuple[str, datetime | None, datetime | None, str | None]:
        """(stage, started_at, finished_at, message) now."""
        now, plan = self.clock(), job.plan
        if job.forced_stage:
            return job.forced_stage, None, None, plan.message
        start = job.created_at + timedelta(seconds=plan.scheduling_s)
        timeout = job.spec.get("timeoutSeconds")
        run_s = plan.running_s if timeout is None else min(plan.running_s, timeout)
        end = start + timedelta(seconds=run_s)
        stage, message = plan.outcome, plan.message
        if timeout is not None and plan.running_s > timeout:
            stage = "ERROR"
        if job.cancel_at is not None and job.cancel_at < end:
            if plan.cancel_after_s is None:
                end = datetime.max.replace(tzinfo=UTC)
            else:
                end = job.cancel_at + timedelta(seconds=plan.cancel_after_s)
                stage, message = "CANCELED", None
                start = min(start, end)
        if now < min(start, end):
            return "SCHEDULING", None, None, None
        if now < end:
            return "RUNNING", start, None, None
        if stage == "COMPLETED" and job.folder and not job.outputs_written:
            job.outputs_written = True
            bucket = job.spec["volumes"][-1]["source"]
            for path, size in plan.outputs.items():
                self.buckets.setdefault(bucket, {})[f"{job.folder}/outputs/{path}"] = size
        return stage, start, end, message

    def _job_json(self, job: FakeJob) -> dict[str, Any]:
        stage, started, finished, message = self._stage(job)
        now = self.clock()
        ran_until = finished or now
        spec = job.spec
        return {
            "id": job.id,
            "createdAt": _iso(job.created_at),
            "startedAt": _iso(started) if started else None,
            "finishedAt": _iso(finished) if finished else None,
            "dockerImage": spec.get("dockerImage") or DEFAULT_UV_IMAGE,
            "command": spec["command"],
            "arguments": spec.get("arguments", []),
            "environment": spec.get("environment", {}),
            "secrets": {name: "<encrypted>" for name in spec.get("secrets") or {}},
            "flavor": spec["flavor"],
            "labels": spec.get("labels"),
            "volumes": spec.get("volumes"),
            "status": {"stage": stage, "message": message},
            "durations": {
                "schedulingSecs": int(((started or ran_until) - job.created_at).total_seconds()),
                "runningSecs": int((ran_until - started).total_seconds()) if started else None,
                "totalSecs": int((ran_until - job.created_at).total_seconds()),
            },
            "owner": {"id": "5e9ecfc04957053f60648a3e", "name": self.namespace, "type": "user"},
            "initiator": {"type": "user", "id": "5e9ecfc04957053f60648a3e", "name": self.namespace},
            "retry": 0,
        }


_ITERATING = {"list_jobs", "fetch_job_logs", "list_bucket_tree"}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class FakeHfApi:
    """Stands in for `HfApi(token=...)`; every method is the hub's, checked and recorded."""

    def __init__(self, hub: FakeHub, token: str | bool) -> None:
        self.hub = hub
        self.token = token
        self.endpoint = ENDPOINT

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_") or not hasattr(HfApi, method):
            raise AttributeError(method)
        if not hasattr(FakeHub, "_" + method):
            raise AssertionError(f"the backend called HfApi.{method}, which the fake lacks")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.hub._call(self, method, args, kwargs)

        return call
