"""Building the fake backend from the settings (`BACKEND.build`)."""

from __future__ import annotations

from pydantic import ValidationError

from activities.backends.fake.backend import FakeBackend, FakeScenario
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings


def build(settings: Settings, key: ServerKey) -> FakeBackend:
    """The fake backend with the scenario POSTTRAIN_FAKE_SCENARIO names (SystemExit when that
    file cannot be read or is not a scenario)."""
    del key  # the fake names no deployment
    scenario = FakeScenario()
    if settings.fake_scenario is not None:
        try:
            scenario = FakeScenario.model_validate_json(settings.fake_scenario.read_text())
        except (OSError, ValidationError) as exc:
            raise SystemExit(f"POSTTRAIN_FAKE_SCENARIO={settings.fake_scenario}: {exc}") from None
    return FakeBackend(settings.state_dir / "fake", scenario)
