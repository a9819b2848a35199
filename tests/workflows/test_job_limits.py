"""`task_info` says what one job may use, and what the host cannot enforce (issue 17)."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.backends.fake.backend import FakeBackend
from posttrain_common.contracts.episodes import FlavorLimits, JobLimits
from tests.workflows.harness import running_worker

GIB = 1 << 30
BASIC = FlavorLimits(vcpus=2, memory_bytes=16 * GIB, processes=1024, disk_bytes=8 * GIB, files=1)
GAP = "memory: no memory control group (the server does not run as root); each process ..."


class ReportingBackend(FakeBackend):
    """A backend that reports its limits per flavor, one of them held only by a stand-in."""

    def job_limits(self) -> JobLimits | None:
        other = BASIC.model_copy(update={"vcpus": 8})
        return JobLimits(
            flavors={"cpu-basic": BASIC, "cpu-upgrade": other, "t4-small": BASIC},
            not_enforced=[GAP],
        )


async def test_task_info_shows_the_limits_of_the_tasks_flavors_and_what_is_not_enforced(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path, backend_class=ReportingBackend) as h:
        ep = await h.episode()
        info = (await ep.call("task_info")).data
    # The test task allows cpu-basic and t4-small (evaluations: cpu-basic); not cpu-upgrade.
    assert info["job_limits"] == {
        "flavors": {"cpu-basic": BASIC.model_dump(), "t4-small": BASIC.model_dump()},
        "not_enforced": [GAP],
    }


async def test_task_info_has_no_job_limits_when_the_backend_does_not_say(
    time_skipping_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_worker(time_skipping_env, tmp_path) as h:
        ep = await h.episode()
        info = (await ep.call("task_info")).data
    assert "job_limits" not in info and info["task_id"] == "t_test"
