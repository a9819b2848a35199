"""A worker's metrics: its endpoint serves the visibility gauges of a real dev server (an episode
running a job, then its unconfirmed cancellation), the interceptor counts retried attempts and
backend errors, and a visibility read that fails is counted, never raised."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio import activity, workflow
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from posttrain_common import metrics
from posttrain_common.settings import Settings
from posttrain_server.temporal.client import connect, sdk_metrics_address
from posttrain_server.worker_metrics import (
    ActivityMetricsInterceptor,
    MetricsEndpointError,
    VisibilityCollector,
    serving_worker_metrics,
)
from tests.operator.dev_env import operated
from tests.operator.test_episodes_cli import STUCK, submit
from tests.waiting import PROGRESS_S, eventually

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient() as http:
        answer = await http.get(url, timeout=10)
    assert answer.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


async def test_the_worker_endpoint_serves_the_episodes_jobs_and_cancellations_it_reads(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, STUCK) as op:
        episode_id = (await op.reset()).episode_id
        await submit(op, episode_id)
        settings = Settings(state_dir=op.state_dir, metrics_host="127.0.0.1")
        port = free_port()
        serving = serving_worker_metrics(settings, op.client, "fake", port=port, every_s=0.5)
        async with serving as url:
            assert url == f"http://127.0.0.1:{port}/metrics"
            found: Samples = {}

            async def running() -> bool:
                nonlocal found
                found = await scrape(url)
                return (
                    value(found, "posttrain_episodes", state="running") == 1
                    and value(found, "posttrain_jobs", state="running", backend="fake") == 1
                )

            await eventually(running, PROGRESS_S, "the running episode and its job", every_s=0.5)
            assert value(found, "posttrain_worker_info", backend="fake") == 1
            assert value(found, "posttrain_episodes", state="ended") == 0
            assert value(found, "posttrain_unconfirmed_cancellations") == 0
            assert value(found, "posttrain_ended_episode_reservations") == 0
            assert value(found, "posttrain_visibility_truncated") == 0
            assert not any(episode_id in str(labels) for _, labels in found)

            cancelled = await op.run("episodes", "cancel", episode_id)
            assert cancelled.status == 0, cancelled.stderr

            async def unconfirmed() -> bool:
                nonlocal found
                found = await scrape(url)
                return value(found, "posttrain_unconfirmed_cancellations") == 1

            await eventually(unconfirmed, PROGRESS_S, "the unconfirmed cancellation", every_s=0.5)
            first_age = value(found, "posttrain_oldest_unconfirmed_cancellation_age_seconds")
            assert first_age is not None and 0 < first_age < 120

            async def older() -> bool:  # the age counts up while the cancellation waits
                nonlocal found
                found = await scrape(url)
                age = value(found, "posttrain_oldest_unconfirmed_cancellation_age_seconds")
                return age is not None and age > first_age + 0.5

            await eventually(older, PROGRESS_S, "the cancellation's age growing", every_s=0.5)
            assert value(found, "posttrain_jobs", state="cancelling", backend="fake") == 1
            assert value(found, "posttrain_jobs", state="running", backend="fake") == 0
        # Stopped: its info series is gone and its endpoint no longer answers.
        assert value(await scrape_registry(), "posttrain_worker_info", backend="fake") is None
        with pytest.raises(httpx.ConnectError):
            await scrape(f"http://127.0.0.1:{port}/metrics")


async def scrape_registry() -> Samples:
    from prometheus_client import REGISTRY, generate_latest

    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(REGISTRY).decode())
        for sample in family.samples
    }


async def test_a_taken_metrics_port_is_refused_with_the_setting_to_change(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(state_dir=tmp_path, metrics_host="127.0.0.1")
        client = await Client.connect("127.0.0.1:1", lazy=True)
        with pytest.raises(MetricsEndpointError, match="POSTTRAIN_WORKER_METRICS_PORT"):
            async with serving_worker_metrics(settings, client, "fake", port=port):
                pass


# -- the interceptor --------------------------------------------------------------------------


@activity.defn(name="observe_jobs")  # a backend activity's name: its errors are backend errors
async def flaky_observe(fails: int) -> str:
    if activity.info().attempt <= fails:
        raise ApplicationError("the Hub answered 503", type="HubUnavailable")
    return "seen"


@workflow.defn(sandboxed=False)
class FlakyWorkflow:
    @workflow.run
    async def run(self, fails: int) -> str:
        return await workflow.execute_activity(
            "observe_jobs",
            fails,
            result_type=str,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=10)),
        )


def counted(metric: object, *labels: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value(
            metric._name + "_total",  # type: ignore[attr-defined]
            dict(zip(metric._labelnames, labels, strict=True)),  # type: ignore[attr-defined]
        )
        or 0.0
    )


async def test_the_interceptor_counts_retried_attempts_and_backend_errors(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    retries = counted(metrics.ACTIVITY_RETRIES, "observe_jobs")
    calls = counted(metrics.BACKEND_CALLS, "observe_jobs")
    errors = counted(metrics.BACKEND_ERRORS, "observe_jobs", "HubUnavailable")
    async with Worker(
        client,
        task_queue=queue,
        workflows=[FlakyWorkflow],
        activities=[flaky_observe],
        interceptors=[ActivityMetricsInterceptor()],
    ):
        result = await client.execute_workflow(
            FlakyWorkflow.run, 2, id=f"flaky-{uuid.uuid4().hex}", task_queue=queue
        )
    assert result == "seen"
    assert counted(metrics.ACTIVITY_RETRIES, "observe_jobs") - retries == 2  # attempts 2 and 3
    assert counted(metrics.BACKEND_CALLS, "observe_jobs") - calls == 3
    assert counted(metrics.BACKEND_ERRORS, "observe_jobs", "HubUnavailable") - errors == 2


# -- a failing read -------------------------------------------------------------------------------


async def test_a_visibility_read_that_fails_is_counted_and_logged_once_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await Client.connect("127.0.0.1:1", lazy=True)  # nothing listens there
    collector = VisibilityCollector(client, "fake")
    before = sum(
        sample.value
        for family in metrics.VISIBILITY_ERRORS.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    with caplog.at_level(logging.WARNING, logger="posttrain_server.worker_metrics"):
        assert await collector.collect() is None
        assert await collector.collect() is None
    after = sum(
        sample.value
        for family in metrics.VISIBILITY_ERRORS.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    assert after - before == 2
    warned = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(warned) == 1


# -- the SDK's own metrics --------------------------------------------------------------------


async def test_the_sdk_serves_its_own_metrics_where_the_setting_says(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    port = free_port()
    address = time_skipping_env.client.service_client.config.target_host
    settings = Settings(
        **{"TEMPORAL_ADDRESS": address},  # type: ignore[arg-type]
        state_dir=tmp_path,
        temporal_metrics_port=port,
    )
    assert sdk_metrics_address(settings) == f"127.0.0.1:{port}"
    client = await connect(settings, serve_sdk_metrics=True)
    await client.workflow_service.get_system_info(GetSystemInfoRequest())
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert answer.status_code == 200
    assert "temporal_request" in answer.text


def test_a_taken_sdk_metrics_port_stops_the_process_with_the_setting_to_change(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = Settings(state_dir=tmp_path, temporal_metrics_port=taken.getsockname()[1])
        with pytest.raises(SystemExit, match="POSTTRAIN_TEMPORAL_METRICS_PORT"):
            asyncio.run(connect(settings, serve_sdk_metrics=True))
