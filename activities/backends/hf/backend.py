"""The Hugging Face Jobs backend: real `huggingface_hub` calls behind the `JobsBackend` Protocol.

Chosen only by `POSTTRAIN_BACKEND=hf` (it spends money), with `HF_TOKEN`. The broker's token
lives in exactly one place, the `HfApi(token=...)` that starts, watches and cancels jobs; inputs
are looked up through a second `HfApi(token=False)`. No job ever receives the token (§6).

- submit: one `run_uv_job` per job, labelled with this deployment and a hash of the job's
  workflow id; `find_by_key` finds it again, so a retried submit never starts a second job. A
  retried submit also waits a while for a job that its earlier attempt's create may still
  produce (a request that timed out on our side can still succeed on the Hub's), looking by
  label several times, since the Hub's listing can lag behind a new job.
- observe: one `list_jobs` call per namespace for all of this deployment's live jobs, plus one
  `inspect_job` per watched job that has left that list (i.e. once, at its end). A live job
  that carries a watched job's key but is not that job is a duplicate: it is cancelled.
  Observe degrades per job: a namespace whose listing is refused (401/403) while another
  answers, a look that fails, and the looks left when the call's time runs out
  (`OBSERVE_TIMEOUT`) leave those jobs out of this answer only (the watcher looks again next
  period); the looks start with the jobs looked at longest ago (`missing.LookOrder`), so
  none is left out every time.
- cancel: look, then `cancel_job`, then confirm a terminal stage; an unconfirmed cancellation
  raises `TransientBackendError`, so the cancel activity keeps retrying, visibly, with the job id.

Every listing is checked again here against the labels it asked for (`labels.carries`): a job
without this deployment's label is never adopted, watched or reaped, whatever the server
returned. Every job's ref names its namespace, and every call on the job uses that one.
huggingface_hub is synchronous: every call runs in the backend's own threads under a deadline
(`activities/backends/hf/calls.py`, `activities/backends/hf/http.py`).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from huggingface_hub import HfApi, JobHardwareInfo, JobInfo, Volume
from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError
from temporalio import activity

from activities.backends.hf import inputs
from activities.backends.hf.artifacts import evaluated_outputs
from activities.backends.hf.calls import HubCalls
from activities.backends.hf.errors import status_of, translate
from activities.backends.hf.http import HubHttpLimits
from activities.backends.hf.labels import (
    LABEL_DEPLOYMENT,
    LABEL_EPISODE,
    LABEL_JOB,
    LABEL_KEY,
    LABEL_ROLE,
    HfRef,
    carries,
    job_labels,
    key_label,
    label_value,
    outputs_caps,
)
from activities.backends.hf.listing_reuse import LISTING_REUSE_S, RecentListings
from activities.backends.hf.missing import LookOrder, MissingJobs
from activities.backends.hf.namespaces import NamespaceNotes
from activities.backends.hf.prices import DEFAULT_TTL_S, PriceCache
from activities.backends.hf.stages import LIVE_STAGES, backend_job, stage_of, vanished_job
from activities.backends.hf.storage import HfJobStorage
from activities.backends.hf.submission import check_request, input_volumes, job_file, job_name
from activities.backends.interface import DatasetBytes, JobRequest, LiveJob, TransientBackendError
from activities.backends.storage import StorageRefused
from job_launcher.builder import LauncherConfig
from posttrain_common.contracts.episodes import JobLimits
from posttrain_common.contracts.jobs import (
    BackendJob,
    JobRole,
    KeepOutputs,
    with_outputs_judged,
)
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    HF_ARTIFACT_CAP_BYTES,
    HF_EPISODE_STORAGE_BYTES,
    SUBMIT_LOOK_INTERVAL_S,
    SUBMIT_SETTLE_LOOKS,
    SUBMIT_SETTLE_S,
    VANISHED_AFTER_LOOKS,
    VANISHED_AFTER_S,
)
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
    artifact_cap_bytes: int = HF_ARTIFACT_CAP_BYTES  # DESIGN §9: the default cap on Hugging Face
    storage_cap_bytes: int = HF_EPISODE_STORAGE_BYTES  # an episode's artifacts together
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    submit_settle_looks: int = SUBMIT_SETTLE_LOOKS
    submit_look_interval_s: float = SUBMIT_LOOK_INTERVAL_S
    submit_settle_s: float = SUBMIT_SETTLE_S
    vanished_after_looks: int = VANISHED_AFTER_LOOKS
    vanished_after_s: float = VANISHED_AFTER_S
    http: HubHttpLimits = field(default_factory=HubHttpLimits)
    # A watcher shard's look reuses a live listing this recent (listing_reuse.py); 0: never.
    listing_reuse_s: float = LISTING_REUSE_S


class HfBackend:
    """Implements activities.backends.interface.JobsBackend on Hugging Face Jobs."""

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
        calls: HubCalls | None = None,
        namespaces: NamespaceNotes | None = None,
    ) -> None:
        """`api` holds the broker's token; `public_api` must be an `HfApi(token=False)`.
        `namespaces`: where the namespaces this deployment has jobs in are noted (default: in
        memory only)."""
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
        self._calls = calls or HubCalls(self._config.http)
        self._listings = RecentListings(self._config.listing_reuse_s)
        self._namespaces = namespaces or NamespaceNotes()
        self._prices = PriceCache(self._fetch_hardware, ttl_s=self._config.price_ttl_s)
        self._missing = MissingJobs(
            self._config.vanished_after_looks, self._config.vanished_after_s
        )
        self._looks = LookOrder()
        self.job_python_version = self._config.python
        self.default_artifact_cap_bytes = self._config.artifact_cap_bytes
        self.default_storage_cap_bytes = self._config.storage_cap_bytes

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
        await self._note(namespace)  # before the create: a create that lands late is found
        if _is_a_retry():
            earlier = await self._earlier_attempts_job(request.key, namespace)
            if earlier is not None:
                return earlier
        volumes = input_volumes(request)
        if request.role is not JobRole.agent:
            volumes.append(await self._model_volume(request, namespace))
        # In a thread: checking a large script's syntax for a newer Python takes a while.
        filename, text = await asyncio.to_thread(
            job_file, request, self._config.launcher, self._config.python
        )
        with tempfile.TemporaryDirectory(prefix="posttrain-hf-") as folder:
            path = Path(folder) / filename
            path.write_text(text, encoding="utf-8")
            # run_uv_job creates <namespace>/jobs-artifacts if needed, uploads the file to a
            # folder of its own choosing and mounts that folder at /data, then creates the job:
            # three requests or more, each bounded. No `dependencies` (the launcher installs
            # them itself). One attempt: a Hub-side re-run would bill a second time.
            info = await self._calls.call(
                f"starting job {request.job_id}",
                self._api.run_uv_job,
                str(path),
                python=self._config.python,
                image=self._config.image,
                env=dict(request.env),
                secrets=dict(request.secrets) or None,
                flavor=request.flavor,
                timeout=int(request.timeout_s),
                attempts=1,
                labels=job_labels(request, self.deployment),
                volumes=volumes,
                namespace=namespace,
                name=job_name(request),
            )
        log.info("started Hugging Face job %s for %s (%s)", info.id, request.job_id, request.role)
        ref = HfRef.of(info, namespace).encode()
        return backend_job(info, ref=ref, key=request.key, now=self._clock())

    async def find_by_key(self, key: str, now: datetime) -> BackendJob | None:
        return await self._by_key(key, await self.namespace())

    async def observe(self, refs: Sequence[str], now: datetime) -> dict[str, BackendJob]:
        wanted: dict[str, HfRef] = {}
        for ref in refs:
            try:
                wanted[ref] = HfRef.decode(ref)
            except ValueError:
                log.error("not a Hugging Face job ref, left out: %r", ref)
        if not wanted:
            return {}
        current = await self.namespace()
        by_namespace: dict[str, dict[str, HfRef]] = {}
        for ref, hf in wanted.items():
            by_namespace.setdefault(hf.namespace or current, {})[ref] = hf
        watched_ids = {hf.job_id for hf in wanted.values()}
        seen: dict[str, BackendJob] = {}
        refused: list[ToolError] = []
        left_out = 0
        for namespace, group in by_namespace.items():
            await self._note(namespace)
            try:
                live = await self._listings.live(
                    namespace,
                    partial(self._live_jobs_in, namespace),
                    now,
                    {hf.job_id for hf in group.values()},
                )
            except ToolError as err:
                # One namespace refused (401/403: the token lost access to it): its jobs are
                # left out of this look, the others' are still observed. When every one
                # refused, the activity fails (and is retried, visibly) as before. A
                # transient failure (429, 5xx, a timeout) fails it too: its retry, after the
                # Hub's own delay, is the next look.
                refused.append(err)
                log.warning(
                    "observe leaves out %d jobs in %s this time: %s",
                    len(group),
                    namespace,
                    err.message,
                )
                left_out += len(group)
                continue
            live_by_id = {info.id: info for info in live}
            ended = [ref for ref, hf in group.items() if hf.job_id not in live_by_id]
            for ref, hf in group.items():
                if hf.job_id in live_by_id:
                    job = self._seen(ref, hf, namespace, live_by_id[hf.job_id])
                    if job is not None:
                        seen[ref] = job
            # A job that left the live list is looked at once, to see how it ended: each look
            # on its own, those looked at longest ago first, while the call's time lasts.
            for ref in self._looks.order(ended):
                hf = group[ref]
                if self._calls.call_seconds() <= 0:
                    left_out += 1
                    continue
                self._looks.looked(ref)
                try:
                    info = await self._inspect(hf.job_id, namespace)
                except (ToolError, TransientBackendError) as err:
                    log.warning("observe leaves out job %s this time: %s", hf.job_id, err)
                    left_out += 1
                    continue
                job = self._seen(ref, hf, namespace, info)
                if job is not None and info is not None:
                    job = await self._with_outputs(job, info)
                if job is not None:
                    seen[ref] = job
            await self._cancel_duplicates(namespace, live, watched_ids)
        if refused and len(refused) == len(by_namespace):
            raise refused[0]
        if left_out:
            log.warning(
                "observe left out %d of %d jobs; the next look tries again", left_out, len(wanted)
            )
        return seen

    async def cancel(self, ref: str, now: datetime) -> BackendJob:
        hf = _decode(ref)
        namespace = hf.namespace or await self.namespace()
        _heartbeat(hf.job_id, namespace, "cancelling")
        # Look first: a job that already ended needs no cancel, and one without this
        # deployment's label is never cancelled by it.
        job = self._seen_or_retry(ref, hf, namespace, await self._inspect(hf.job_id, namespace))
        if job.state.terminal:
            return job
        try:
            await self._calls.call(
                f"cancelling job {hf.job_id}",
                self._api.cancel_job,
                job_id=hf.job_id,
                namespace=namespace,
                keep=(HfHubHTTPError,),
            )
        except HfHubHTTPError as err:
            # A job that ended meanwhile may refuse cancellation: its own state decides below.
            status = status_of(err) or 0
            if status in (401, 402, 403, 429) or status >= 500:
                raise translate(err, f"cancelling job {hf.job_id}", namespace) from None
            log.info("cancel of %s answered %s; looking at its state", hf.job_id, status)
        looks = max(1, self._config.cancel_confirm_looks)
        for look in range(looks):
            info = await self._inspect(hf.job_id, namespace)
            job = self._seen_or_retry(ref, hf, namespace, info)
            if job.state.terminal:
                return job
            _heartbeat(hf.job_id, namespace, f"waiting for confirmation ({job.state.value})")
            if look + 1 < looks:
                await asyncio.sleep(self._config.cancel_confirm_interval_s)
        # Retried by the activity's policy: a stuck cancellation stays visible in the UI.
        raise TransientBackendError(
            f"cancellation of Hugging Face job {hf.job_id} in {namespace} is not confirmed yet "
            f"(still {job.state.value}); asking again"
        )

    async def logs(self, ref: str, tail: int, now: datetime) -> list[str]:
        if tail <= 0:
            return []
        hf = _decode(ref)
        lines = await self._calls.listing(
            f"reading the logs of job {hf.job_id}",
            self._api.fetch_job_logs,
            job_id=hf.job_id,
            namespace=hf.namespace or await self.namespace(),
            follow=False,
            tail=tail,
        )
        return lines[-tail:]

    async def keep_outputs(self, job: KeepOutputs) -> BackendJob:
        """The job's outputs in its bucket folder, measured once it ended (a Hugging Face job
        writes them there as it runs: nothing can stop it at a cap), kept within the caps or
        deleted whole. The look that first sees an agent job ended does this already, from
        the caps its labels carry (`_with_outputs`); this is the job workflow's fallback."""
        view = (await self.observe([job.ref], job.now)).get(job.ref)
        if view is None or not view.state.terminal:
            raise TransientBackendError(f"job {job.ref} is not seen ended yet; measuring later")
        if view.stored_bytes is not None:
            return view
        try:
            size = await self.storage().keep_outputs(job.ref, job.over)
        except StorageRefused as exc:
            raise ToolError(ErrorType.hf_error, str(exc)) from None
        return kept(view, size, job)

    async def _with_outputs(self, job: BackendJob, info: JobInfo) -> BackendJob:
        """An agent job seen ended, its outputs measured and kept within the caps its labels
        carry (or deleted whole). Left unmeasured when that fails now: its job workflow asks
        `keep_outputs` then."""
        caps = outputs_caps(info.labels, job.ref, self._clock())
        if caps is None or not job.state.terminal or job.started_at is None:
            return job
        if self._calls.call_seconds() <= 0:
            return job
        try:
            size = await self.storage().keep_outputs(job.ref, caps.over)
        except (StorageRefused, ToolError, TransientBackendError) as err:
            log.warning("the outputs of job %s are measured later: %s", job.ref, err)
            return job
        return kept(job, size, caps)

    async def hardware(self, flavors: Sequence[str] = ()) -> list[FlavorPrice]:
        """Current prices (cached); a flavor in `flavors` the cache lacks forces a refresh."""
        return list((await self._prices.prices(flavors)).values())

    def job_limits(self) -> JobLimits | None:
        return None  # not reported (the local backend reports its own)

    def storage(self) -> HfJobStorage:
        return HfJobStorage(self._calls, self._api, self.namespace)

    async def resolve_model(self, repo_id: str, revision: str) -> str:
        return await inputs.resolve_model(self._calls, self._public, repo_id, revision)

    async def resolve_dataset(self, repo_id: str, denylist: Sequence[str]) -> str:
        return await inputs.resolve_dataset(self._calls, self._public, repo_id, denylist)

    async def read_dataset(self, repo_id: str, revision: str, max_bytes: int) -> DatasetBytes:
        return await inputs.read_dataset(self._calls, self._public, repo_id, revision, max_bytes)

    async def read_outputs(self, ref: str, max_bytes: int) -> DatasetBytes:
        return await self.storage().read_outputs(ref, max_bytes)

    # -- for the reaper and the smoke test ------------------------------------------------------

    async def live_jobs(self) -> list[LiveJob]:
        """This deployment's jobs that are still scheduling or running, in the current
        namespace and in each namespace it has started or watched a job in lately
        (`activities/backends/hf/namespaces.py`). An earlier namespace that refuses the listing (the
        token lost access to it) is skipped, logged; the current one's refusal is raised."""
        current = await self.namespace()
        earlier = await asyncio.to_thread(self._namespaces.recent, datetime.now(UTC))
        live: list[LiveJob] = []
        for namespace in dict.fromkeys([current, *earlier]):
            try:
                found = await self._list(
                    namespace, {LABEL_DEPLOYMENT: self.deployment}, LIVE_STAGES
                )
            except ToolError as err:
                if namespace == current:
                    raise
                log.warning("the reaper skips namespace %s: %s", namespace, err.message)
                continue
            live += [
                LiveJob(
                    ref=HfRef.of(info, namespace).encode(),
                    episode_id=(info.labels or {}).get(LABEL_EPISODE, ""),
                    job_id=(info.labels or {}).get(LABEL_JOB, ""),
                    role=(info.labels or {}).get(LABEL_ROLE, ""),
                    stage=stage_of(info),
                )
                for info in found
            ]
        return live

    async def episode_jobs(self, episode_id: str) -> list[JobInfo]:
        """Every job of this deployment for one episode, as the Hub records them."""
        labels = {LABEL_DEPLOYMENT: self.deployment, LABEL_EPISODE: label_value(episode_id)}
        return await self._list(await self.namespace(), labels)

    async def describe(self, ref: str) -> JobInfo | None:
        """The Hub's own record of a job (its durations, labels, volumes), or None if gone."""
        hf = _decode(ref)
        return await self._inspect(hf.job_id, hf.namespace or await self.namespace())

    async def namespace(self) -> str:
        """POSTTRAIN_NAMESPACE, or the token's user (asked once): where new jobs start."""
        if self._namespace is None:
            async with self._namespace_lock:
                if self._namespace is None:
                    me = await self._calls.call("finding the token's user", self._api.whoami)
                    self._namespace = str(me["name"])
        return self._namespace

    # -- internals -----------------------------------------------------------------------------

    async def _note(self, namespace: str) -> None:
        """Note that this deployment has a job in `namespace` (for the reaper). On this
        machine's clock: the notes are kept in real days, whatever clock the Hub shows."""
        now = datetime.now(UTC)
        if self._namespaces.needs_note(namespace, now):
            await asyncio.to_thread(self._namespaces.note, namespace, now)

    async def _fetch_hardware(self) -> list[JobHardwareInfo]:
        return await self._calls.call("reading job prices", self._public.list_jobs_hardware)

    async def _live_jobs_in(self, namespace: str) -> list[JobInfo]:
        return await self._list(namespace, {LABEL_DEPLOYMENT: self.deployment}, LIVE_STAGES)

    async def _list(
        self, namespace: str, labels: dict[str, str], stages: list[str] | None = None
    ) -> list[JobInfo]:
        """Jobs carrying every one of `labels` (in one of `stages`), checked here again."""
        found = await self._calls.listing(
            "listing jobs",
            self._api.list_jobs,
            labels=labels,
            status=stages,
            namespace=namespace,
        )
        kept = [
            info
            for info in found
            if carries(info, labels) and (stages is None or stage_of(info) in stages)
        ]
        if len(kept) < len(found):
            log.warning(
                "the Hub listed %d jobs in %s that lack the labels or stages asked for; "
                "they are left out",
                len(found) - len(kept),
                namespace,
            )
        return kept

    async def _by_key(self, key: str, namespace: str) -> BackendJob | None:
        found = await self._list(
            namespace, {LABEL_DEPLOYMENT: self.deployment, LABEL_KEY: key_label(key)}
        )
        if not found:
            return None
        if len(found) > 1:  # a submit that was not exactly-once: observe cancels the others
            log.error("%d Hugging Face jobs carry the key of %s", len(found), key)
        first = min(found, key=lambda info: (info.created_at or self._clock(), info.id))
        ref = HfRef.of(first, namespace).encode()
        return backend_job(first, ref=ref, key=key, now=self._clock())

    async def _earlier_attempts_job(self, key: str, namespace: str) -> BackendJob | None:
        """On a retried submit: the job an earlier attempt's create may still produce. Looked
        for by label until both SUBMIT_SETTLE_LOOKS looks and SUBMIT_SETTLE_S have passed
        (the listing may lag behind a new job), before anything is created again."""
        config = self._config
        until = time.monotonic() + config.submit_settle_s
        looks = 0
        while True:
            found = await self._by_key(key, namespace)
            looks += 1
            if found is not None:
                log.info("a retried submit found the job of %s after %d looks", key, looks)
                return found
            if looks >= config.submit_settle_looks and time.monotonic() >= until:
                return None
            await asyncio.sleep(config.submit_look_interval_s)

    async def _cancel_duplicates(
        self, namespace: str, live: list[JobInfo], watched_ids: set[str]
    ) -> None:
        """Cancel live jobs that carry the key of a watched job but are not it: a create that
        succeeded on the Hub after its retry had started another job. Best effort."""
        watched_keys = {
            (info.labels or {}).get(LABEL_KEY) for info in live if info.id in watched_ids
        }
        for info in live:
            key = (info.labels or {}).get(LABEL_KEY)
            if info.id in watched_ids or not key or key not in watched_keys:
                continue
            log.error(
                "job %s in %s duplicates a watched job (key %s); cancelling it",
                info.id,
                namespace,
                key,
            )
            try:
                await self._calls.call(
                    f"cancelling duplicate job {info.id}",
                    self._api.cancel_job,
                    job_id=info.id,
                    namespace=namespace,
                )
            except (ToolError, TransientBackendError) as err:
                log.warning("could not cancel duplicate job %s yet: %s", info.id, err)

    def _seen(self, ref: str, hf: HfRef, namespace: str, info: JobInfo | None) -> BackendJob | None:
        """The job as observed; None while it is missing but not yet vanished, or not ours."""
        if info is None:
            missing = self._missing.answered_404(hf.job_id, self._clock())
            if missing is None:
                return None
            log.error(
                "Hugging Face job %s in %s vanished; settling at worst case", hf.job_id, namespace
            )
            return vanished_job(
                ref=ref,
                key="",
                now=self._clock(),
                missing_s=missing.seconds(self._clock()),
                looks=missing.looks,
            )
        self._missing.answered(hf.job_id)
        if not carries(info, {LABEL_DEPLOYMENT: self.deployment}):
            log.error("job %s in %s lacks this deployment's label; not ours", hf.job_id, namespace)
            return None
        key = (info.labels or {}).get(LABEL_KEY, "")
        return backend_job(info, ref=ref, key=key, now=self._clock())

    def _seen_or_retry(
        self, ref: str, hf: HfRef, namespace: str, info: JobInfo | None
    ) -> BackendJob:
        job = self._seen(ref, hf, namespace, info)
        if job is not None:
            return job
        if info is not None:
            raise ToolError(
                ErrorType.hf_error,
                f"Hugging Face job {hf.job_id} in {namespace} does not carry this deployment's "
                "label; it is not cancelled",
            )
        raise TransientBackendError(
            f"Hugging Face answers 404 for job {hf.job_id} in {namespace}; looking again "
            "before it is settled at its worst case"
        )

    async def _model_volume(self, request: JobRequest, namespace: str) -> Volume:
        try:
            evaluated: HfRef | None = HfRef.decode(request.artifact_ref or "")
        except ValueError:
            evaluated = None
        if evaluated is not None and evaluated.folder is None:  # the Hub's record has it
            where = evaluated.namespace or namespace
            info = await self._inspect(evaluated.job_id, where)
            evaluated = HfRef.of(info, where) if info is not None else evaluated
        cap = request.artifact_cap_bytes or self._config.artifact_cap_bytes
        return await evaluated_outputs(self._calls, self._api, namespace, evaluated, cap)

    async def _inspect(self, job_id: str, namespace: str) -> JobInfo | None:
        """The job, or None when the Hub answers 404 for it."""
        try:
            return await self._calls.call(
                f"looking at job {job_id}",
                self._api.inspect_job,
                job_id=job_id,
                namespace=namespace,
                keep=(JobNotFoundError,),
            )
        except JobNotFoundError:
            return None


def kept(job: BackendJob, size: int, caps: KeepOutputs) -> BackendJob:
    """`job` with its outputs of `size` bytes judged by `caps`: kept, or refused (the job then
    fails if it had succeeded)."""
    return with_outputs_judged(job, size, caps.over(size))


def _is_a_retry() -> bool:
    """True inside a retried activity attempt (an earlier one may have created the job)."""
    return activity.in_activity() and activity.info().attempt > 1


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
