"""One real server (gateway, worker, file-backed Temporal dev server, the fake backend) per
module, with the training scenario and tasks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.server import ServerProcess
from tests.training.scenario import SCENARIO, write_tasks


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tasks_dir = write_tasks(tmp_path_factory.mktemp("tasks"))
    proc = ServerProcess(
        tmp_path_factory.mktemp("server"),
        scenario=SCENARIO,
        extra_env={"POSTTRAIN_TASKS_DIR": str(tasks_dir)},
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
