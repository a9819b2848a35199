"""Fixtures: a fake Hub and an HfBackend wired to it exactly as `from_settings` wires the real one
(a broker api holding the token, a public api with `token=False`)."""

from __future__ import annotations

from datetime import datetime

import pytest

from activities.backend import JobRequest
from activities.hf.backend import HfBackend, HfBackendConfig
from activities.jobs import HIDDEN_SEED_SECRET
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_env.contracts.jobs import JobRole, RepoRef
from tests.hf.fake_hub import T0, FakeHub, dataset_json, model_json

TOKEN = "hf_FAKE-broker-token-that-no-job-may-see"
MODEL = RepoRef(repo_id="HuggingFaceTB/SmolLM2-135M", revision="a" * 40)
DATASET = RepoRef(repo_id="org/public-data", revision="d" * 40)


def make_backend(hub: FakeHub, **config: object) -> HfBackend:
    # No real waiting between looks: the fake Hub answers at once.
    options: dict = {
        "cancel_confirm_interval_s": 0.0,
        "submit_look_interval_s": 0.0,
        "submit_settle_s": 0.0,
        **config,
    }
    return HfBackend(
        hub.api(TOKEN),  # type: ignore[arg-type]
        hub.api(False),  # type: ignore[arg-type]
        deployment="dtest",
        namespace=hub.namespace,
        config=HfBackendConfig(**options),
        clock=hub.clock,
    )


@pytest.fixture
def hub() -> FakeHub:
    hub = FakeHub()
    hub.models[MODEL.repo_id] = model_json(MODEL.repo_id, MODEL.revision)
    hub.datasets[DATASET.repo_id] = dataset_json(DATASET.repo_id, DATASET.revision)
    return hub


@pytest.fixture
def backend(hub: FakeHub) -> HfBackend:
    return make_backend(hub)


def request(
    role: JobRole = JobRole.agent,
    *,
    n: int = 1,
    script: str = "print('training')\n",
    artifact_ref: str | None = None,
    now: datetime = T0,
    **fields: object,
) -> JobRequest:
    """A JobRequest as JobsActivities._request builds it (nonce; the seed for graders)."""
    secrets = {HIDDEN_SEED_SECRET: "seed-0123456789abcdef"} if role is JobRole.grader else {}
    values: dict = {
        "role": role,
        "episode_id": "ep-0123456789abcdef",
        "task_id": "t0_artifact",
        "job_id": f"job-{n:012x}",
        "flavor": "cpu-basic",
        "timeout_s": 600,
        "script": script if role is JobRole.agent else "# /// script\n# ///\nprint('eval')\n",
        "datasets": [DATASET] if role is JobRole.agent else [],
        "base_model": MODEL,
        "artifact_ref": artifact_ref,
        "key": f"episode-ep-0123456789abcdef/job/{n}",
        "env": {NONCE_ENV: f"nonce-{n}"},
        "secrets": secrets,
        "now": now,
        **fields,
    }
    return JobRequest(**values)
