"""What a local job can and cannot do inside its sandbox."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.local.conftest import Jobs, job_uid

REPORT = "import json\ndef report(**v):\n    print('REPORT ' + json.dumps(v), flush=True)\n"


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on the host's 127.0.0.1 that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(str(peer))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


NETWORK_PROBE = (
    REPORT
    + """
import socket
port = {port}
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    outcome = "connected"
except OSError as exc:
    outcome = exc.errno
interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
report(outcome=outcome, interfaces=interfaces)
"""
)


@pytest.mark.parametrize("role", ["agent", "dev", "grader"])
def test_no_job_can_reach_a_server_on_the_hosts_loopback(jobs: Jobs, host_server, role) -> None:
    # Evaluations run under the launcher too (DESIGN §6 item 4): the filter and the network
    # namespace stand for every role.
    port, accepted = host_server
    artifact = {} if role == "agent" else {"artifact_ref": jobs.run("print('ok')").ref}
    job = jobs.run(NETWORK_PROBE.format(port=port), role=role, **artifact)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    report = jobs.report(job.ref)
    assert report["interfaces"] == ["lo"]
    # The job's loopback is its network namespace's own: the launcher's supervisor finds no
    # listener of the job's there and answers as the kernel would (job_launcher/loopback.py).
    assert report["outcome"] == errno.ECONNREFUSED
    assert accepted == []


def test_inputs_venv_and_job_files_are_read_only_and_outputs_and_tmp_are_writable(
    jobs: Jobs, tmp_path
) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "train.jsonl").write_text('{"x": 1}\n')
    revision = jobs.backend.hub.add_dataset("test/data", dataset)
    script = (
        REPORT
        + """
import errno, os, sys
def try_write(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        return "written"
    except OSError as exc:
        return errno.errorcode[exc.errno]
report(
    uid=os.getuid(),
    base=sorted(os.listdir("/base_model")),
    dataset=open("/datasets/test/data/train.jsonl").read(),
    writes={p: try_write(p) for p in [
        "/base_model/config.json", "/base_model/new", "/datasets/test/data/new",
        os.path.join(sys.prefix, "new"), "/job/new", "/data/new", "/usr/new", "/etc/new",
        "/data/outputs/new", "/tmp/new", "/dev/shm/new",
    ]},
)
"""
    )
    job = jobs.run(script, datasets=[{"repo_id": "test/data", "revision": revision}])
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    report = jobs.report(job.ref)
    assert report["uid"] == job_uid(jobs, job.ref)
    assert report["base"] == ["config.json", "model.safetensors"]
    assert report["dataset"] == '{"x": 1}\n'
    writes = report["writes"]
    for path in ("/base_model/config.json", "/base_model/new", "/datasets/test/data/new"):
        assert writes[path] == "EROFS", (path, writes)
    for path in ("/job/new", "/usr/new"):
        assert writes[path] in ("EROFS", "EACCES"), (path, writes)
    assert writes["/data/new"] == "EACCES"  # /data is root's; outputs is the job's
    assert writes["/env/venv/new"] == "EROFS"  # sys.prefix: the job's venv
    written = {path for path, outcome in writes.items() if outcome == "written"}
    assert written == {"/data/outputs/new", "/tmp/new", "/dev/shm/new"}


def test_links_and_special_files_in_the_outputs_refuse_them_whole_and_are_never_followed(
    jobs: Jobs,
) -> None:
    secret = jobs.folder("x").parent.parent / "outside-secret"
    secret.write_text("host secret")
    script = f"""
    import os
    os.makedirs("/data/outputs/sub")
    with open("/data/outputs/model.safetensors", "wb") as fh:
        fh.write(b"weights")
    open("/data/outputs/sub/notes.txt", "w").write("notes")
    os.symlink("{secret}", "/data/outputs/host-link")
    os.symlink("/etc/passwd", "/data/outputs/etc-link")
    os.symlink("/", "/data/outputs/sub/root-link")
    os.mkfifo("/data/outputs/fifo")
    os.chmod("/data/outputs/sub", 0)
    """
    job = jobs.run(script)
    # Links and a fifo cannot be held by an artifact: the outputs are refused whole, by name.
    assert job.state.value == "failed", jobs.logs(job.ref)
    assert job.outputs_refused is not None and job.outputs_refused.type.value == "not_allowed"
    assert "it is a named pipe (fifo)" in job.message or "symbolic link" in job.message
    assert job.stored_bytes == 0
    assert list((jobs.folder(job.ref) / "artifact").iterdir()) == []
    assert secret.read_text() == "host secret"


def test_outputs_become_an_inert_artifact_even_from_a_folder_the_job_locked(jobs: Jobs) -> None:
    script = """
    import os
    os.makedirs("/data/outputs/sub")
    with open("/data/outputs/model.safetensors", "wb") as fh:
        fh.write(b"weights")
    open("/data/outputs/sub/notes.txt", "w").write("notes")
    os.chmod("/data/outputs/sub/notes.txt", 0o4777)
    os.chmod("/data/outputs/sub", 0)
    """
    job = jobs.run(script)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    assert job.stored_bytes == len(b"weights") + len(b"notes")
    artifact = jobs.folder(job.ref) / "artifact"
    found = sorted(str(p.relative_to(artifact)) for p in artifact.rglob("*"))
    assert found == ["model.safetensors", "sub", "sub/notes.txt"]
    assert all(not p.is_symlink() and p.stat().st_uid == 0 for p in artifact.rglob("*"))
    assert {p.stat().st_mode & 0o7777 for p in artifact.rglob("*")} == {0o755, 0o644}
    assert (artifact / "model.safetensors").read_bytes() == b"weights"
    assert "artifact: 2 files, 12 bytes" in "\n".join(jobs.logs(job.ref))
    # Mounted at /model for an evaluation, nothing points outside either.
    probe = (
        REPORT
        + """
import os
entries = []
for folder, dirs, names in os.walk("/model"):
    for name in dirs + names:
        path = os.path.join(folder, name)
        entries.append([path, os.path.islink(path)])
report(entries=sorted(entries))
"""
    )
    evaluation = jobs.run(probe, role="dev", artifact_ref=job.ref)
    assert evaluation.state.value == "succeeded", jobs.logs(evaluation.ref)
    assert jobs.report(evaluation.ref)["entries"] == [
        ["/model/model.safetensors", False],
        ["/model/sub", False],
        ["/model/sub/notes.txt", False],
    ]


def test_a_name_that_is_not_utf8_fails_the_job_with_its_reason_not_the_supervisor(
    jobs: Jobs,
) -> None:
    # Finding 1 of issue 41: this crashed collection (UnicodeEncodeError) halfway.
    script = """
    with open(b"/data/outputs/\\xff\\xfe-x", "w") as fh:
        fh.write("x")
    open("/data/outputs/zz-after", "w").write("after")
    """
    job = jobs.run(script)
    assert job.state.value == "failed", jobs.logs(job.ref)
    assert "supervisor failed" not in job.message
    assert "/data/outputs/\\xff\\xfe-x: its name is not UTF-8" in job.message
    assert job.outputs_refused is not None and job.outputs_refused.type.value == "not_allowed"
    assert list((jobs.folder(job.ref) / "artifact").iterdir()) == []


def test_a_sparse_output_takes_host_disk_only_for_its_data_and_counts_its_apparent_size(
    jobs: Jobs,
) -> None:
    # Finding 2 of issue 41: a sparse file was copied dense onto the host.
    script = """
    with open("/data/outputs/big.bin", "wb") as fh:
        fh.write(b"data")
        fh.truncate(3 << 20)
    """
    job = jobs.run(script)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    copy = jobs.folder(job.ref) / "artifact" / "big.bin"
    assert job.stored_bytes == copy.stat().st_size == 3 << 20
    assert copy.stat().st_blocks * 512 <= 64 << 10


def test_a_job_filling_its_outputs_is_stopped_at_the_artifact_cap(jobs: Jobs) -> None:
    script = """
    import itertools
    chunk = b"x" * (1 << 20)
    for n in itertools.count():  # many files: the per-file size limit alone would not stop it
        with open(f"/data/outputs/part-{n}", "wb") as fh:
            fh.write(chunk)
    """
    job = jobs.run(script)
    assert job.state.value == "failed"
    assert "over this job's artifact cap of 4194304 bytes; nothing was kept" in job.message
    assert job.outputs_refused is not None and job.outputs_refused.cap == "artifact"
    assert job.stored_bytes == 0
    assert list((jobs.folder(job.ref) / "artifact").iterdir()) == []


def test_a_job_filling_tmp_gets_enospc_at_its_disk_size_and_its_message_says_so(
    jobs: Jobs,
) -> None:
    script = """
    import itertools
    chunk = b"x" * (1 << 20)
    for n in itertools.count():
        with open(f"/tmp/part-{n}", "wb") as fh:
            fh.write(chunk)
    """
    job = jobs.run(script)
    assert job.state.value == "failed"
    assert job.message == (
        "it ran out of disk: /data, /tmp and its packages share 16 MiB (ENOSPC): "
        "the job exited with status 1; see its log"
    )
    assert "No space left on device" in "\n".join(jobs.logs(job.ref))
    assert not (jobs.folder(job.ref) / "fs").exists()  # its filesystem is gone with it


def test_no_file_can_grow_past_the_file_size_limit(jobs: Jobs) -> None:
    script = (
        REPORT
        + """
import errno, os
try:
    with open("/tmp/big", "wb") as fh:
        fh.write(b"x" * (32 << 20))
    outcome = "written"
except OSError as exc:
    outcome = errno.errorcode[exc.errno]
report(outcome=outcome, size=os.stat("/tmp/big").st_size)
"""
    )
    job = jobs.run(script)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    # Python ignores SIGXFSZ, so the write fails instead of killing the writer.
    assert jobs.report(job.ref) == {"outcome": "EFBIG", "size": 8 << 20}


def test_one_allocation_past_the_jobs_memory_limit_is_killed_and_the_job_fails_saying_so(
    jobs: Jobs,
) -> None:
    job = jobs.run("block = bytearray(2 << 30)\nprint('allocated')\n")
    assert job.state.value == "failed"
    assert job.message == (
        "it went over its memory limit of 1.0 GiB (cpu-basic on this machine) and the kernel "
        "killed 1 of its processes: the job exited with status 137; see its log"
    )
    assert "allocated" not in jobs.logs(job.ref)


def test_an_evaluation_is_handed_its_nonce_and_seed_by_the_launcher_and_an_agent_job_neither(
    jobs: Jobs,
) -> None:
    script = (
        REPORT
        + """
import os
report(uid=os.getuid(), env={k: v for k, v in os.environ.items() if k.startswith("POSTTRAIN")},
       offline=os.environ.get("HF_HUB_OFFLINE"), fds=sorted(os.listdir("/proc/self/fd")))
"""
    )
    seed = {"POSTTRAIN_HIDDEN_SPLIT_SEED": "seed-for-this-test"}
    agent = jobs.run(script)  # its nonce is in its launcher's environment, never in the script's
    grader = jobs.run(script, role="grader", artifact_ref=agent.ref, secrets=seed)
    reports = {"agent": jobs.report(agent.ref), "grader": jobs.report(grader.ref)}
    sandbox = {"POSTTRAIN_LOOPBACK_TCP": "1"}  # what the launcher's sandbox allows
    assert reports["agent"]["env"] == sandbox
    assert reports["grader"]["env"] == {
        "POSTTRAIN_NONCE": jobs.nonces[grader.ref],
        "POSTTRAIN_HIDDEN_SPLIT_SEED": "seed-for-this-test",
        **sandbox,
    }
    for report in reports.values():  # both under the launcher: uid dropped, fds closed, offline
        assert report["uid"] != 0 and report["offline"] == "1"
        assert report["fds"] == ["0", "1", "2", "3"]  # 3: the listing's own


def test_a_job_sees_only_the_cpu_and_numa_topology_of_sys_read_only(jobs: Jobs) -> None:
    """vLLM's CPU build runs lscpu, which reads them; nothing else of the host's /sys."""
    script = (
        REPORT
        + """
import os, subprocess
seen = sorted(os.path.join(top, name) for top, folders, _ in os.walk("/sys")
              for name in folders if top.count("/") < 4)
lscpu = subprocess.run(["lscpu", "--json", "--extended=CPU,CORE,NODE", "--online"],
                       capture_output=True, text=True)
try:
    open("/sys/devices/system/cpu/online", "w").close()
    write = "written"
except OSError as exc:
    write = exc.errno
report(seen=seen, lscpu=lscpu.returncode, write=write)
"""
    )
    job = jobs.run(script)
    assert job.state.value == "succeeded", jobs.logs(job.ref)
    report = jobs.report(job.ref)
    assert report["seen"] == [
        "/sys/devices",
        "/sys/devices/system",
        "/sys/devices/system/cpu",
        "/sys/devices/system/node",
    ]
    assert report["lscpu"] == 0
    assert report["write"] in (errno.EROFS, errno.EACCES)
