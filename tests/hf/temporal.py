"""Episodes on the time-skipping test server with the hf backend and a fake Hub (the recording
fake `HfApi`, or real `HfApi` objects over the HTTP-level fake), whose clock is the test server's
own (so a job's stages follow skipped workflow time)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.backends.hf.backend import HfBackend
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.worker import build_worker
from tests.hf.conftest import make_backend
from tests.hf.fake_hub import FakeHub, model_json
from tests.workflows.harness import Harness, write_task

MODEL_REPO = "test-org/tiny-model"  # the base model of harness.write_task's task
MODEL_SHA = "c" * 40


class ServerClock:
    """The test server's current time, read from the activity threads the fake Hub is called
    in. On the event loop's own thread (a test body) it answers the last time it read: blocking
    there on the loop would deadlock."""

    def __init__(self, env: WorkflowEnvironment, loop: asyncio.AbstractEventLoop) -> None:
        self._env = env
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.last: datetime | None = None

    def __call__(self) -> datetime:
        if threading.get_ident() == self._loop_thread:
            assert self.last is not None, "the fake Hub's clock was read before any activity"
            return self.last
        future = asyncio.run_coroutine_threadsafe(self._env.get_current_time(), self._loop)
        self.last = future.result(timeout=30)
        return self.last


def follow_server_time(env: WorkflowEnvironment, hub: FakeHub) -> None:
    """The fake Hub's clock becomes the test server's (call inside the test's event loop)."""
    hub.models[MODEL_REPO] = model_json(MODEL_REPO, MODEL_SHA)
    hub._clock = ServerClock(env, asyncio.get_running_loop())


@asynccontextmanager
async def hf_worker(
    env: WorkflowEnvironment,
    tmp_path: Path,
    hub: FakeHub,
    backend: HfBackend | None = None,
    *,
    task_queue: str | None = None,
    end_workflows: bool = True,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """A worker with the hf backend (by default on the recording fake `HfApi`) on a fresh task
    queue, or on `task_queue` (a second worker replacing a first); the harness drives episodes.
    On exit it ends every workflow it started unless `end_workflows` is False."""
    tasks_dir = tmp_path / "tasks"
    write_task(tasks_dir)
    follow_server_time(env, hub)
    backend = backend or make_backend(hub)
    # Storage is free here unless a test prices it (tests/workflows/test_storage.py).
    settings.setdefault("storage_usd_per_tb_month", 0.0)
    config = Settings(state_dir=tmp_path / "state", backend="fake", **settings)
    task_queue = task_queue or f"tq-{uuid.uuid4().hex[:12]}"
    key = ServerKey.load_or_create(config.server_key_path)
    worker = build_worker(
        env.client, config, backend, key=key, task_queue=task_queue, tasks_dir=tasks_dir
    )
    harness = Harness(env, env.client, task_queue, backend, config)  # type: ignore[arg-type]
    async with worker:
        try:
            yield harness
        finally:
            if end_workflows:
                await harness.terminate_all()
