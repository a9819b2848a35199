"""DESIGN §6 on the Hugging Face backend, asserted on the arguments the fake HfApi received."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import Volume

from activities.backends.hf.backend import HfBackend
from activities.backends.hf.labels import HfRef
from activities.jobs.activities import HIDDEN_SEED_SECRET
from job_launcher.builder import read_embedded
from job_launcher.trusted_lines import NONCE_ENV
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.errors import ErrorType, ToolError
from tests.hf.conftest import DATASET, MODEL, TOKEN, request
from tests.hf.fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[2]


def volumes_of(call_args: dict) -> dict[str, Volume]:
    return {v.mount_path: v for v in call_args.get("volumes") or []}


async def run_whole_lifecycle(hub: FakeHub, backend: HfBackend) -> None:
    """Every backend operation once: inputs, an agent job, its logs and cancel, both evaluations."""
    await backend.resolve_model(MODEL.repo_id, "main")
    await backend.resolve_dataset(DATASET.repo_id, [])
    await backend.hardware()
    agent = await backend.submit(request(JobRole.agent, n=1))
    await backend.find_by_key(request(n=1).key, hub.now)
    hub.advance(30)
    await backend.observe([agent.ref], hub.now)
    await backend.logs(agent.ref, 100, hub.now)
    hub.advance(120)
    await backend.observe([agent.ref], hub.now)
    await backend.submit(request(JobRole.dev, n=2, artifact_ref=agent.ref))
    grader = await backend.submit(request(JobRole.grader, n=3, artifact_ref=agent.ref))
    await backend.cancel(grader.ref, hub.now)


async def test_no_call_and_no_job_carries_the_token(hub: FakeHub, backend: HfBackend) -> None:
    await run_whole_lifecycle(hub, backend)
    assert hub.calls
    for call in hub.calls:
        # The token is only ever the HfApi's own; no call passes one.
        assert call.args.get("token") is None, call.method
        assert TOKEN not in repr(call.args), call.method
        assert TOKEN not in (call.script_text or ""), call.method
    for job_id in hub.jobs:
        shown = json.dumps(hub._job_json(hub.jobs[job_id]))
        assert TOKEN not in shown
        assert "HF_TOKEN" not in shown and "HUGGING_FACE_HUB_TOKEN" not in shown


async def test_inputs_are_looked_up_without_the_token(hub: FakeHub, backend: HfBackend) -> None:
    await run_whole_lifecycle(hub, backend)
    for method in ("model_info", "dataset_info", "list_jobs_hardware"):
        calls = hub.calls_to(method)
        assert calls and all(call.token is False for call in calls), method
    for method in ("run_uv_job", "list_jobs", "inspect_job", "cancel_job", "fetch_job_logs"):
        assert all(call.token == TOKEN for call in hub.calls_to(method)), method


async def test_an_agent_job_is_explicit_and_gets_no_secret(
    hub: FakeHub, backend: HfBackend
) -> None:
    job = await backend.submit(request(JobRole.agent))
    (call,) = hub.calls_to("run_uv_job")
    args = call.args
    assert args["flavor"] == "cpu-basic" and args["namespace"] == "alice"
    assert args["timeout"] == 600 and args["python"] == "3.12"
    assert args["secrets"] is None and "dependencies" not in args
    assert args["env"] == {NONCE_ENV: "nonce-1"}
    labels = args["labels"]
    assert labels["posttrain-deployment"] == "dtest"
    assert labels["posttrain-episode"] == "ep-0123456789abcdef"
    assert labels["posttrain-task"] == "t0_artifact" and labels["posttrain-role"] == "agent"
    assert labels["posttrain-job"] == "job-000000000001"
    # The workflow id has '/' in it: the idempotency label is a hash of it.
    assert labels["posttrain-key"].startswith("k") and "/" not in labels["posttrain-key"]
    assert all(len(v) <= 100 for v in labels.values())
    # The one uploaded file is the launcher with the agent's script embedded, never verbatim.
    assert Path(args["script"]).name == "launcher.py"
    assert call.script_text is not None and "_EMBEDDED_SCRIPT" in call.script_text
    assert "print('training')" not in call.script_text
    info = hub.info(HfRef.decode(job.ref).job_id)
    assert info.secrets == {} and info.flavor == "cpu-basic"


async def test_inputs_are_read_only_mounts_at_pinned_commits(
    hub: FakeHub, backend: HfBackend
) -> None:
    await backend.submit(request(JobRole.agent))
    mounts = volumes_of(hub.calls_to("run_uv_job")[0].args)
    assert set(mounts) == {"/base_model", f"/datasets/{DATASET.repo_id}"}
    model, data = mounts["/base_model"], mounts[f"/datasets/{DATASET.repo_id}"]
    assert (model.type, model.source, model.revision) == ("model", MODEL.repo_id, MODEL.revision)
    assert (data.type, data.source, data.revision) == ("dataset", DATASET.repo_id, "d" * 40)
    assert model.read_only is True and data.read_only is True
    # The job as the Hub records it: the same mounts, plus its own /data folder (read-write).
    info = hub.info(next(iter(hub.jobs)))
    recorded = {v.mount_path: v for v in info.volumes or []}
    assert recorded["/base_model"].read_only and recorded["/base_model"].revision == "a" * 40
    assert recorded["/data"].type == "bucket" and recorded["/data"].read_only is False


async def test_only_grader_jobs_carry_a_secret_and_only_the_seed(
    hub: FakeHub, backend: HfBackend
) -> None:
    agent = await backend.submit(request(JobRole.agent, n=1))
    await backend.submit(request(JobRole.dev, n=2, artifact_ref=agent.ref))
    await backend.submit(request(JobRole.grader, n=3, artifact_ref=agent.ref))
    agent_call, dev_call, grader_call = hub.calls_to("run_uv_job")
    assert agent_call.args["secrets"] is None and dev_call.args["secrets"] is None
    assert grader_call.args["secrets"] == {HIDDEN_SEED_SECRET: "seed-0123456789abcdef"}
    assert grader_call.args["labels"]["posttrain-role"] == "grader"
    # Evaluators get their nonce in the environment (the seed as a secret) and run under the
    # launcher like agent jobs: the uploaded file is the launcher with the evaluator embedded,
    # told to pass those names (never their values) on to it.
    assert dev_call.args["env"] == {NONCE_ENV: "nonce-2"}
    for call, names in ((dev_call, [NONCE_ENV]), (grader_call, [NONCE_ENV, HIDDEN_SEED_SECRET])):
        assert Path(call.args["script"]).name == "launcher.py"
        assert call.script_text is not None
        config, script = read_embedded(call.script_text)
        assert script == request(JobRole.dev).script
        assert config["pass_env"] == sorted(names) and config["packages"] == []
        assert "seed-0123456789abcdef" not in call.script_text and "nonce-" not in call.script_text


async def test_model_is_the_evaluated_jobs_outputs_read_only(
    hub: FakeHub, backend: HfBackend
) -> None:
    first = await backend.submit(request(JobRole.agent, n=1))
    second = await backend.submit(request(JobRole.agent, n=2))
    await backend.submit(request(JobRole.dev, n=3, artifact_ref=second.ref))
    agent_calls = hub.calls_to("run_uv_job")
    eval_mounts = volumes_of(agent_calls[2].args)
    folder_1 = hub.jobs[HfRef.decode(first.ref).job_id].folder
    folder_2 = hub.jobs[HfRef.decode(second.ref).job_id].folder
    assert folder_1 and folder_2 and folder_1 != folder_2
    model = eval_mounts["/model"]
    assert model.type == "bucket" and model.source == "alice/jobs-artifacts"
    assert model.path == f"{folder_2}/outputs" and model.read_only is True
    assert eval_mounts["/base_model"].revision == MODEL.revision
    # The ref that crossed workflow history holds the namespace, the job id and its folder,
    # nothing else.
    assert second.ref == f"alice/{HfRef.decode(second.ref).job_id}:{folder_2}"


@pytest.mark.parametrize(
    "fields",
    [
        {"env": {NONCE_ENV: "n", "HF_TOKEN": TOKEN}},
        {"env": {NONCE_ENV: "n", "HUGGING_FACE_HUB_TOKEN": "x"}},
        {"env": {NONCE_ENV: "n", "DEBUG": TOKEN}},
        {"secrets": {HIDDEN_SEED_SECRET: "seed"}},
        {"script": f"print('{TOKEN}')\n"},
    ],
)
async def test_a_request_that_would_carry_a_secret_is_refused(
    hub: FakeHub, backend: HfBackend, fields: dict
) -> None:
    with pytest.raises(ToolError) as refused:
        await backend.submit(request(JobRole.agent, **fields))
    assert refused.value.type is ErrorType.hf_error
    assert TOKEN not in refused.value.message
    assert not hub.calls_to("run_uv_job")


async def test_a_grader_with_any_other_secret_is_refused(hub: FakeHub, backend: HfBackend) -> None:
    agent = await backend.submit(request(JobRole.agent))
    extra = {HIDDEN_SEED_SECRET: "seed", "OTHER": "x"}
    with pytest.raises(ToolError):
        await backend.submit(request(JobRole.grader, n=2, artifact_ref=agent.ref, secrets=extra))
    assert len(hub.calls_to("run_uv_job")) == 1


def test_the_backend_never_shells_out() -> None:
    sources = sorted((ROOT / "activities" / "hf").glob("*.py"))
    for source in sources:
        text = source.read_text()
        assert "subprocess" not in text and "os.system" not in text, source
