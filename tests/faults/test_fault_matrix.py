"""The fault matrix at a small size (`slow`): every kill point once on the fake backend, the
targets rotated so that each is killed at least once, and the local backend's (b), (d) and (e)
once each, on `cluster-local`'s topology (two gateways, two workers, one Temporal dev server,
one key), each cell checked against every invariant (`tests/faults/checks.py`). The whole
matrix is `uv run python -m tests.faults.matrix` (docs/deployment.md "The fault matrix").

The whole-server SIGKILL scenarios of the gateway's durability test (gone since) are cells here:
a kill during `jobs_wait` with the reward and one settled minute is (c) x everything, a kill
while `submit` grades giving the reward once is (e) x everything, and a local job outliving the
kill, neither lost nor run twice, is the local backend's (b) x everything. (The all-in-one
server's own restart on its embedded Temporal is tests/gateway/test_server_process.py's.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from activities.backends.fake.backend import FakeScenario
from tests.faults.matrix import run_cell
from tests.faults.plays import FAKE_SCENARIO
from tests.faults.topology import Target, Topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FAKE_ROTATION: list[tuple[str, Target]] = [
    ("a", "gateway"),
    ("b", "worker"),
    ("c", "everything"),
    ("d", "temporal"),
    ("e", "everything"),
    ("f", "worker"),
    ("g", "gateway"),
    ("h", "worker"),
]
LOCAL_ROTATION: list[tuple[str, Target]] = [("b", "everything"), ("d", "worker"), ("e", "temporal")]


@pytest.fixture(scope="class")
async def fake_topology(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Topology]:
    async with Topology.running(
        tmp_path_factory.mktemp("fake-topology"), "fake", FAKE_SCENARIO
    ) as topology:
        yield topology


@pytest.fixture(scope="class")
async def local_topology(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Topology]:
    async with Topology.running(
        tmp_path_factory.mktemp("local-topology"), "local", FakeScenario()
    ) as topology:
        yield topology


# One topology per class, stopped when its class is done (never both at once on 2 cores).
class TestOnTheFakeBackend:
    @pytest.mark.parametrize(("point", "target"), FAKE_ROTATION)
    async def test_a_kill_at_this_point_keeps_every_invariant(
        self, fake_topology: Topology, point: str, target: Target
    ) -> None:
        result = await run_cell(fake_topology, point, target)
        assert result.passed, result.describe()


class TestOnTheLocalBackend:
    @pytest.mark.parametrize(("point", "target"), LOCAL_ROTATION)
    async def test_a_kill_at_this_point_keeps_every_invariant(
        self, local_topology: Topology, point: str, target: Target
    ) -> None:
        result = await run_cell(local_topology, point, target)
        assert result.passed, result.describe()
