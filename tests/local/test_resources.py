"""What a local job may use, by flavor, on this machine; and the settings that change it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.backends.local import resources
from activities.backends.local.factory import build as local_backend
from activities.backends.local.resources import (
    Capacity,
    LimitsError,
    LocalLimits,
    job_resources,
    jobs_memory_bytes,
    machine_capacity,
)
from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from posttrain_env.limits import GIB, MIB

KEY = ServerKey(b"k" * 32)  # local jobs carry no deployment label: any key builds it

SMALL_MACHINE = Capacity(cpus=1.0, memory_bytes=8 * GIB)
BIG_MACHINE = Capacity(cpus=32.0, memory_bytes=256 * GIB)


def test_a_flavor_gets_its_hugging_face_size_where_the_machine_has_room() -> None:
    basic = job_resources("cpu-basic", BIG_MACHINE, LocalLimits())
    upgrade = job_resources("cpu-upgrade", BIG_MACHINE, LocalLimits())
    assert (basic.vcpus, basic.memory_bytes) == (2, 16 * GIB)
    assert (upgrade.vcpus, upgrade.memory_bytes) == (8, 32 * GIB)
    assert basic.processes == 1024 and basic.disk_bytes == 8 * GIB and basic.files == 100_000


def test_a_flavor_is_scaled_down_to_the_jobs_share_of_a_small_machine() -> None:
    for flavor in ("cpu-basic", "cpu-upgrade"):
        size = job_resources(flavor, SMALL_MACHINE, LocalLimits())
        assert size.vcpus == 1.0
        assert size.memory_bytes == 6 * GIB  # 75 % of 8 GiB: the rest is the server's reserve
    halves = LocalLimits(memory_share=0.5, cpu_share=0.5)
    size = job_resources("cpu-basic", Capacity(cpus=2.0, memory_bytes=8 * GIB), halves)
    assert (size.vcpus, size.memory_bytes) == (1.0, 4 * GIB)
    assert jobs_memory_bytes(SMALL_MACHINE, halves) == 4 * GIB


def test_an_unknown_flavor_is_sized_as_cpu_basic_and_a_large_artifact_cap_grows_the_disk() -> None:
    size = job_resources("a10g-large", BIG_MACHINE, LocalLimits(), artifact_cap=20 * GIB)
    assert (size.vcpus, size.memory_bytes) == (2, 16 * GIB)
    assert size.disk_bytes == 20 * GIB


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"memory_share": 0.0}, "memory_share must be in (0, 1]"),
        ({"cpu_share": 1.5}, "cpu_share must be in (0, 1]"),
        ({"disk_cap_bytes": 16 * MIB}, "more than half of the"),  # 100,000 inodes: 24 MiB
        ({"nproc": 0}, "nproc must be positive"),
        ({"memory_bytes": MIB}, "at least 64 MiB"),
        ({"host_disk_reserve_bytes": -1}, "host disk reserve cannot be negative"),
    ],
)
def test_limits_that_cannot_work_together_are_refused_with_the_reason(
    changes: dict[str, float], words: str
) -> None:
    with pytest.raises(LimitsError) as err:
        LocalLimits(**changes)  # type: ignore[arg-type]
    assert words in str(err.value)


def test_this_machines_capacity_is_what_the_server_may_use() -> None:
    capacity = machine_capacity()
    assert capacity.cpus == len(os.sched_getaffinity(0))  # no cpu quota on our group here
    with open("/proc/meminfo") as fh:
        total = int(fh.readline().split()[1]) * 1024
    assert 0 < capacity.memory_bytes <= total


def test_a_server_in_a_limited_group_never_promises_more_than_its_group_gives(
    tmp_path: Path,
) -> None:
    # A copy of this process's v1 groups with a 4 GiB memory limit and a 1.5-CPU quota, as a
    # container would set them.
    root = tmp_path / "cgroup"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("memory", "cpu"):
                folder = root / controller / path.lstrip("/")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "cgroup.procs").write_text("")
                if controller == "memory":
                    (folder / "memory.limit_in_bytes").write_text(str(4 * GIB))
                else:
                    (folder / "cpu.cfs_quota_us").write_text("150000")
                    (folder / "cpu.cfs_period_us").write_text("100000")
    capacity = resources.machine_capacity(cgroup_root=root)
    assert capacity.memory_bytes == 4 * GIB
    assert capacity.cpus == 1.5
    size = job_resources("cpu-basic", capacity, LocalLimits())
    assert (size.vcpus, size.memory_bytes) == (1.5, 3 * GIB)


def test_settings_refuse_shares_outside_zero_to_one() -> None:
    for name in ("local_memory_share", "local_cpu_share"):
        with pytest.raises(ValidationError):
            Settings(**{name: 0})  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            Settings(**{name: 1.01})  # type: ignore[arg-type]


def test_the_local_settings_reach_the_backend_and_its_start_says_what_holds_each_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("POSTTRAIN_LOCAL_JOB_DISK_GIB", "2")
    monkeypatch.setenv("POSTTRAIN_LOCAL_JOB_FILES", "5000")
    monkeypatch.setenv("POSTTRAIN_LOCAL_JOB_PROCESSES", "256")
    monkeypatch.setenv("POSTTRAIN_LOCAL_MEMORY_SHARE", "0.5")
    settings = Settings(state_dir=tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="activities.backends.local.factory"):
        backend = local_backend(settings, KEY)
    limits = backend.job_limits()
    basic = limits.flavors["cpu-basic"]
    assert (basic.disk_bytes, basic.files, basic.processes) == (2 * GIB, 5000, 256)
    assert basic.memory_bytes == min(16 * GIB, machine_capacity().memory_bytes // 2)
    text = caplog.text
    assert "local jobs (cpu-basic): 2 CPUs" in text
    assert (
        "held by the kernel: memory (cgroup v1), pids (cgroup v1), cpu (cgroup v1), "
        "cpuacct (cgroup v1), blkio (cgroup v1), disk"
    ) in text
    assert "not enforced" not in text  # this machine gives every limit (FACTS.md)


def test_local_settings_that_cannot_work_together_stop_the_server_with_the_reason(
    tmp_path: Path,
) -> None:
    settings = Settings(state_dir=tmp_path / "state", local_job_disk_gib=0.01)
    with pytest.raises(SystemExit) as err:
        local_backend(settings, KEY)
    assert "POSTTRAIN_LOCAL_*" in str(err.value) and "give jobs more disk" in str(err.value)
