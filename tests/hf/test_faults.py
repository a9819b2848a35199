"""The Hub misbehaving, under the real `HfApi` and its HTTP layer (the HTTP-level fake Hub):
hung and trickling requests, lost answers, listing lag, an ignored label filter, rate limits,
lexical bucket prefixes, a namespace changed while jobs run."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.utils._http import default_client_factory
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.backends.hf import calls as hub_calls
from activities.backends.hf.attempt_clock import AttemptClock
from activities.backends.hf.backend import HfBackend
from activities.backends.hf.calls import HubCalls
from activities.backends.hf.errors import HubTransientError
from activities.backends.hf.http import NOT_RETRIED_HERE, HubHttpLimits, install_hub_client
from activities.backends.hf.labels import LABEL_DEPLOYMENT, HfRef
from activities.backends.hf.missing import MAX_REMEMBERED, MissingJobs
from activities.backends.hf.namespaces import MAX_LISTED, RECENT_FOR, NamespaceNotes
from activities.backends.interface import ArtifactRejected, TransientBackendError
from activities.jobs.activities import JobsActivities
from activities.jobs.reaper import ReaperActivities
from activities.ports import JobToWatch
from posttrain_common.contracts.jobs import JobRole, ObserveJobs, SubmitJob
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_env.errors import ToolError
from posttrain_env.limits import (
    HUB_ACTIVITY_MARGIN_S,
    HUB_CALL_TIMEOUT_S,
    HUB_MAX_RETRY_AFTER_S,
    SUBMIT_LOOK_INTERVAL_S,
    SUBMIT_SETTLE_LOOKS,
    SUBMIT_SETTLE_S,
    VANISHED_AFTER_LOOKS,
    VANISHED_AFTER_S,
)
from posttrain_env.models import JobState
from posttrain_server.worker import build_worker
from tests.hf.conftest import DATASET, FAST_HTTP, MODEL, TOKEN, http_backend, request
from tests.hf.fake_hub import T0, FakeHub, JobPlan
from tests.hf.http_hub import HubHttp
from tests.hf.slow_server import TLS_RECORD_HEADER, answering_server, trickling_server
from tests.hf.stand_in import OneAttempt
from tests.waiting import eventually
from workflows.job.watcher import WatcherInput
from workflows.policies import OBSERVE_TIMEOUT, READ_TIMEOUT, SUBMIT_TIMEOUT

SLACK_S = 0.5  # scheduling and the fake's own work, on a busy machine


class NoWatch:
    async def watch(self, job: JobToWatch) -> None:
        return None


class AllClosed:
    """Episode liveness as the reaper asks for it: every episode has closed."""

    async def is_running(self, episode_id: str) -> bool:
        return False

    async def left_behind(self, episode_id: str, job_id: str, ref: str) -> bool:
        return False


def jobs_activities(backend: HfBackend, tmp_path: Path) -> JobsActivities:
    return JobsActivities(backend, ServerKey(b"k" * 32), NoWatch(), tmp_path)


def in_activity(attempt: int = 1, timeout_s: float = 15.0) -> ActivityEnvironment:
    """An activity attempt as the worker runs one: its own task token, its own timeout."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        start_to_close_timeout=timedelta(seconds=timeout_s),
        started_time=datetime.now(UTC),
        task_token=uuid.uuid4().bytes,
    )
    return env


def submit_job(n: int = 1) -> SubmitJob:
    return SubmitJob(**request(n=n).model_dump(exclude={"env", "secrets"}))


async def timed(call: Awaitable[object]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await call
    except Exception as err:
        return time.monotonic() - started, err
    return time.monotonic() - started, None


# -- no Hub call outlives its bound -----------------------------------------------------------

Call = Callable[[], Awaitable[object]]


async def _ended_job(backend: HfBackend, http: HubHttp) -> str:
    http.hub.plan = JobPlan(scheduling_s=0, running_s=10)
    job = await backend.submit(request(n=7))
    http.hub.advance(60)
    return job.ref


async def _running_job(backend: HfBackend, http: HubHttp) -> str:
    http.hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    return (await backend.submit(request(n=8))).ref


async def submitting(backend: HfBackend, http: HubHttp) -> Call:
    return lambda: backend.submit(request())


async def observing(backend: HfBackend, http: HubHttp) -> Call:
    ref = await _ended_job(backend, http)  # not live: observe lists, then looks at it
    return lambda: backend.observe([ref], T0)


async def cancelling(backend: HfBackend, http: HubHttp) -> Call:
    ref = await _running_job(backend, http)
    return lambda: backend.cancel(ref, T0)


async def reading_logs(backend: HfBackend, http: HubHttp) -> Call:
    ref = await _running_job(backend, http)
    return lambda: backend.logs(ref, 10, T0)


async def evaluating(backend: HfBackend, http: HubHttp) -> Call:
    ref = await _ended_job(backend, http)
    return lambda: backend.submit(request(JobRole.dev, n=9, artifact_ref=ref))


async def pricing(backend: HfBackend, http: HubHttp) -> Call:
    return lambda: backend.hardware()


async def resolving_a_dataset(backend: HfBackend, http: HubHttp) -> Call:
    return lambda: backend.resolve_dataset(DATASET.repo_id, [])


async def resolving_a_model(backend: HfBackend, http: HubHttp) -> Call:
    return lambda: backend.resolve_model(MODEL.repo_id, "main")


# The route that never answers, and the backend operation that meets it.
OPERATIONS: dict[str, tuple[str, Callable[[HfBackend, HubHttp], Awaitable[Call]]]] = {
    "creating the bucket": ("create_bucket", submitting),
    "uploading the script": ("bucket_batch", submitting),
    "creating a job": ("create_job", submitting),
    "listing jobs": ("list_jobs", observing),
    "looking at a job": ("inspect_job", observing),
    "cancelling": ("cancel_job", cancelling),
    "reading logs": ("job_logs", reading_logs),
    "listing outputs": ("bucket_tree", evaluating),
    "reading prices": ("hardware", pricing),
    "resolving a dataset": ("dataset_info", resolving_a_dataset),
    "resolving a model": ("model_info", resolving_a_model),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_no_hub_call_runs_past_its_timeout_when_the_hub_never_answers(
    http_hub: HubHttp, operation: str
) -> None:
    route, prepare = OPERATIONS[operation]
    backend = http_backend(http_hub)
    call = await prepare(backend, http_hub)
    http_hub.hang(route)  # never released: only a timeout ends it
    elapsed, error = await timed(call())
    if route == "inspect_job":
        # Observe degrades per job: the job is left out of this answer (the watcher looks
        # again), the batch does not fail (test_observe.py).
        assert error is None
    else:
        # A retryable failure, after one read timeout: never an empty answer, never a hang.
        assert isinstance(error, TransientBackendError), error
    # One request hung, and it asked for the read timeout: the fake Hub waits for as long as
    # the request said it would (the real seconds it waited, which thread wake-ups on a loaded
    # machine lengthen, were asserted before: 0.41 s against 0.3 + 0.1 failed beside other
    # suites). The call, never retried, ends within its budget.
    (hung,) = [seen for seen in http_hub.requests_to(route) if seen.timeout.get("read")]
    assert len(http_hub.hung_for) == 1 and hung.timeout["read"] <= FAST_HTTP.read_s, hung
    assert elapsed < FAST_HTTP.call_s + SLACK_S, elapsed
    assert not http_hub.unbounded, "a request was sent without a timeout"


async def test_inside_an_activity_a_call_ends_before_the_activity_does(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    # Long HTTP timeouts: only the activity's own timeout (1.2 s) can bound the hung request.
    slow = dataclasses.replace(FAST_HTTP, read_s=30.0, call_s=30.0, activity_margin_s=0.2)
    backend = http_backend(http_hub, limits=slow)
    http_hub.hang("create_job")
    env = in_activity(timeout_s=1.2)
    elapsed, error = await timed(
        env.run(jobs_activities(backend, tmp_path).submit_job, submit_job())
    )
    assert isinstance(error, TransientBackendError), error
    assert elapsed < 1.2  # the activity's timeout: Temporal's retry cannot overlap this request
    (create,) = http_hub.requests_to("create_job")
    assert create.timeout["read"] is not None and create.timeout["read"] <= 1.0


async def test_a_call_after_work_in_its_activity_still_ends_before_the_activity_does(
    time_skipping_env: WorkflowEnvironment, http_hub: HubHttp, hub: FakeHub, tmp_path: Path
) -> None:
    # Long HTTP timeouts: only the activity's own timeout can bound the hung request, and the
    # activity spends half of that timeout on its own work before its first Hub call (as the
    # contamination check scans scripts before it reads a dataset).
    # A margin of a second: what a loaded machine may add between the call's end and the
    # activity's answer (with 0.2 s, a starved test process timed the activity out).
    slow = dataclasses.replace(FAST_HTTP, read_s=30.0, call_s=30.0, activity_margin_s=1.0)
    backend = http_backend(http_hub, limits=slow)
    http_hub.hang("hardware")
    timeout_s, work_s = 4.0, 1.0

    @activity.defn(name="work_then_a_hub_call")
    async def work_then_a_hub_call() -> float:
        started = time.monotonic()
        await asyncio.to_thread(time.sleep, work_s)  # the activity's own work, not a wait
        with pytest.raises(TransientBackendError):
            await backend.hardware()
        return time.monotonic() - started

    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    config = Settings(state_dir=tmp_path / "state", backend="fake")
    # The interceptors the hf worker is built with (on a queue of its own: never started).
    production = build_worker(
        client,
        config,
        backend,
        key=ServerKey(b"k" * 32),
        task_queue=f"{queue}-built",
        tasks_dir=tmp_path,
    )
    interceptors = production.config()["interceptors"]
    assert any(isinstance(each, AttemptClock) for each in interceptors)
    with time_skipping_env.auto_time_skipping_disabled():
        async with Worker(
            client,
            task_queue=queue,
            workflows=[OneAttempt],
            activities=[work_then_a_hub_call],
            interceptors=interceptors,
        ):
            took = await client.execute_workflow(
                OneAttempt.run,
                args=["work_then_a_hub_call", timeout_s],
                id=f"one-{queue}",
                task_queue=queue,
            )
    # The attempt returned before its timeout (Temporal would have failed the workflow), and
    # the request waited only for what the work had left of it.
    assert took < timeout_s
    (hung,) = http_hub.requests_to("hardware")
    assert hung.timeout["read"] <= timeout_s - work_s - slow.activity_margin_s


async def test_a_trickling_answer_is_cut_at_the_calls_deadline(http_hub: HubHttp) -> None:
    # Each piece comes well inside the read timeout; all of them take longer than the call may.
    limits = dataclasses.replace(FAST_HTTP, call_s=1.0)
    backend = http_backend(http_hub, limits=limits)
    await backend.submit(request())
    http_hub.trickle("list_jobs", chunks=20, every_s=0.15)
    elapsed, error = await timed(backend.observe(["alice/0abc"], T0))
    assert isinstance(error, TransientBackendError) and "time ran out" in str(error)
    assert elapsed < 1.0 + SLACK_S


@pytest.fixture
def real_network() -> Iterator[HubHttpLimits]:
    """The production client over real sockets (no fake transport), with a 1 s call budget
    and a read timeout each trickled byte comes well inside."""
    limits = dataclasses.replace(FAST_HTTP, connect_s=1.0, read_s=1.0, call_s=1.0)
    install_hub_client(limits)
    try:
        yield limits
    finally:
        set_client_factory(default_client_factory)


@pytest.mark.parametrize(
    ("scheme", "first"),
    [
        ("http", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: "),
        ("https", TLS_RECORD_HEADER),  # a TLS handshake that never completes
    ],
    ids=["headers", "tls-handshake"],
)
async def test_a_server_that_trickles_is_cut_at_the_calls_deadline_on_real_sockets(
    real_network: HubHttpLimits, scheme: str, first: bytes
) -> None:
    # Every byte comes well inside the read timeout; httpcore's timeouts are per socket wait,
    # so only the deadline of each wait (activities/backends/hf/http.py DeadlineBackend) ends
    # trickled
    # headers. A handshake `ssl` bounds as a whole, by the timeout already cut to the budget.
    calls = HubCalls(real_network)
    try:
        with trickling_server(first, every_s=0.05, for_s=10.0) as port:
            api = HfApi(endpoint=f"{scheme}://127.0.0.1:{port}", token=False)
            elapsed, error = await timed(calls.call("reading prices", api.list_jobs_hardware))
    finally:
        calls._pool.shutdown(wait=False)
    assert isinstance(error, TransientBackendError) and "time ran out" in str(error), error
    assert elapsed < real_network.call_s + SLACK_S


async def test_the_environments_proxy_is_used_as_the_librarys_own_client_would(
    real_network: HubHttpLimits, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is tested is the route, not a deadline: roomy bounds (the 1 s call budget timed out
    # once under a loaded eight-worker suite, in the write of the request).
    roomy = dataclasses.replace(
        real_network, connect_s=10.0, read_s=10.0, write_s=10.0, pool_s=10.0, call_s=30.0
    )
    calls = HubCalls(roomy)
    try:
        with answering_server(b'{"type": "user", "name": "alice"}') as (port, seen):
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
            monkeypatch.setenv("NO_PROXY", "")
            install_hub_client(roomy)  # the environment is read when the client is made
            api = HfApi(endpoint="http://hub.example", token="hf_FAKE")
            me = await calls.call("finding the token's user", api.whoami)
    finally:
        calls._pool.shutdown(wait=False)
    assert me["name"] == "alice"
    assert seen == [b"GET http://hub.example/api/whoami-v2 HTTP/1.1"]


async def test_a_hung_script_upload_is_cut_at_the_calls_deadline_and_creates_no_job(
    http_hub: HubHttp,
) -> None:
    # hf_xet's own client holds the thread far past the deadline: the call is not awaited
    # past it (activities/backends/hf/calls.py), and the thread, once the upload returns,
    # starts no further Hub request.
    limits = dataclasses.replace(FAST_HTTP, call_s=0.5)
    backend = http_backend(http_hub, limits=limits)
    await backend.hardware()  # prices cached: the submit's first request is the bucket's
    http_hub.xet_upload_s = 3.0
    elapsed, error = await timed(backend.submit(request()))
    assert isinstance(error, TransientBackendError), error
    assert "time ran out" in str(error) and "hf_xet" in str(error)
    assert elapsed < limits.call_s + limits.activity_margin_s + SLACK_S
    await asyncio.to_thread(backend._calls._pool.shutdown, wait=True)  # the upload ends
    assert http_hub.blobs  # it finished, late
    assert not http_hub.requests_to("bucket_batch") and not http_hub.requests_to("create_job")
    assert not http_hub.hub.jobs


async def test_a_name_lookup_that_hangs_is_cut_at_the_calls_deadline(
    real_network: HubHttpLimits, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The system resolver can take many seconds per server and attempt; no socket timeout
    # covers it. Here it never answers for the Hub's name.
    released = threading.Event()
    lookup = socket.getaddrinfo

    def hanging_lookup(host: object, *args: object, **kwargs: object) -> object:
        if host == "hub.example":
            released.wait(10.0)
        return lookup(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", hanging_lookup)
    calls = HubCalls(real_network)
    try:
        api = HfApi(endpoint="http://hub.example", token=False)
        elapsed, error = await timed(calls.call("reading prices", api.list_jobs_hardware))
    finally:
        released.set()
        calls._pool.shutdown(wait=False)
    assert isinstance(error, TransientBackendError) and "time ran out" in str(error), error
    assert elapsed < real_network.call_s + SLACK_S


async def test_a_name_that_does_not_resolve_fails_at_once_as_unreachable(
    real_network: HubHttpLimits, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unknown(host: object, *args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    # A budget far above a loaded machine's scheduling delays: "at once" is then well inside
    # it, and a wait for the budget to run out cannot pass for it.
    patient = dataclasses.replace(real_network, connect_s=10.0, call_s=10.0)
    install_hub_client(patient)
    calls = HubCalls(patient)
    try:
        api = HfApi(endpoint="http://hub.example", token=False)
        elapsed, error = await timed(calls.call("reading prices", api.list_jobs_hardware))
    finally:
        calls._pool.shutdown(wait=False)
    assert isinstance(error, TransientBackendError) and "did not answer" in str(error), error
    assert "time ran out" not in str(error) and elapsed < patient.call_s / 4


async def test_a_cancelled_call_starts_no_further_request(http_hub: HubHttp) -> None:
    limits = dataclasses.replace(FAST_HTTP, read_s=10.0, call_s=10.0)
    backend = http_backend(http_hub, limits=limits)
    hang = http_hub.hang("create_bucket")  # run_uv_job's first request
    submitting = asyncio.create_task(backend.submit(request()))
    await eventually(
        lambda: http_hub.requests_to("create_bucket"), 5, "a create_bucket request", every_s=0.01
    )
    submitting.cancel()  # the activity was cancelled (or timed out) while its thread waits
    with pytest.raises(asyncio.CancelledError):
        await submitting
    hang.released.set()  # the Hub answers after all: the thread goes on, and must stop
    await asyncio.to_thread(backend._calls._pool.shutdown, wait=True)
    assert not http_hub.requests_to("create_job") and not http_hub.hub.jobs
    assert not http_hub.requests_to("xet_token")  # stopped at its very next request


async def test_hung_hub_calls_leave_the_workers_other_threads_free(http_hub: HubHttp) -> None:
    limits = dataclasses.replace(FAST_HTTP, threads=2, read_s=1.0, call_s=1.0)
    backend = http_backend(http_hub, limits=limits)
    for _ in range(2):
        http_hub.hang("hardware")
    calls = [asyncio.create_task(backend._fetch_hardware()) for _ in range(2)]
    await eventually(
        lambda: len(http_hub.requests_to("hardware")) == 2, 5, "two hardware requests", every_s=0.01
    )
    # Every Hub thread is stuck; the loop's default executor (the SDK's, other activities')
    # is not.
    started = time.monotonic()
    assert await asyncio.to_thread(lambda: 42) == 42
    assert time.monotonic() - started < SLACK_S  # a stuck executor would take the 1 s hang
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(result, TransientBackendError) for result in results)


async def test_a_call_that_waited_for_a_thread_past_its_budget_sends_nothing(
    http_hub: HubHttp,
) -> None:
    limits = dataclasses.replace(FAST_HTTP, threads=1, call_s=0.1)
    backend = http_backend(http_hub, limits=limits)
    stuck = threading.Event()
    # Something holds the only Hub thread (as a request no timeout reaches could).
    holding = asyncio.create_task(backend._calls.call("holding the thread", stuck.wait, 5.0))
    waiting = asyncio.create_task(backend.hardware())
    # The waiting call's whole budget passes in the queue: ten times over, since its budget
    # starts when its task first runs, which a loaded machine can delay by tens of ms (once,
    # beside a second suite, a 0.15 s wait left it budget and the call went out).
    await asyncio.sleep(1.0)
    # Neither call is awaited past its deadline: both failed already, the holder's thread
    # still held.
    held, error = await asyncio.gather(holding, waiting, return_exceptions=True)
    assert isinstance(held, TransientBackendError) and "time ran out" in str(held)
    assert isinstance(error, TransientBackendError) and "time ran out" in str(error)
    stuck.set()
    await asyncio.to_thread(backend._calls._pool.shutdown, wait=True)  # the queued call ran
    assert not http_hub.requests_to("hardware")


# -- retries belong to Temporal ----------------------------------------------------------------

RATE_LIMITED = {
    "RateLimit": '"api";r=0;t=90',
    "RateLimit-Policy": '"fixed window";"api";q=500;w=300',
}


async def test_a_429_fails_the_activity_at_once_with_the_reset_as_the_next_attempts_delay(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    backend = http_backend(http_hub)
    http_hub.answer("list_jobs", 429, times=6, headers=RATE_LIMITED)
    observe = jobs_activities(backend, tmp_path).observe_jobs
    elapsed, error = await timed(
        in_activity().run(observe, ObserveJobs(refs=["alice/0abc"], now=T0))
    )
    assert isinstance(error, HubTransientError) and isinstance(error, ApplicationError)
    assert not error.non_retryable and error.next_retry_delay == timedelta(seconds=91)
    assert "429" in error.message
    assert len(http_hub.requests_to("list_jobs")) == 1  # the library did not retry
    # Nor did it sleep to the reset (90 s away): seconds on a loaded machine, never minutes.
    assert elapsed < 10 * SLACK_S


@pytest.mark.parametrize(
    ("status", "headers", "delay"),
    [(503, {"Retry-After": "20"}, timedelta(seconds=21)), (502, {}, None), (500, {}, None)],
)
async def test_server_errors_fail_at_once_and_keep_a_retry_after(
    http_hub: HubHttp, status: int, headers: dict[str, str], delay: timedelta | None
) -> None:
    # list_jobs is paginated: the library's http_backoff would retry it five times.
    http_hub.answer("list_jobs", status, times=6, headers=headers)
    elapsed, error = await timed(http_backend(http_hub).observe(["alice/0abc"], T0))
    assert isinstance(error, HubTransientError) and error.next_retry_delay == delay
    assert len(http_hub.requests_to("list_jobs")) == 1 and elapsed < SLACK_S


# -- exactly one job per submit ------------------------------------------------------------------


async def test_a_create_that_lands_after_its_timeout_is_adopted_by_the_retry(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    backend = http_backend(http_hub, submit_settle_looks=4)
    acts = jobs_activities(backend, tmp_path)
    http_hub.listing_lag = 2  # a new job shows in listings only on the third one
    # The create hangs past its timeout; the Hub creates the job two requests later.
    http_hub.hang("create_job", lands_after_requests=2)
    _, error = await timed(in_activity(attempt=1).run(acts.submit_job, submit_job()))
    assert isinstance(error, TransientBackendError) and not http_hub.hub.jobs
    retried = await in_activity(attempt=2).run(acts.submit_job, submit_job())
    assert len(http_hub.hub.jobs) == 1 and len(http_hub.requests_to("create_job")) == 1
    assert HfRef.decode(retried.ref).job_id == next(iter(http_hub.hub.jobs))
    # It took four looks: two before the job landed or while it was hidden, two lagging.
    assert len(http_hub.requests_to("list_jobs")) == 5  # 1 (attempt 1) + 4 (attempt 2)


async def test_a_first_attempt_does_not_wait_for_a_job_no_one_started(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    backend = http_backend(http_hub, submit_settle_looks=4)
    await in_activity(attempt=1).run(jobs_activities(backend, tmp_path).submit_job, submit_job())
    assert len(http_hub.requests_to("list_jobs")) == 1 and len(http_hub.hub.jobs) == 1


async def test_a_duplicate_of_a_watched_job_is_cancelled_by_the_next_look(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    # Roomy bounds: the duplicate's cancel is best effort, and FAST_HTTP's 0.3 s reads can run
    # out on a loaded machine (this once failed in a full suite; alone it passes).
    roomy = dataclasses.replace(FAST_HTTP, connect_s=2.0, read_s=2.0, write_s=2.0, pool_s=2.0)
    backend = http_backend(http_hub, limits=dataclasses.replace(roomy, call_s=10.0))
    adopted = await backend.submit(request())
    late = await backend.submit(request())  # the same key: what a late-landing create leaves
    other = await backend.submit(request(n=2))  # another job, not watched yet: left alone
    hub.advance(10)
    seen = await backend.observe([adopted.ref], hub.now)
    hub.advance(10)
    assert seen[adopted.ref].state is JobState.running
    stages = {
        ref: hub.info(HfRef.decode(ref).job_id).status.stage
        for ref in (adopted.ref, late.ref, other.ref)
    }
    assert stages == {adopted.ref: "RUNNING", late.ref: "CANCELED", other.ref: "RUNNING"}


# -- labels are checked here, whatever the server filtered ---------------------------------------


async def test_a_server_that_ignores_the_label_filter_changes_nothing(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    http_hub.ignore_label_filter = True
    theirs = http_backend(http_hub)
    theirs.deployment = "dother"
    # A job started by hand, with no label at all (the first listed: the oldest), and another
    # deployment's job with the very same workflow id.
    bare = HfApi(token=TOKEN, library_name="posttrain-env-tests").run_job(
        image="python:3.12", command=["python", "-c", "print(1)"], namespace=hub.namespace
    )
    assert LABEL_DEPLOYMENT not in (bare.labels or {})  # the library names it, nothing more
    unlabelled = HfRef.of(bare, hub.namespace).encode()
    foreign = await theirs.submit(request())
    ours = http_backend(http_hub)
    assert await ours.find_by_key(request().key, T0) is None  # neither is adopted
    mine = await ours.submit(request())
    assert len(hub.jobs) == 3
    hub.advance(10)
    # Not cancelled as a "duplicate", and not observed even when asked for by its ref.
    seen = await ours.observe([mine.ref, unlabelled, foreign.ref], hub.now)
    assert set(seen) == {mine.ref}
    assert [job.ref for job in await ours.live_jobs()] == [mine.ref]
    search = await ReaperActivities(ours, AllClosed()).find_orphan_jobs()
    assert [orphan.ref for orphan in search.orphans] == [mine.ref]  # never theirs, nor the bare
    for other in (foreign.ref, unlabelled):
        with pytest.raises(ToolError, match="does not carry this deployment's label"):
            await ours.cancel(other, T0)
        assert hub.info(HfRef.decode(other).job_id).status.stage == "RUNNING"
    assert not http_hub.requests_to("cancel_job")


# -- artifacts: exact prefixes --------------------------------------------------------------------


async def test_files_beside_outputs_are_neither_counted_nor_taken_for_outputs(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    backend = http_backend(http_hub)
    agent = await backend.submit(request())
    hub.advance(600)
    folder = HfRef.decode(agent.ref).folder
    files = hub.buckets["alice/jobs-artifacts"]
    files[f"{folder}/outputs.log"] = 5 * 1024**3  # beside outputs/, over the cap
    files[f"{folder}/outputs_x/model.safetensors"] = 5 * 1024**3
    await backend.submit(
        request(JobRole.dev, n=2, artifact_ref=agent.ref, artifact_cap_bytes=1024**3)
    )
    # outputs/ itself is empty: it gets its placeholder, and the evaluation is not refused.
    assert files[f"{folder}/outputs/.keep"] == 0
    tree = http_hub.requests_to("bucket_tree")[-1]
    assert tree.path.endswith(f"/tree/{folder}/outputs/")


async def test_outputs_over_the_cap_are_still_refused(http_hub: HubHttp) -> None:
    hub = http_hub.hub
    backend = http_backend(http_hub)
    agent = await backend.submit(request())
    folder = HfRef.decode(agent.ref).folder
    hub.buckets["alice/jobs-artifacts"][f"{folder}/outputs/model.safetensors"] = 2 * 1024**3
    with pytest.raises(ArtifactRejected, match="over this task's cap"):
        await backend.submit(
            request(JobRole.dev, n=2, artifact_ref=agent.ref, artifact_cap_bytes=1024**3)
        )
    assert len(http_hub.requests_to("create_job")) == 1  # the agent's job only


# -- a namespace changed while jobs run ---------------------------------------------------------


async def test_a_namespace_change_mid_job_keeps_tracking_the_job(http_hub: HubHttp) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=600, logs=["epoch 1"])
    http_hub.namespaces.add("alice-org")
    before = http_backend(http_hub, namespace="alice")
    job = await before.submit(request(n=1))
    other = await before.submit(request(n=2))
    # The worker restarts with POSTTRAIN_NAMESPACE=alice-org.
    after = http_backend(http_hub, namespace="alice-org")
    hub.advance(30)
    assert (await after.observe([job.ref, other.ref], hub.now))[job.ref].state is JobState.running
    assert await after.logs(job.ref, 5, hub.now) == ["epoch 1"]
    assert (await after.cancel(other.ref, hub.now)).state is JobState.cancelled
    hub.advance(600)
    ended = (await after.observe([job.ref], hub.now))[job.ref]
    assert ended.state is JobState.succeeded and ended.running_s == 600.0
    # New jobs go to the new namespace; every call on an old one went to the old one.
    new = await after.submit(request(n=3))
    assert http_hub.namespace_of(HfRef.decode(new.ref).job_id) == "alice-org"
    for seen in http_hub.seen:
        if seen.route in ("inspect_job", "cancel_job", "job_logs"):
            assert seen.path.startswith("/api/jobs/alice/"), seen.path


async def test_the_reaper_finds_and_cancels_an_orphan_left_in_an_earlier_namespace(
    http_hub: HubHttp, tmp_path: Path
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    http_hub.namespaces.add("alice-org")
    notes = tmp_path / "state" / "hf_namespaces.json"
    before = http_backend(http_hub, namespace="alice", namespaces=NamespaceNotes(notes))
    old = await before.submit(request(n=1))
    # The worker restarts with POSTTRAIN_NAMESPACE=alice-org: a new process, the same state dir.
    after = http_backend(http_hub, namespace="alice-org", namespaces=NamespaceNotes(notes))
    new = await after.submit(request(n=2))
    reaper = ReaperActivities(after, AllClosed())
    search = await reaper.find_orphan_jobs()
    assert sorted(orphan.ref for orphan in search.orphans) == sorted([old.ref, new.ref])
    (orphan,) = [orphan for orphan in search.orphans if orphan.ref == old.ref]
    assert (await reaper.cancel_orphan_job(orphan)).state is JobState.cancelled
    assert hub.info(HfRef.decode(old.ref).job_id).status.stage == "CANCELED"
    (cancel,) = http_hub.requests_to("cancel_job")
    assert cancel.path.startswith("/api/jobs/alice/")
    # A namespace the token can no longer list is skipped; the current one is still reaped.
    http_hub.namespaces.discard("alice")
    assert [orphan.ref for orphan in (await reaper.find_orphan_jobs()).orphans] == [new.ref]


def test_namespaces_are_noted_at_most_hourly_and_listed_for_a_week_at_most_eight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hf_namespaces.json"
    notes = NamespaceNotes(path)
    notes.note("alice", T0)
    assert not notes.needs_note("alice", T0 + timedelta(minutes=59))  # no write per submit
    assert notes.needs_note("alice", T0 + timedelta(hours=1))
    for n in range(10):
        notes.note(f"org-{n}", T0 + timedelta(minutes=n))
    # Read again from the file, as another process of the deployment reads it.
    later = NamespaceNotes(path).recent(T0 + RECENT_FOR)
    assert later == [f"org-{n}" for n in range(9, 9 - MAX_LISTED, -1)]
    assert NamespaceNotes(path).recent(T0 + RECENT_FOR + timedelta(minutes=5)) == [
        f"org-{n}" for n in range(9, 4, -1)
    ]  # the older notes have expired: their jobs ran past any timeout
    path.write_text("not json")
    assert NamespaceNotes(path).recent(T0) == []  # a torn file is ignored, not fatal


async def test_a_ref_made_before_namespaces_were_stored_still_works(http_hub: HubHttp) -> None:
    backend = http_backend(http_hub)
    job = await backend.submit(request())
    old = HfRef.decode(job.ref)
    old_form = f"{old.job_id}:{old.folder}"  # what refs looked like before
    assert HfRef.decode(old_form).namespace is None
    http_hub.hub.advance(30)
    assert (await backend.observe([old_form], T0))[old_form].state is JobState.running


# -- the limits themselves ---------------------------------------------------------------------


def test_every_default_http_bound_is_shorter_than_the_shortest_hub_activity() -> None:
    limits = HubHttpLimits()
    shortest = min(OBSERVE_TIMEOUT, READ_TIMEOUT, SUBMIT_TIMEOUT).total_seconds()
    for bound in (limits.connect_s, limits.read_s, limits.write_s, limits.pool_s):
        assert 0 < bound < shortest
    assert limits.threads >= 4 and 0 < limits.activity_margin_s < shortest / 4


def test_a_retried_submits_wait_leaves_most_of_its_activity_for_the_create() -> None:
    wait = SUBMIT_SETTLE_S + SUBMIT_SETTLE_LOOKS * SUBMIT_LOOK_INTERVAL_S
    assert wait <= SUBMIT_TIMEOUT.total_seconds() / 2


def test_a_job_is_declared_vanished_only_after_several_watcher_looks() -> None:
    assert VANISHED_AFTER_LOOKS >= 3 and VANISHED_AFTER_S >= 4 * WatcherInput().interval_s


def test_the_library_retries_no_status_that_reaches_it() -> None:
    from huggingface_hub.utils._http import _DEFAULT_RETRY_ON_STATUS_CODES

    assert set(_DEFAULT_RETRY_ON_STATUS_CODES) <= NOT_RETRIED_HERE


async def test_a_rate_limit_reset_is_honoured_up_to_its_cap(http_hub: HubHttp) -> None:
    http_hub.answer("list_jobs", 429, headers={"RateLimit": '"api";r=0;t=86400'})
    _, error = await timed(http_backend(http_hub).observe(["alice/0abc"], T0))
    assert isinstance(error, HubTransientError)
    assert error.next_retry_delay == timedelta(seconds=HUB_MAX_RETRY_AFTER_S)


def test_a_call_outside_an_activity_gets_the_call_timeout_and_inside_one_what_it_leaves() -> None:
    calls = HubCalls()
    try:
        assert calls.call_seconds() == HUB_CALL_TIMEOUT_S
        inside = in_activity(timeout_s=15.0).run(calls.call_seconds)
        assert 15.0 - HUB_ACTIVITY_MARGIN_S - SLACK_S < inside <= 15.0 - HUB_ACTIVITY_MARGIN_S
    finally:
        calls._pool.shutdown()


def test_without_the_attempt_clock_a_budget_counts_from_the_first_call_and_is_forgotten_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hub_calls, "_REMEMBERED_ATTEMPTS", 2)
    calls = HubCalls(dataclasses.replace(FAST_HTTP, activity_margin_s=0.0))
    try:
        first = in_activity(timeout_s=10.0)
        assert first.run(calls.call_seconds) <= 10.0
        time.sleep(0.2)  # not a wait: the attempt's time passing is what is measured
        # A later call of the same attempt gets only what the attempt has left.
        assert first.run(calls.call_seconds) <= 9.8
        for _ in range(2):
            in_activity(timeout_s=10.0).run(calls.call_seconds)
        assert len(calls._attempt_started) == 2  # the oldest attempt was forgotten
        assert (first.info.task_token, first.info.attempt) not in calls._attempt_started
    finally:
        calls._pool.shutdown()


def test_missing_jobs_are_remembered_up_to_a_bound_and_the_oldest_count_starts_again() -> None:
    missing = MissingJobs(after_looks=2, after_s=0.0)
    assert missing.answered_404("job-0", T0) is None
    for n in range(1, MAX_REMEMBERED + 1):
        missing.answered_404(f"job-{n}", T0)
    assert len(missing._missing) == MAX_REMEMBERED
    # job-0 was forgotten: its next 404 is a first one again, not the second that settles it.
    assert missing.answered_404("job-0", T0) is None
    assert missing.answered_404("job-0", T0) is not None
