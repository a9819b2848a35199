"""One real server per module: most gateway tests share it (each plays its own session)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.gateway.server import ServerProcess, serving

# Quick jobs so that whole episodes take seconds of real time on the dev server.
QUICK = FakeScenario(
    jobs=[
        FakeJobScript(script_contains="RUN_LONG", queue_s=1, run_s=600),
        FakeJobScript(role=JobRole.grader, queue_s=1, run_s=2, score=0.75),
        FakeJobScript(queue_s=1, run_s=2),
    ]
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, QUICK)


@pytest.fixture
def train_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The specification's flow reads `train.py` from the working directory."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    path.write_text("print('training')\n")
    return path


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[[FakeScenario], ServerProcess]]:
    started: list[ServerProcess] = []

    def make(scenario: FakeScenario) -> ServerProcess:
        proc = ServerProcess(tmp_path / "state", scenario=scenario)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        if proc.proc is not None:
            proc.stop()
