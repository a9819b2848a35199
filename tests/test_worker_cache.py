"""POSTTRAIN_MAX_CACHED_WORKFLOWS reaches the worker, and out-of-range values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.client import Client

from activities.backends.fake.backend import FakeBackend, FakeScenario
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.worker import build_worker


def test_the_cache_size_has_the_sdks_default_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_cached_workflows == 1000
    monkeypatch.setenv("POSTTRAIN_MAX_CACHED_WORKFLOWS", "20000")
    assert Settings().max_cached_workflows == 20000
    for bad in (-1, 1_000_001):
        with pytest.raises(ValidationError, match="max_cached_workflows"):
            Settings(max_cached_workflows=bad)


async def test_the_worker_keeps_as_many_workflows_as_the_setting_says(
    client: Client, tmp_path: Path
) -> None:
    settings = Settings(state_dir=tmp_path, backend="fake", max_cached_workflows=12_345)
    backend = FakeBackend(tmp_path / "fake", FakeScenario())
    key = ServerKey.load_or_create(settings.server_key_path)
    worker = build_worker(client, settings, backend, key=key, task_queue="tq-cache")
    assert worker.config()["max_cached_workflows"] == 12_345
