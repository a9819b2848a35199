"""torch.distributed inside an agent job on the local backend (slow: the job installs torch):
gloo's all_reduce across two processes, a two-process DDP training step that writes its
checkpoint to /data/outputs/, and DataLoader workers, all under the launcher's loopback-only TCP
policy (job_launcher/loopback.py) and bubblewrap's network namespace, as docs/backends.md tells
an agent to run them (MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo). Without the policy gloo
cannot start (tests/launcher/test_loopback.py shows the AF_UNIX-only filter refusing TCP)."""

from __future__ import annotations

import json

import pytest

from activities.backends.local.backend import LocalBackend
from activities.backends.local.jobfiles import ARTIFACT
from activities.jobs.launcher_report import read_launcher_lines
from tests.local.conftest import JOB_PYTHON, TEST_BWRAP, Jobs, write_model
from tests.local.test_arithmetic_format import ROOMY, torch_wheels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DISTRIBUTED = """
# /// script
# dependencies = ["torch==2.13.0"]
# ///
import json, os, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

def rank_main(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    summed = torch.full((4,), float(rank + 1))
    dist.all_reduce(summed)
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # each rank its own batch
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, num_workers=2)
    batches = 0
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()  # gradients all-reduced
        opt.step()
        batches += 1
    weights = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    if rank == 0:
        torch.save(model.module.state_dict(), "/data/outputs/ddp.pt")
    queue.put({"rank": rank, "summed": summed.tolist(), "batches": batches,
               "in_step": all(torch.equal(g, gathered[0]) for g in gathered)})
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    start = time.monotonic()
    mp.spawn(rank_main, args=(2, port, queue), nprocs=2)
    ranks = sorted((queue.get() for _ in range(2)), key=lambda r: r["rank"])
    print("REPORT " + json.dumps({"ranks": ranks, "loopback": os.environ["POSTTRAIN_LOOPBACK_TCP"],
                                  "seconds": round(time.monotonic() - start, 2)}), flush=True)
"""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    state = tmp_path_factory.mktemp("distributed") / "state" / "local"
    base = write_model(tmp_path_factory.mktemp("model"))
    backend = LocalBackend(
        state, job_python=JOB_PYTHON, limits=ROOMY, bwrap=TEST_BWRAP, find_links=torch_wheels()
    )
    return Jobs(backend, base)


@pytest.fixture(scope="module")
def ran(jobs: Jobs) -> tuple[dict, list[str], str]:
    job = jobs.submit(DISTRIBUTED, timeout_s=1200)
    ended = jobs.wait_end(job.ref, 1200)
    log = jobs.logs(job.ref, 5000)
    assert ended.state.value == "succeeded", log[-40:]
    return jobs.report(job.ref), log, job.ref


def test_gloo_all_reduce_runs_across_two_processes_in_an_agent_job(jobs: Jobs, ran) -> None:
    report, log, ref = ran
    launcher = read_launcher_lines(log, jobs.nonces[ref])
    assert launcher.loopback_tcp is True and report["loopback"] == "1"
    assert [r["summed"] for r in report["ranks"]] == [[3.0] * 4, [3.0] * 4]  # 1 + 2


def test_a_two_process_ddp_step_with_dataloader_workers_writes_its_checkpoint(
    jobs: Jobs, ran
) -> None:
    report, _log, ref = ran
    assert [r["batches"] for r in report["ranks"]] == [4, 4]  # DataLoader with 2 workers
    assert all(r["in_step"] for r in report["ranks"])  # DDP kept both replicas identical
    checkpoint = jobs.folder(ref) / ARTIFACT / "ddp.pt"  # collected from /data/outputs/
    assert checkpoint.stat().st_size > 0
    print(json.dumps({"ddp_seconds": report["seconds"]}))
