"""Observe degrades per job, under the real `HfApi` over the HTTP-level fake Hub: a namespace
that refuses its listing, or jobs whose looks do not fit in the activity's time, are left out of
one answer (the watcher looks again next period); the others are still observed."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.backends.hf.http import HubHttpLimits
from activities.backends.hf.missing import LookOrder
from posttrain_env.errors import ToolError
from posttrain_env.models import JobState
from tests.hf.conftest import FAST_HTTP, http_backend, request
from tests.hf.fake_hub import T0, JobPlan
from tests.hf.http_hub import HubHttp


def in_activity(timeout_s: float) -> ActivityEnvironment:
    """One activity attempt with its own task token and timeout."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        start_to_close_timeout=timedelta(seconds=timeout_s),
        started_time=datetime.now(UTC),
        task_token=uuid.uuid4().bytes,
    )
    return env


async def test_a_namespace_that_refuses_leaves_only_its_own_jobs_out(http_hub: HubHttp) -> None:
    http_hub.hub.plan = JobPlan(scheduling_s=0, running_s=3600)
    backend = http_backend(http_hub)
    ours = (await backend.submit(request())).ref
    # Jobs watched in namespaces the token can no longer reach: they answer 403.
    elsewhere = ["bob/0abc", "carol/0def"]
    seen = await backend.observe([ours, *elsewhere], T0)
    assert set(seen) == {ours} and seen[ours].state is JobState.running
    listed = {seen.path for seen in http_hub.requests_to("list_jobs")}
    assert {"/api/jobs/bob", "/api/jobs/carol"} <= listed  # they were asked, and refused
    # When every namespace refuses, nothing was observed: the activity fails, visibly.
    with pytest.raises(ToolError) as refused:
        await backend.observe(elsewhere, T0)
    assert "403" in refused.value.message


async def test_jobs_whose_looks_do_not_fit_the_activitys_time_are_left_out_not_the_batch(
    http_hub: HubHttp,
) -> None:
    hub = http_hub.hub
    hub.plan = JobPlan(scheduling_s=0, running_s=10)
    limits: HubHttpLimits = dataclasses.replace(FAST_HTTP, activity_margin_s=0.2)
    backend = http_backend(http_hub, limits=limits)
    refs = [(await backend.submit(request(n=n))).ref for n in range(1, 13)]
    hub.advance(60)  # all ended: none is in the live list, each needs a look of its own
    http_hub.slow("inspect_job", 0.2)  # a slow Hub: 12 looks take 2.4 s, the call has 1.1 s
    first = await in_activity(timeout_s=1.3).run(backend.observe, refs, T0)
    assert len(first) < len(refs)  # the rest were left out, and the batch did not fail
    assert all(job.state is JobState.succeeded for job in first.values())
    # Each look starts with the jobs looked at longest ago, so the next looks reach the jobs
    # this one left out, and a few looks observe every job (however loaded the machine). As
    # the watcher does, a job seen ended is not asked for again.
    seen = set(first)
    for _ in range(len(refs)):
        if seen == set(refs):
            break
        left = [ref for ref in refs if ref not in seen]
        seen |= set(await in_activity(timeout_s=1.3).run(backend.observe, left, T0))
    assert seen == set(refs)
    looked = [s.path.rsplit("/", 1)[-1] for s in http_hub.requests_to("inspect_job")]
    first_looks = looked[: len(refs) - len(first)]
    assert len(set(first_looks)) == len(first_looks)  # no job looked at twice before the others


def test_the_look_order_puts_the_jobs_looked_at_longest_ago_first() -> None:
    order = LookOrder()
    assert order.order(["a", "b", "c"]) == ["a", "b", "c"]
    order.looked("a")
    order.looked("b")
    assert order.order(["a", "b", "c"]) == ["c", "a", "b"]
    order.looked("a")
    assert order.order(["a", "b", "c"]) == ["c", "b", "a"]
