"""Fixtures: a fake Hub and an HfBackend wired to it exactly as `activities/backends/hf/factory.py`
wires the real
one (a broker api holding the token, a public api with `token=False`): either the recording fake
`HfApi` (call-argument invariants) or real `HfApi` objects over the HTTP-level fake Hub."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.utils._http import default_client_factory

from activities.backends.hf.backend import HfBackend, HfBackendConfig
from activities.backends.hf.http import HubHttpLimits, install_hub_client
from activities.backends.hf.namespaces import NamespaceNotes
from activities.backends.interface import JobRequest
from activities.jobs.activities import HIDDEN_SEED_SECRET
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.jobs import JobRole, RepoRef
from tests.hf.fake_hub import T0, FakeHub, dataset_json, model_json
from tests.hf.http_hub import FakeXet, HubHttp

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


# -- the HTTP-level fake Hub, under the real HfApi ---------------------------------------------

# Short bounds, so that tests which wait for a timeout wait fractions of a second.
FAST_HTTP = HubHttpLimits(
    connect_s=0.2,
    read_s=0.3,
    write_s=0.3,
    pool_s=0.2,
    call_s=1.5,
    activity_margin_s=0.2,
    threads=4,
)


@pytest.fixture
def http_hub(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubHttp]:
    """The fake Hub answering HTTP, installed exactly as production installs its network
    (`install_hub_client`), with FakeXet standing in for hf_xet's own uploads."""
    http = HubHttp(hub)
    install_hub_client(FAST_HTTP, transport=http)
    monkeypatch.setattr("huggingface_hub.utils._xet.get_xet_session", lambda: FakeXet(http))
    try:
        yield http
    finally:
        set_client_factory(default_client_factory)


def http_backend(
    http: HubHttp,
    *,
    namespace: str | None = None,
    token: str = TOKEN,
    limits: HubHttpLimits = FAST_HTTP,
    namespaces: NamespaceNotes | None = None,
    **config: object,
) -> HfBackend:
    """An HfBackend on real HfApi objects, as `activities/backends/hf/factory.py` builds it: the
    process's Hub
    client is (re)installed with the same `limits` (it is process-wide, as in production)."""
    install_hub_client(limits, transport=http)
    options: dict = {
        "cancel_confirm_interval_s": 0.0,
        "submit_look_interval_s": 0.0,
        "submit_settle_s": 0.0,
        "http": limits,
        **config,
    }
    return HfBackend(
        HfApi(token=token, library_name="posttrain-env-tests"),
        HfApi(token=False, library_name="posttrain-env-tests"),
        deployment="dtest",
        namespace=namespace or http.hub.namespace,
        config=HfBackendConfig(**options),
        clock=http.hub.clock,
        namespaces=namespaces,
    )
