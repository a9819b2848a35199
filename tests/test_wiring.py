"""The wiring builds the backends from settings: a backend itself reads no environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.backends.fake.backend import FakeBackend, FakeJobScript, FakeScenario
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_server.wiring import make_backend

# The fake backend names no Hugging Face jobs; any deployment key will do.
KEY = ServerKey(b"k" * 32)


def test_the_fake_backend_plays_the_scenario_file_that_posttrain_fake_scenario_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = FakeScenario(jobs=[FakeJobScript(script_contains="SLOW", run_s=3600)])
    path = tmp_path / "scenario.json"
    path.write_text(scenario.model_dump_json())
    monkeypatch.setenv("POSTTRAIN_FAKE_SCENARIO", str(path))
    backend = make_backend(Settings(backend="fake", state_dir=tmp_path / "state"), KEY)
    assert isinstance(backend, FakeBackend)
    assert backend.scenario == scenario


def test_without_a_scenario_file_the_fake_backend_plays_the_default_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POSTTRAIN_FAKE_SCENARIO", raising=False)
    backend = make_backend(Settings(backend="fake", state_dir=tmp_path / "state"), KEY)
    assert isinstance(backend, FakeBackend) and backend.scenario == FakeScenario()
    # The backend itself reads no environment: built directly with the variable set, it plays
    # the default scenario too.
    monkeypatch.setenv("POSTTRAIN_FAKE_SCENARIO", str(tmp_path / "missing.json"))
    assert FakeBackend(tmp_path / "other").scenario == FakeScenario()


@pytest.mark.parametrize("content", [None, "{not json", '{"jobs": [{"queue_s": "soon"}]}'])
def test_a_scenario_file_that_cannot_be_read_stops_the_server_naming_it(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "scenario.json"
    if content is not None:
        path.write_text(content)
    settings = Settings(backend="fake", state_dir=tmp_path / "state", fake_scenario=path)
    with pytest.raises(SystemExit, match=f"POSTTRAIN_FAKE_SCENARIO={path}"):
        make_backend(settings, KEY)
