"""The backend on the real `HfApi` over the HTTP-level fake Hub: a whole lifecycle, then the
pieces of the library's HTTP layer it depends on (the client factory, pagination, the upload
steps of `run_uv_job`, the errors `hf_raise_for_status` raises)."""

from __future__ import annotations

import json
import struct

import pytest
from huggingface_hub.utils import get_session

from activities.backends.hf.http import BoundedTransport
from activities.backends.hf.labels import HfRef
from activities.backends.hf.submission import artifacts_bucket, outputs_prefix
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import JobState
from tests.hf.conftest import DATASET, FAST_HTTP, MODEL, TOKEN, http_backend, request
from tests.hf.fake_hub import JobPlan
from tests.hf.http_hub import HubHttp, Scopes


async def test_a_job_runs_through_the_real_client_from_submit_to_its_logs(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=5, running_s=61, logs=["step 1", "step 2"])
    backend = http_backend(http_hub)
    assert await backend.resolve_model(MODEL.repo_id, "main") == MODEL.revision
    assert await backend.resolve_dataset(DATASET.repo_id, []) == DATASET.revision
    job = await backend.submit(request())
    assert job.state is JobState.queued
    ref = HfRef.decode(job.ref)
    assert ref.namespace == "alice" and ref.folder is not None
    # run_uv_job's steps, each an HTTP request: the bucket, the xet token, the batch, the job.
    routes = [seen.route for seen in http_hub.seen]
    assert routes.index("create_bucket") < routes.index("xet_token") < routes.index("bucket_batch")
    assert routes.index("bucket_batch") < routes.index("create_job")
    uploaded = http_hub.files[f"alice/jobs-artifacts/{ref.folder}/launcher.py"]
    assert b"print('training')" not in uploaded  # embedded base64 by the launcher, never verbatim
    hub.advance(30)
    assert (await backend.observe([job.ref], hub.now))[job.ref].state is JobState.running
    hub.advance(60)
    ended = (await backend.observe([job.ref], hub.now))[job.ref]
    assert ended.state is JobState.succeeded and ended.running_s == 61.0
    assert await backend.logs(job.ref, 10, hub.now) == ["step 1", "step 2"]
    # Every request carried the broker's token except the input and price lookups.
    for seen in http_hub.seen:
        public = seen.route in ("dataset_info", "model_info", "hardware")
        assert seen.token == (None if public else TOKEN), seen.route


async def test_every_request_is_sent_through_the_bounded_transport_with_finite_timeouts(
    http_hub: HubHttp,
) -> None:
    assert isinstance(get_session()._transport, BoundedTransport)
    backend = http_backend(http_hub)
    for n in range(5):  # more jobs than a page holds: list_jobs follows the Link header
        await backend.submit(request(n=n))
    await backend.live_jobs()
    pages = http_hub.requests_to("list_jobs")
    assert len(pages) == 3 and [p for p in pages if ("cursor", "2") in p.params]
    for seen in http_hub.seen:
        # paginated calls pass timeout=None to httpx2 explicitly: replaced by ours
        read, connect = seen.timeout["read"], seen.timeout["connect"]
        assert all(value is not None for value in seen.timeout.values()), seen.route
        assert read is not None and read <= FAST_HTTP.read_s, seen.route
        assert connect is not None and connect <= FAST_HTTP.connect_s, seen.route


async def test_a_finished_job_is_not_cancelled_and_a_running_one_is_confirmed(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    backend = http_backend(http_hub)
    hub.plan = JobPlan(scheduling_s=0, running_s=10)
    done = await backend.submit(request(n=1))
    hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    running = await backend.submit(request(n=2))
    hub.advance(30)
    assert (await backend.cancel(done.ref, hub.now)).state is JobState.succeeded
    assert not http_hub.requests_to("cancel_job")
    assert (await backend.cancel(running.ref, hub.now)).state is JobState.cancelled
    assert len(http_hub.requests_to("cancel_job")) == 1


async def test_an_empty_artifact_gets_a_placeholder_uploaded_through_the_bucket_batch(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    backend = http_backend(http_hub)
    agent = await backend.submit(request())
    hub.advance(600)
    await backend.submit(request(JobRole.dev, n=2, artifact_ref=agent.ref))
    folder = HfRef.decode(agent.ref).folder
    assert hub.buckets["alice/jobs-artifacts"][f"{folder}/outputs/.keep"] == 0


@pytest.mark.parametrize(
    ("scopes", "step", "permission"),
    [
        (Scopes(bucket_write=False), "bucket", "bucket write"),
        (Scopes(jobs=False), "Jobs", "jobs"),
    ],
)
async def test_a_403_says_which_permission_the_token_lacks(
    http_hub: HubHttp, scopes: Scopes, step: str, permission: str
) -> None:
    http_hub.scopes[TOKEN] = scopes
    with pytest.raises(ToolError) as refused:
        await http_backend(http_hub).submit(request())
    assert refused.value.type is ErrorType.hf_error
    assert refused.value.details["permission"] == permission
    assert step in refused.value.message and "settings/tokens" in refused.value.message
    assert not http_hub.hub.jobs


async def test_a_403_on_upload_to_an_existing_bucket_also_names_bucket_write(
    http_hub: HubHttp,
) -> None:
    http_hub.hub.buckets["alice/jobs-artifacts"] = {}  # made earlier by a stronger token
    http_hub.scopes[TOKEN] = Scopes(bucket_write=False)
    with pytest.raises(ToolError) as refused:
        await http_backend(http_hub).submit(request())
    # create_bucket's 403 is followed by bucket_info (it exists), then hf_xet refuses.
    assert http_hub.requests_to("bucket_info") and http_hub.requests_to("xet_token")
    assert refused.value.details["permission"] == "bucket write"
    assert "alice/jobs-artifacts" in refused.value.message


async def test_a_402_says_billing(http_hub: HubHttp) -> None:
    http_hub.answer("create_job", 402, message="Payment required: add a payment method")
    with pytest.raises(ToolError) as refused:
        await http_backend(http_hub).submit(request())
    message = refused.value.message
    assert "billing" in message and "settings/billing" in message and "402" in message
    assert len(http_hub.requests_to("create_job")) == 1


async def test_the_fake_answers_404_for_a_job_of_another_namespace_as_the_hub_does(
    http_hub: HubHttp,
) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import JobNotFoundError

    backend = http_backend(http_hub)
    job = await backend.submit(request())
    http_hub.namespaces.add("alice-org")
    api = HfApi(token=TOKEN)
    with pytest.raises(JobNotFoundError):
        api.inspect_job(job_id=HfRef.decode(job.ref).job_id, namespace="alice-org")


def test_the_transport_turns_a_retryable_answer_into_an_exception_the_library_lets_through(
    http_hub: HubHttp,
) -> None:
    from huggingface_hub.utils import http_backoff

    from activities.backends.hf.http import HubBusy

    http_hub.answer("hardware", 503, times=6)
    with pytest.raises(HubBusy):
        http_backoff("GET", "https://huggingface.co/api/jobs/hardware")
    assert len(http_hub.requests_to("hardware")) == 1  # http_backoff did not retry


async def test_a_jobs_outputs_are_read_for_the_contamination_check_by_ranged_gets(
    http_hub: HubHttp,
) -> None:
    """The check reads what a job left under /data/outputs/ in its bucket folder: every file
    but the weights first, each by a GET asking for its first bytes only (`Range`), with the
    broker's token; a weights file is read to its safetensors header, never its tensors."""
    backend = http_backend(http_hub)
    job = await backend.submit(request())
    ref = HfRef.decode(job.ref)
    assert ref.folder is not None
    bucket, prefix = artifacts_bucket("alice"), outputs_prefix(ref.folder)
    text = b"Natalia sold clips to 48 of her friends in April.\n" * 40  # 2,040 bytes
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    weights = struct.pack("<Q", len(header)) + header + b"\x01" * 100_000
    http_hub.put_file(bucket, f"{prefix}/model.safetensors", weights)
    http_hub.put_file(bucket, f"{prefix}/train.jsonl", text)

    read = await backend.read_outputs(job.ref, 1_000_000)
    assert [path for path, _ in read.files] == ["train.jsonl", "model.safetensors"]
    assert dict(read.files)["train.jsonl"] == text and not read.cut
    gets = http_hub.requests_to("bucket_file")
    assert {seen.token for seen in gets} == {TOKEN}
    weights_ranges = [seen.range for seen in gets if seen.path.endswith(".safetensors")]
    assert weights_ranges == ["bytes=0-7", f"bytes=0-{8 + len(header) - 1}"]

    # At a cap, the first file is cut there and said so; nothing after it is asked for.
    asked = len(http_hub.requests_to("bucket_file"))
    small = await backend.read_outputs(job.ref, 1_000)
    assert [path for path, _ in small.files] == ["train.jsonl"] and small.cut
    assert dict(small.files)["train.jsonl"] == text[:1_000]
    assert [seen.range for seen in http_hub.requests_to("bucket_file")[asked:]] == ["bytes=0-1000"]


async def test_a_job_that_wrote_no_outputs_reads_as_nothing_without_a_file_request(
    http_hub: HubHttp,
) -> None:
    backend = http_backend(http_hub)
    job = await backend.submit(request())
    read = await backend.read_outputs(job.ref, 1_000)  # the job wrote nothing under outputs/
    assert read.files == [] and not read.cut
    assert http_hub.requests_to("bucket_file") == []
