"""What the server, never an agent, decides for local jobs: the wheel folders their installs use
(POSTTRAIN_LOCAL_FIND_LINKS), and which commit of the local base model they mount
(`[base_model] local_revision`)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from activities.backends.fake.backend import FakeBackend, FakeScenario
from activities.backends.local.backend import LocalBackend
from activities.backends.local.factory import build as local_backend
from activities.episodes.activities import pinned_base_model
from posttrain_common.contracts.jobs import RepoRef
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_env.models import BaseModelSpec
from tasks.registry import load_task
from tests.launcher.conftest import make_wheel
from tests.local.conftest import JOB_PYTHON, SMALL, TEST_BWRAP, Jobs, write_model

KEY = ServerKey(b"k" * 32)  # local jobs carry no deployment label: any key builds it


def server_backend(state_dir: Path) -> LocalBackend:
    """The local backend as the server builds it from its settings (the environment's)."""
    backend = local_backend(Settings(state_dir=state_dir.parent), KEY)
    assert isinstance(backend, LocalBackend)
    return backend


def test_the_find_links_setting_reaches_a_local_jobs_install(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "pt-probe", "1.0", "VALUE = 'probe-1.0'\n")
    monkeypatch.setenv("POSTTRAIN_LOCAL_FIND_LINKS", str(wheels))
    backend = server_backend(state_dir)
    assert backend.machine.find_links == (str(wheels),)
    # Nothing from PyPI: the package can only come from the setting's folder.
    backend.machine = dataclasses.replace(backend.machine, no_index=True)
    jobs = Jobs(backend, write_model(tmp_path / "model"))
    job = jobs.run(
        "import pt_probe\nprint('REPORT', '{\"v\": \"' + pt_probe.VALUE + '\"}')\n",
        dependencies=["pt-probe==1.0"],
        timeout=120,
    )
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    assert jobs.report(job.ref) == {"v": "probe-1.0"}


def test_without_the_setting_a_package_only_those_folders_hold_is_not_found(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_LOCAL_FIND_LINKS", "")
    backend = server_backend(state_dir)
    assert backend.machine.find_links == ()
    backend.machine = dataclasses.replace(backend.machine, no_index=True)
    jobs = Jobs(backend, write_model(tmp_path / "model"))
    job = jobs.run("print('never')", dependencies=["pt-probe==1.0"], timeout=120)
    assert job.state.value == "failed"
    assert job.message.startswith("installing the job's packages failed")


def test_the_local_backend_pins_the_local_revision_and_hugging_face_the_revision(
    state_dir: Path, tmp_path: Path
) -> None:
    backend = LocalBackend(state_dir, job_python=JOB_PYTHON, limits=SMALL, bwrap=TEST_BWRAP)
    source = write_model(tmp_path / "model")
    first = backend.hub.add_model("test/base", source)
    (source / "config.json").write_text('{"model_type": "test", "retrained": true}')
    latest = backend.hub.add_model("test/base", source)  # `main` now points here
    assert first != latest
    hub_commit = "b" * 40
    task = load_task("t0_artifact")

    def pinned(on, spec: BaseModelSpec, revision: str | None = None) -> RepoRef:
        spec_task = task.model_copy(update={"base_model": spec})
        return asyncio.run(pinned_base_model(on, spec_task, revision))

    spec = BaseModelSpec(
        repo_id="org/model", revision=hub_commit, local="test/base", local_revision=first
    )
    assert pinned(backend, spec) == RepoRef(repo_id="test/base", revision=first)
    branch = spec.model_copy(update={"local_revision": "main"})
    assert pinned(backend, branch) == RepoRef(repo_id="test/base", revision=latest)
    # A campaign's pin wins over the task's branch, for every rollout.
    assert pinned(backend, branch, first) == RepoRef(repo_id="test/base", revision=first)
    hf_like = FakeBackend(tmp_path / "fake", FakeScenario())
    assert pinned(hf_like, spec) == RepoRef(repo_id="org/model", revision=hub_commit)
