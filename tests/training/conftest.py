"""One real server per module (gateway, worker, file-backed Temporal dev server) on the replay
backend over the fake one, with the training scenario and tasks: a script's first run falls
through to the fake backend and is recorded, every later run of it is replayed (100 times
faster, charged what the recorded run cost, flagged as replayed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.server import ServerProcess
from tests.training.scenario import SCENARIO, replay_env, write_tasks


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tasks_dir = write_tasks(tmp_path_factory.mktemp("tasks"))
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"), scenario=SCENARIO, extra_env=replay_env(tasks_dir)
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
