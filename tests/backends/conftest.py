"""The conformance suite's fixture: a harness per registered backend (harnesses.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.backends.registry import BACKENDS
from tests.backends.harnesses import HARNESSES, Harness


@pytest.fixture(params=sorted(BACKENDS))
def h(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    """Every registered backend in turn, with its harness."""
    name: str = request.param
    assert name in HARNESSES, f"backend {name!r} is registered but has no conformance harness"
    harness = HARNESSES[name](tmp_path, monkeypatch)
    try:
        yield harness
    finally:
        harness.close()
