"""One real server for the example agent's tests (each test plays its own episode)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from posttrain_common.contracts.jobs import JobRole
from tests.gateway.server import ServerProcess, serving

# Jobs of a few seconds, so a whole episode played by the example takes seconds of real time.
QUICK = FakeScenario(
    jobs=[
        FakeJobScript(role=JobRole.grader, queue_s=1, run_s=1, score=0.75),
        FakeJobScript(role=JobRole.dev, queue_s=1, run_s=1, score=0.6),
        FakeJobScript(queue_s=1, run_s=2),
    ]
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from serving(tmp_path_factory, QUICK)
