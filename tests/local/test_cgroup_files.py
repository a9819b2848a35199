"""What the local backend writes into control groups, on cgroup v2 and v1.

This machine's memory, pids and cpu controllers are bound to cgroup v1 (FACTS.md; its cgroup2
hierarchy at /sys/fs/cgroup/unified offers only `hugetlb`), so the v2 path cannot run against
the kernel here: these tests give it a folder that behaves as a v2 group does on `mkdir` (its
interface files appear) and check every file it writes and where the groups go. The v1 path
runs against the kernel in tests/local/test_containment.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.backends.local import cgroups
from activities.backends.local.cgroups import CgroupError, GroupLimits, JobGroups, Placement

V2_FILES = {
    "memory": {"memory.max": "max", "memory.swap.max": "max", "memory.peak": "0"},
    "pids": {"pids.max": "max", "pids.peak": "0", "pids.events": "max 0"},
    "cpu": {"cpu.weight": "100", "cpu.max": "max 100000"},
}
V2_COMMON = {"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.controllers": ""}


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every (folder, file, value) the module writes, in order."""
    log: list[tuple[str, str, str]] = []
    real_write = cgroups._write

    def write(folder: str, name: str, value: str) -> None:
        log.append((os.path.basename(folder), name, value))
        real_write(folder, name, value)

    monkeypatch.setattr(cgroups, "_write", write)
    return log


@pytest.fixture
def v2_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The v2 group delegated to a server (it holds no processes: the server runs in a
    subgroup) with every controller enabled for its children; mkdir below it makes the
    interface files of every controller, as the kernel would."""
    server = tmp_path / "server.service"
    server.mkdir()
    (server / "cgroup.subtree_control").write_text("memory pids cpu")
    real_mkdir = os.mkdir

    def mkdir(path: str | os.PathLike[str], mode: int = 0o777) -> None:
        real_mkdir(path, mode)
        if str(path).startswith(str(tmp_path)):
            files = {**V2_COMMON, **V2_FILES["memory"], **V2_FILES["pids"], **V2_FILES["cpu"]}
            for name, content in files.items():
                Path(path, name).write_text(content)

    monkeypatch.setattr(cgroups.os, "mkdir", mkdir)
    return server


def test_v2_groups_get_memory_without_swap_processes_and_a_cpu_weight_and_quota(
    v2_tree: Path, written: list[tuple[str, str, str]]
) -> None:
    parent = v2_tree / "posttrain-jobs-x"
    groups = JobGroups(
        [Placement(c, 2, str(parent)) for c in ("memory", "pids", "cpu")], "local-job"
    )
    groups.create(
        GroupLimits(memory_bytes=18 << 30, cpus=None, cpu_weight=100),
        GroupLimits(memory_bytes=16 << 30, processes=1024, cpus=2.0, cpu_weight=100),
    )
    job = parent / "local-job"

    def read(folder: Path, name: str) -> str:
        return (folder / name).read_text()

    assert read(parent, "memory.max") == str(18 << 30)
    assert read(parent, "memory.swap.max") == "max"  # swap is switched off per job
    assert read(parent, "cpu.max") == "max 100000"
    enabled = [value for folder, name, value in written if name == "cgroup.subtree_control"]
    assert enabled == ["+memory", "+pids", "+cpu"]  # for the jobs' groups below the parent
    assert read(job, "memory.max") == str(16 << 30)
    assert read(job, "memory.swap.max") == "0"
    assert read(job, "pids.max") == "1024"
    assert read(job, "cpu.weight") == "100"
    assert read(job, "cpu.max") == "200000 100000"
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (job / "memory.peak").write_text(str(16 << 30))
    (job / "pids.events").write_text("max 7\n")
    (job / "pids.peak").write_text("1024")
    usage = groups.usage()
    assert usage["oom_kills"] == 1 and usage["memory_peak_bytes"] == 16 << 30
    assert usage["fork_refusals"] == 7 and usage["processes_peak"] == 1024
    assert usage["memory_limit_bytes"] == 16 << 30


def test_a_v2_server_group_that_cannot_enable_a_controller_is_a_clear_error(
    tmp_path: Path,
) -> None:
    server = tmp_path / "session.scope"
    server.mkdir()
    (server / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    groups = JobGroups([Placement("memory", 2, str(server / "jobs"))], "local-job")
    with pytest.raises(CgroupError) as err:
        groups.create(GroupLimits(memory_bytes=1 << 30), GroupLimits(memory_bytes=1 << 29))
    assert "cgroup.subtree_control" in str(err.value)
    assert "a subgroup of a group delegated to it" in str(err.value)
    assert "Delegate=yes with DelegateSubgroup=server" in str(err.value)


@pytest.mark.parametrize(
    ("server", "above"),
    [
        # systemd's Delegate=yes with DelegateSubgroup=server: the service's group holds no
        # processes, the server runs in its subgroup, the jobs' parent goes beside the server.
        ("/system.slice/posttrain.service/server", "system.slice/posttrain.service"),
        ("/", ""),  # the root group may hold processes and still hand controllers down
    ],
)
def test_on_v2_the_jobs_parent_goes_beside_the_servers_group_in_the_delegated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, above: str
) -> None:
    mount = tmp_path / "cgroup"
    (mount / server.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    monkeypatch.setattr(cgroups, "_cgroup_mounts", lambda: {"": (str(mount), "/")})
    monkeypatch.setattr(cgroups, "_own_groups", lambda: {"": server})
    placements, missing = cgroups.find_placements("posttrain-jobs-x")
    assert missing == {}
    parent = os.path.join(os.path.normpath(mount / above), "posttrain-jobs-x")
    assert placements == [Placement(c, 2, parent) for c in ("memory", "pids", "cpu")]


def test_v1_cpu_weight_is_written_as_shares_and_the_quota_per_period(tmp_path: Path) -> None:
    parent = tmp_path / "cpu" / "jobs"
    parent.mkdir(parents=True)
    (parent / "cpu.cfs_period_us").write_text("50000")
    cgroups._write_limits(
        Placement("cpu", 1, str(parent)), str(parent), GroupLimits(cpus=1.5, cpu_weight=50), True
    )
    assert (parent / "cpu.shares").read_text() == "512"
    assert (parent / "cpu.cfs_quota_us").read_text() == "75000"


def test_this_processes_own_groups_are_found_from_proc(tmp_path: Path) -> None:
    placements, missing = cgroups.find_placements("posttrain-jobs-test")
    found = {p.controller: p for p in placements}
    # FACTS.md: memory, cpu and pids are cgroup v1 hierarchies on these machines, and cpuacct
    # one of its own (where it is mounted with cpu, the cpu placement counts CPU time), and
    # blkio (a job's disk throttled).
    assert set(found) | set(missing) == {"memory", "pids", "cpu", "cpuacct", "blkio"}
    for controller, placement in found.items():
        assert placement.version == 1
        assert placement.parent.startswith(f"/sys/fs/cgroup/{controller}/")
        assert placement.parent.endswith("/posttrain-jobs-test")
        assert os.path.isdir(os.path.dirname(placement.parent))
        assert not os.path.exists(placement.parent)  # found, not made


def test_jobs_starting_and_ending_at_once_share_the_parent_without_losing_a_group() -> None:
    # The last job to leave removes the parent while others are making it: each start must
    # still get its group (on this machine's real v1 hierarchies).
    import secrets
    import threading

    placements, _ = cgroups.find_placements(f"posttrain-jobs-race-{secrets.token_hex(4)}")
    assert placements
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        for n in range(25):
            groups = JobGroups(placements, f"job-{worker}-{n}")
            try:
                groups.create(
                    GroupLimits(memory_bytes=1 << 30, cpu_weight=100),
                    GroupLimits(memory_bytes=64 << 20, processes=16, cpus=1.0),
                )
                assert groups.exist()
            except BaseException as exc:
                errors.append(exc)
            finally:
                assert groups.remove(timeout_s=2) == []

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not any(os.path.exists(p.parent) for p in placements)
