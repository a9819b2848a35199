"""The Hugging Face Jobs backend: real `huggingface_hub` calls behind the `JobsBackend` Protocol.

Chosen only by `POSTTRAIN_BACKEND=hf` (it spends money), with `HF_TOKEN`. The broker's token
lives in exactly one place, the `HfApi(token=...)` that starts, watches and cancels jobs; inputs
are looked up through a second `HfApi(token=False)`. No job ever receives the token (§6).

- submit: one `run_uv_job` per job, labelled with this deployment and a hash of the job's
  workflow id; `find_by_key` finds it again, so a retried submit never starts a second job.
- observe: one `list_jobs` call for all of this deployment's live jobs, plus one `inspect_job`
  per watched job that has left that list (i.e. once, at its end).
- cancel: `cancel_job`, then confirm a terminal stage; an unconfirmed cancellation raises
  `TransientBackendError`, so the cancel activity keeps retrying, visibly, with the job id.

huggingface_hub is synchronous: every call runs in a thread (`activities.hf.errors.hub_call`).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from huggingface_hub import HfApi, JobHardwareInfo, JobInfo, Volume
from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError
from pydantic import BaseModel
from temporalio import activity

from activities.backend import JobRequest, TransientBackendError
from activities.hf import inputs
from activities.hf.artifacts import GIB, evaluated_outputs
from activities.hf.errors import hub_call, hub_list, status_of, translate
from activities.hf.labels import (
    LABEL_DEPLOYMENT,
    LABEL_EPISODE,
    LABEL_JOB,
    LABEL_KEY,
    LABEL_ROLE,
    HfRef,
    job_labels,
    key_label,
    label_value,
)
from activities.hf.prices import DEFAULT_TTL_S, PriceCache
from activities.hf.stages import LIVE_STAGES, backend_job, stage_of, vanished_job
from activities.hf.submission import (
    check_request,
    input_volumes,
    job_file,
    job_name,
)
from job_launcher.builder import LauncherConfig
from posttrain_env.contracts.episodes import JobLimits
from posttrain_env.contracts.jobs import BackendJob, JobRole
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import FlavorPrice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HfBackendConfig:
    python: str = "3.12"  # the job image's interpreter (`uv run --python`)
    image: str | None = None  # None: huggingface_hub's uv image for that Python
    price_ttl_s: float = DEFAULT_TTL_S
    # Confirming a cancellation: this many looks, this far apart, inside one cancel activity
    # (its start-to-close timeout is 15 s); then the activity fails and is retried.
    cancel_confirm_looks: int = 3
    cancel_confirm_interval_s: float = 2.0
    artifact_cap_bytes: int = 20 * GIB  # DESIGN §9: the default cap on Hugging Face
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


class LiveJob(BaseModel):
    """One of this deployment's jobs that is still scheduling or running (for the reaper)."""

    ref: str
    episode_id: str
    job_id: str
    role: str
    stage: str


class HfBackend:
    """Implements activities.backend.JobsBackend on Hugging Face Jobs."""

    name = "hf"
    prices_simulated = False
    uses_local_models = False

    def __init__(
        self,
        api: HfApi,
        public_api: HfApi,
        *,
        deployment: str,
        namespace: str | None = None,
        config: HfBackendConfig | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """`api` holds the broker's token; `public_api` must be an `HfApi(token=False)`."""
        if getattr(public_api, "token", None) is not False:
            raise ValueError("inputs are looked up without the token: pass HfApi(token=False)")
        self._api = api
        self._public = public_api
        self._token = api.token if isinstance(api.token, str) else ""
        self.deployment = deployment
        self._namespace = namespace
        self._namespace_lock = asyncio.Lock()
        self._config = config or HfBackendConfig()
        self._clock = clock or (lambda: datetime.now(UTC))
        self._prices = PriceCache(self._fetch_hardware, ttl_s=self._config.price_ttl_s)
        self.job_python_version = self._config.python

    # -- JobsBackend ---------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> BackendJob:
        check_request(request, self._token)
        if await self._prices.price(request.flavor) is None:
            raise ToolError(
                ErrorType.hf_error,
                f"Hugging Face offers no flavor {request.flavor!r} at the moment; "
                "choose one list_hardware shows",
            )
        namespace = await self.namespace()
        volumes = input_volumes(request)
        if request.role is not JobRole.agent:
            volumes.append(await self._model_volume(request, namespace))
        filename, text = job_file(request, self._config.launcher)
        with tempfile.TemporaryDirectory(prefix="posttrain-hf-") as folder:
            path = Path(folder) / filename
            path.write_text(text, encoding="utf-8")
            # run_uv_job uploads the file to <namespace>/jobs-artifacts/<folder>/ and mounts
            # that folder at /data; no `dependencies` (the launcher installs them itself).
            info = await hub_call(
                f"starting job {request.job_id}",
                self._api.run_uv_job,
                str(path),
                python=self._config.python,
                image=self._config.image,
                env=dict(request.env),
                secrets=dict(request.secrets) or None,
                flavor=request.flavor,
                timeout=int(request.timeout_s),
                labels=job_labels(request, self.deployment),
                volumes=volumes,
                namespace=namespace,
                name=job_name(request),
            )
        log.info("started Hugging Face job %s for %s (%s)", info.id, request.job_id, request.role)
        return backend_job(info, ref=HfRef.of(info).encode(), key=request.key, now=self._clock())

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        found = await self._list({LABEL_DEPLOYMENT: self.deployment, LABEL_KEY: key_label(key)})
        if not found:
            return None
        if len(found) > 1:  # never expected: it would mean a submit was not exactly-once
            log.error("%d Hugging Face jobs carry the key of %s", len(found), key)
        first = min(found, key=lambda info: info.created_at or self._clock())
        return backend_job(first, ref=HfRef.of(first).encode(), key=key, now=self._clock())

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        wanted: dict[str, HfRef] = {}
        for ref in refs:
            try:
                wanted[ref] = HfRef.decode(ref)
            except ValueError:
                log.error("not a Hugging Face job ref, left out: %r", ref)
        if not wanted:
            return {}
        live = {
            info.id: info
            for info in await self._list({LABEL_DEPLOYMENT: self.deployment}, status=LIVE_STAGES)
        }
        seen: dict[str, BackendJob] = {}
        for ref, hf in wanted.items():
            # A job that left the live list is looked at once, to see how it ended.
            info = live.get(hf.job_id) or await self._inspect(hf.job_id)
            if info is None:
                seen[ref] = vanished_job(ref=ref, key="", now=self._clock())
            else:
                key = (info.labels or {}).get(LABEL_KEY, "")
                seen[ref] = backend_job(info, ref=ref, key=key, now=self._clock())
        return seen

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        hf = _decode(ref)
        namespace = await self.namespace()
        _heartbeat(hf.job_id, namespace, "cancelling")
        try:
            await hub_call(
                f"cancelling job {hf.job_id}",
                self._api.cancel_job,
                job_id=hf.job_id,
                namespace=namespace,
                keep=(HfHubHTTPError,),
            )
        except HfHubHTTPError as err:
            # A job that already ended may refuse cancellation: its own state decides below.
            status = status_of(err) or 0
            if status in (401, 402, 403, 429) or status >= 500:
                raise translate(err, f"cancelling job {hf.job_id}", namespace) from None
            log.info("cancel of %s answered %s; looking at its state", hf.job_id, status)
        config = self._config
        info: JobInfo | None = None
        for look in range(max(1, config.cancel_confirm_looks)):
            info = await self._inspect(hf.job_id)
            if info is None:
                return vanished_job(ref=ref, key="", now=self._clock())
            job = backend_job(info, ref=ref, key="", now=self._clock())
            if job.state.terminal:
                return job
            _heartbeat(hf.job_id, namespace, f"waiting for confirmation ({stage_of(info)})")
            if look + 1 < max(1, config.cancel_confirm_looks):
                await asyncio.sleep(config.cancel_confirm_interval_s)
        # Retried by the activity's policy: a stuck cancellation stays visible in the UI.
        stage = stage_of(info) if info is not None else "unknown"
        raise TransientBackendError(
            f"cancellation of Hugging Face job {hf.job_id} in {namespace} is not confirmed yet "
            f"(still {stage}); asking again"
        )

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        if tail <= 0:
            return []
        hf = _decode(ref)
        lines = await hub_list(
            f"reading the logs of job {hf.job_id}",
            self._api.fetch_job_logs,
            job_id=hf.job_id,
            namespace=await self.namespace(),
            follow=False,
            tail=tail,
        )
        return lines[-tail:]

    async def hardware(self, flavors: Sequence[str] = ()) -> list[FlavorPrice]:
        """Current prices (cached); a flavor in `flavors` the cache lacks forces a refresh."""
        return list((await self._prices.prices(flavors)).values())

    def job_limits(self) -> JobLimits | None:
        return None  # not reported (the local backend reports its own)

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        return await inputs.resolve_model(self._public, repo_id, revision)

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        return await inputs.resolve_dataset(self._public, repo_id, denylist)

    # -- for the reaper and the smoke test ------------------------------------------------------

    async def live_jobs(self) -> list[LiveJob]:
        """This deployment's jobs that are still scheduling or running."""
        found = await self._list({LABEL_DEPLOYMENT: self.deployment}, status=LIVE_STAGES)
        return [
            LiveJob(
                ref=HfRef.of(info).encode(),
                episode_id=(info.labels or {}).get(LABEL_EPISODE, ""),
                job_id=(info.labels or {}).get(LABEL_JOB, ""),
                role=(info.labels or {}).get(LABEL_ROLE, ""),
                stage=stage_of(info),
            )
            for info in found
        ]

    async def episode_jobs(self, episode_id: str) -> list[JobInfo]:
        """Every job of this deployment for one episode, as the Hub records them."""
        labels = {LABEL_DEPLOYMENT: self.deployment, LABEL_EPISODE: label_value(episode_id)}
        return await self._list(labels)

    async def describe(self, ref: str) -> JobInfo | None:
        """The Hub's own record of a job (its durations, labels, volumes), or None if gone."""
        return await self._inspect(_decode(ref).job_id)

    async def namespace(self) -> str:
        """POSTTRAIN_NAMESPACE, or the token's user (asked once)."""
        if self._namespace is None:
            async with self._namespace_lock:
                if self._namespace is None:
                    me = await hub_call("finding the token's user", self._api.whoami)
                    self._namespace = str(me["name"])
        return self._namespace

    # -- internals -----------------------------------------------------------------------------

    async def _fetch_hardware(self) -> list[JobHardwareInfo]:
        return await hub_call("reading job prices", self._public.list_jobs_hardware)

    async def _list(self, labels: dict[str, str], status: list[str] | None = None) -> list[JobInfo]:
        return await hub_list(
            "listing jobs",
            self._api.list_jobs,
            labels=labels,
            status=status,
            namespace=await self.namespace(),
        )

    async def _model_volume(self, request: JobRequest, namespace: str) -> Volume:
        try:
            evaluated: HfRef | None = HfRef.decode(request.artifact_ref or "")
        except ValueError:
            evaluated = None
        if evaluated is not None and evaluated.folder is None:  # the Hub's record has it
            info = await self._inspect(evaluated.job_id)
            evaluated = HfRef.of(info) if info is not None else evaluated
        cap = request.artifact_cap_bytes or self._config.artifact_cap_bytes
        return await evaluated_outputs(self._api, namespace, evaluated, cap)

    async def _inspect(self, job_id: str) -> JobInfo | None:
        """The job, or None when the Hub no longer knows it."""
        try:
            return await hub_call(
                f"looking at job {job_id}",
                self._api.inspect_job,
                job_id=job_id,
                namespace=await self.namespace(),
                keep=(JobNotFoundError,),
            )
        except JobNotFoundError:
            return None


def _decode(ref: str) -> HfRef:
    try:
        return HfRef.decode(ref)
    except ValueError:
        raise ToolError(
            ErrorType.hf_error, f"{ref!r} names no Hugging Face job of this backend"
        ) from None


def _heartbeat(job_id: str, namespace: str, doing: str) -> None:
    """Inside the cancel activity: the job's id in its details, for the Temporal UI."""
    if activity.in_activity():
        activity.heartbeat({"hf_job_id": job_id, "namespace": namespace, "doing": doing})
