"""The install phase: wheels only, no agent-chosen index, versions from dist-info, split phases."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from job_launcher import launcher
from job_launcher.builder import LauncherConfig

from .conftest import (
    JOB_PYTHON,
    RecordingServer,
    assert_ran,
    job_config,
    run_launcher,
    uv_binary,
    write_launcher,
)

PROBE_SCRIPT = """\
import json, pt_probe
print("REPORT " + json.dumps({"value": pt_probe.VALUE}))
open("outputs/ran", "w").write("yes")
"""
NEVER_RUNS = "open('outputs/ran', 'w').write('yes')\n"


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_wheel_is_installed_and_its_version_read_from_dist_info(run_job, installer: str) -> None:
    result = run_job(PROBE_SCRIPT, ["pt-probe==1.0"], installer=installer)
    assert_ran(result)
    installed = result.payloads[0]
    assert installed == {
        "stage": "installed",
        "packages": {"pt-probe": "1.0"},
        "installer": installer,
    }
    assert result.report() == {"value": "probe-1.0"}


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize(
    "package",
    ["pt-does-not-exist", "pt-probe==2.0", "pt-sdist-only"],
    ids=["nonexistent", "sdist-only-version", "sdist-only-package"],
)
def test_a_missing_or_sdist_only_package_stops_the_job_before_the_script(
    run_job, package: str, installer: str
) -> None:
    result = run_job(NEVER_RUNS, [package], installer=installer)
    assert result.final["stage"] == "install", result.stdout
    assert package.split("==")[0] in result.final["error"]
    assert result.returncode == launcher.NEVER_RAN_EXIT
    assert not (result.data_dir / "outputs" / "ran").exists()
    assert [p["stage"] for p in result.payloads] == ["install"]


def test_the_pip_fallback_ignores_this_machines_pip_configuration(run_job) -> None:
    # PIP_* variables and every pip.conf (global ones are read even under --isolated; this
    # machine's adds find-links and local indexes) must not reach a job's install.
    env = {
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "/nonexistent",
        "PIP_NO_INDEX": "0",
        "UV_INDEX_URL": "http://127.0.0.1:9/simple",
    }
    result = run_job(PROBE_SCRIPT, ["pt-probe==1.0"], installer="pip", env=env)
    assert_ran(result)
    assert "127.0.0.1:9" not in result.stdout
    seen = subprocess.run(
        [JOB_PYTHON, "-m", "pip", "--isolated", "config", "list"],
        env={**launcher.installer_env(), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert seen.stdout.strip() == ""
    if any(Path(p).exists() for p in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf")):
        # Control: without the launcher's environment, pip does read this machine's config.
        control = subprocess.run(
            [JOB_PYTHON, "-m", "pip", "--isolated", "config", "list"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert control.stdout.strip() != ""


def tampered(path: Path, packages: list[str]) -> None:
    """Rewrite an embedded package list, as a broken or compromised broker might."""
    text = path.read_text()
    match = re.search(r'^_EMBEDDED_CONFIG = "([A-Za-z0-9+/=]*)"$', text, re.M)
    assert match
    config = json.loads(base64.b64decode(match[1]))
    config["packages"] = packages
    encoded = base64.b64encode(json.dumps(config).encode()).decode()
    path.write_text(text.replace(match[1], encoded))


@pytest.mark.parametrize(
    "bad",
    [
        "pt-probe @ http://127.0.0.1:{port}/pt_probe-1.0-py3-none-any.whl",
        "--index-url=http://127.0.0.1:{port}/simple",
        "--extra-index-url=http://127.0.0.1:{port}/simple",
        "git+http://127.0.0.1:{port}/repo.git",
        "/tmp/pt_probe-1.0-py3-none-any.whl",
    ],
)
def test_the_launcher_re_checks_the_package_list_before_installing(
    job_root: Path,
    wheelhouse: Path,
    http_server: RecordingServer,
    bad: str,
) -> None:
    config = job_config(job_root, wheelhouse, no_index=False)
    path = write_launcher(job_root, NEVER_RUNS, [], config)
    tampered(path, ["pt-probe==1.0", bad.format(port=http_server.port)])
    result = run_launcher(job_root, path, config)
    assert result.final["stage"] == "packages"
    assert result.returncode == launcher.NEVER_RAN_EXIT
    assert http_server.requests == []
    assert not (job_root / "venv").exists()
    assert not (job_root / "data" / "outputs" / "ran").exists()


def test_uv_run_of_the_launcher_installs_nothing_from_the_agents_header(
    job_root: Path,
    wheelhouse: Path,
    http_server: RecordingServer,
) -> None:
    # `uv run launcher.py` (how Hugging Face Jobs starts it) reads the launcher's own PEP 723
    # header. The agent's header — with an index and a package — is base64 inside, so uv never
    # sees it: its index is never contacted, and its dependencies are the broker's merged list.
    url = f"http://127.0.0.1:{http_server.port}/simple"
    agent = (
        "# /// script\n"
        '# dependencies = ["pt-probe==1.0"]\n'
        "# [tool.uv]\n"
        f'# index-url = "{url}"\n'
        f'# extra-index-url = ["{url}"]\n'
        "# ///\n" + PROBE_SCRIPT
    )
    config = job_config(job_root, wheelhouse)
    path = write_launcher(job_root, agent, [], config)
    cache = job_root / "uv-cache"
    command = [
        uv_binary(),
        "run",
        "--no-config",
        "--offline",
        "--no-project",
        "--python",
        JOB_PYTHON,
        str(path),
    ]
    result = run_launcher(job_root, path, config, command=command, env={"UV_CACHE_DIR": str(cache)})
    assert_ran(result)
    assert result.payloads[0]["packages"] == {"pt-probe": "1.0"}
    assert result.report() == {"value": "probe-1.0"}
    assert http_server.requests == []


def test_install_and_run_phases_can_run_separately(job_root: Path, wheelhouse: Path) -> None:
    config = job_config(job_root, wheelhouse)
    path = write_launcher(job_root, PROBE_SCRIPT, ["pt-probe==1.0"], config)
    run_without_install = run_launcher(job_root, path, config, phase="run")
    assert run_without_install.final["stage"] == "prepare"
    installed = run_launcher(job_root, path, config, phase="install")
    assert installed.returncode == 0
    assert installed.payloads == [
        {"stage": "installed", "packages": {"pt-probe": "1.0"}, "installer": "uv"}
    ]
    assert not (job_root / "data" / "outputs" / "ran").exists()
    again = run_launcher(job_root, path, config, phase="install")
    assert again.final["stage"] == "venv"  # never reuses a venv
    ran = run_launcher(job_root, path, config, phase="run")
    assert_ran(ran)
    assert [p["stage"] for p in ran.payloads] == ["sandbox", "exit"]
    assert ran.report() == {"value": "probe-1.0"}


def test_phase_all_without_a_venv_dir_uses_and_removes_a_temporary_venv(
    job_root: Path, wheelhouse: Path
) -> None:
    config = job_config(job_root, wheelhouse, venv_dir=None)
    body = "import sys\nprint('REPORT ' + __import__('json').dumps({'prefix': sys.prefix}))\n"
    path = write_launcher(job_root, body, [], config)
    result = run_launcher(job_root, path, config)
    assert_ran(result)
    prefix = result.report()["prefix"]
    assert prefix.endswith("/venv") and not os.path.exists(prefix)


def test_a_temporary_venv_the_job_filled_with_a_1500_deep_tree_is_removed_after_the_exit_line(
    job_root: Path, wheelhouse: Path
) -> None:
    # Run as an ordinary user (the local backend without root), the job shares the launcher's
    # uid and may write into the temporary venv of --phase all. shutil.rmtree recursed on it
    # and raised RecursionError (which ignore_errors lets through) after the exit line.
    uid = 3_400_000 + os.getpid() % 1000
    for path in (job_root, job_root / "data"):
        os.chown(path, uid, uid)
    config = job_config(job_root, wheelhouse, venv_dir=None)
    body = """\
import json, os, sys
os.chdir(sys.prefix)
for _ in range(1500):
    os.mkdir("d")
    os.chdir("d")
open("bottom", "wb").write(b"x" * 65536)
os.mkdir("locked")
open("locked/inside", "w").write("x")
os.chmod("locked", 0)  # unreadable and unwritable: the removal must open it up
os.symlink("/", "root-link")  # never followed
print("REPORT " + json.dumps({"prefix": sys.prefix}))
"""
    path = write_launcher(job_root, body, [], config)
    os.chown(path, uid, uid)
    result = run_launcher(
        job_root,
        path,
        config,
        env={"UV_CACHE_DIR": str(job_root / "uv-cache"), "HOME": str(job_root)},
        user=uid,
        group=uid,
        extra_groups=[],
    )
    assert_ran(result)
    assert "RecursionError" not in result.stderr, result.stderr[-2000:]
    prefix = result.report()["prefix"]
    assert prefix.endswith("/venv")
    assert not os.path.exists(os.path.dirname(prefix))  # the temporary folder, all of it
    assert os.path.isdir("/usr")  # the link was not followed


def test_an_unprivileged_launcher_verifies_instead_of_switching_uid(
    job_root: Path, wheelhouse: Path
) -> None:
    # Where the local backend runs bwrap as an ordinary user, the launcher already runs as the
    # job's uid with no capabilities; it must verify that, install seccomp and run the script.
    uid = 3_200_000 + os.getpid() % 1000
    for path in (job_root, job_root / "data"):
        os.chown(path, uid, uid)
    config = LauncherConfig(
        python=JOB_PYTHON,
        data_dir=str(job_root / "data"),
        venv_dir=str(job_root / "venv"),
        find_links=(str(wheelhouse),),
        no_index=True,
        uv=uv_binary(),
    )
    body = """\
import json, os, socket
try:
    socket.socket(socket.AF_INET)
    inet = "opened"
except OSError as exc:
    inet = exc.errno
try:
    open(f"/proc/{os.getppid()}/environ", "rb").read()
    environ = "read"
except OSError as exc:
    environ = exc.errno
print("REPORT " + json.dumps({"uid": os.getuid(), "inet": inet, "parent_environ": environ}))
"""
    path = write_launcher(job_root, body, ["pt-probe==1.0"], config)
    os.chown(path, uid, uid)
    cache = job_root / "uv-cache"
    result = run_launcher(
        job_root,
        path,
        config,
        env={"UV_CACHE_DIR": str(cache), "HOME": str(job_root)},
        user=uid,
        group=uid,
        extra_groups=[],
    )
    assert_ran(result)
    # Same uid as the supervisor, yet its /proc files (environ: the nonce) stay closed.
    assert result.report() == {"uid": uid, "inet": 1, "parent_environ": 13}
    assert result.payloads[0]["packages"] == {"pt-probe": "1.0"}


def test_an_unprivileged_launcher_refuses_another_configured_uid(
    job_root: Path, wheelhouse: Path
) -> None:
    uid = 3_300_000 + os.getpid() % 1000
    for path in (job_root, job_root / "data"):
        os.chown(path, uid, uid)
    config = job_config(job_root, wheelhouse, uid=uid + 1, gid=uid + 1)
    path = write_launcher(job_root, NEVER_RUNS, [], config)
    os.chown(path, uid, uid)
    result = run_launcher(
        job_root,
        path,
        config,
        env={"UV_CACHE_DIR": str(job_root / "c"), "HOME": str(job_root)},
        user=uid,
        group=uid,
        extra_groups=[],
    )
    assert result.final["stage"] == "uid"
    assert not (job_root / "data" / "outputs" / "ran").exists()


# ---------------------------------------------------------------------------------------------
# Real training code under the filter
# ---------------------------------------------------------------------------------------------


def pip_find_links() -> list[str]:
    """Find-links folders from this machine's pip configuration (env, /etc/pip.conf, …)."""
    proc = subprocess.run(
        [JOB_PYTHON, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    folders: list[str] = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".find-links"):
            for item in value.strip().strip("'\"").split():
                if os.path.isdir(item) and item not in folders:
                    folders.append(item)
    return folders


def pip_index_urls() -> list[str]:
    proc = subprocess.run(
        [JOB_PYTHON, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    urls: list[str] = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(("index-url", "extra-index-url")):
            urls += value.strip().strip("'\"").split()
    return urls


TRAIN = """\
import json, os, torch
from torch.utils.data import DataLoader, TensorDataset
from safetensors_lite import save  # defined below the imports

torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
save(model.state_dict(), "outputs/model.safetensors")
print("REPORT " + json.dumps({"first": losses[0], "last": losses[-1], "steps": len(losses),
                              "workers": loader.num_workers}))
"""

# The safetensors format without the safetensors package: 8-byte header length, JSON, raw bytes.
SAFETENSORS_LITE = """\
import json, struct
def save(tensors, path):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        values = t.detach().flatten().tolist()
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
"""


@pytest.mark.timeout(600)
def test_torch_training_with_dataloader_workers_runs_under_the_filter(run_job) -> None:
    folders = [f for f in pip_find_links() if list(Path(f).glob("torch-2.13.0*.whl"))]
    if not folders:
        pytest.skip("no torch==2.13.0 wheel in this machine's pip find-links (pip config list)")
    local_indexes = [u for u in pip_index_urls() if u.startswith("file://")]
    script = TRAIN.replace(
        "from safetensors_lite import save  # defined below the imports\n", SAFETENSORS_LITE
    )
    result = run_job(
        script,
        ["torch==2.13.0"],
        find_links=tuple(folders),
        no_index=False,
        # torch's own dependencies: this machine's local package mirror if it has one, else PyPI.
        index_url=local_indexes[0] if local_indexes else None,
        timeout=500,
    )
    assert_ran(result)
    assert result.payloads[0]["packages"]["torch"].startswith("2.13.0")
    out = result.report()
    assert out["workers"] == 2 and out["steps"] == 24 and out["last"] < out["first"]
    blob = (result.data_dir / "outputs" / "model.safetensors").read_bytes()
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + length])
    assert set(header) == {"weight", "bias"} and header["weight"]["shape"] == [1, 8]
    shutil.rmtree(result.root / "venv", ignore_errors=True)


def test_an_evaluations_pin_reaches_uv_and_pip_cannot_honour_it(run_job) -> None:
    pinned = {"exclude_newer": "2026-11-30T00:00:00Z"}
    result = run_job(PROBE_SCRIPT, ["pt-probe==1.0"], installer="uv", **pinned)
    assert_ran(result)
    # It reaches uv: a date of the right shape that is no date makes uv itself refuse.
    wrong = run_job(NEVER_RUNS, ["pt-probe==1.0"], installer="uv", exclude_newer="2026-13-45")
    assert wrong.final["stage"] == "install" and "2026-13-45" in wrong.final["error"], wrong.final
    refused = run_job(NEVER_RUNS, ["pt-probe==1.0"], installer="pip", **pinned)
    needs_uv = "exclude-newer needs uv, which was not found"
    assert refused.final == {"stage": "venv", "error": needs_uv}


def test_the_script_gets_exactly_the_variables_pass_env_names(run_job) -> None:
    script = (
        "import json, os\n"
        "print('REPORT ' + json.dumps({k: v for k, v in os.environ.items()"
        " if k.startswith('PT_') or k == 'POSTTRAIN_NONCE'}))\n"
    )
    env = {"PT_PASSED": "yes", "PT_NOT_NAMED": "no"}
    agent = run_job(script, env=env, nonce="agent-nonce")
    assert_ran(agent)
    assert agent.report() == {}  # an agent job's script gets neither its nonce nor anything else
    passed = ("POSTTRAIN_NONCE", "PT_PASSED", "PT_ABSENT")
    evaluation = run_job(script, env=env, nonce="eval-nonce", pass_env=passed)
    assert_ran(evaluation)
    assert evaluation.report() == {"POSTTRAIN_NONCE": "eval-nonce", "PT_PASSED": "yes"}
