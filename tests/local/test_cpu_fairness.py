"""One episode's CPU hog leaves another episode's dev evaluation, and the server's own work,
within 3x of their time alone (issue 17): the jobs' cpu groups weigh each job as much as any
other. Apart from tests/local/test_containment.py so that the suite's workers can run its
half minute beside that file's other tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from pathlib import Path

import pytest

from activities.backends.local.cgroups import JobGroups
from tests.local.conftest import Jobs, logged, now, trained_t0_artifact
from tests.waiting import wait_until

HOG = """
import os, time
for _ in range(15):  # 16 busy processes: as many as the issue's hog could start, and more
    if os.fork() == 0:
        os.setsid()  # a session each: with autogroup, each session weighs as much as a user's
        break
else:
    print("spinning", flush=True)
deadline = time.time() + 600
while time.time() < deadline:
    pass
"""
PAIRS = 7  # alone/busy pairs; the promise is on the median of their ratios
# Dev evaluations per measurement. One of t0_artifact lasts about 0.2 s, as short as a burst of
# another test's work on this shared machine: in CI, 3 of 5 single-evaluation pairs once landed
# on such bursts (3.1x to 3.9x, the other two 1.5x), so each measurement is the sum of three.
EVALUATIONS = 3
# After SIGCONT the hog's processes run with the scheduler's credit for having slept and its
# groups' load averages still decayed; a steady hog, which is what the promise is about, is
# measured once that has passed (a few of the load average's 32 ms half-lives).
SETTLE_S = 0.2
SERVER_WORK_S = 0.3  # the server-work probe's length alone (see `server_work`)


class PausedHog:
    """A running job's processes, stopped (SIGSTOP) and resumed (SIGCONT) as a whole, so that
    "alone" and "beside the hog" can be measured in turn under the same outside load."""

    def __init__(self, jobs: Jobs, ref: str) -> None:
        spec = json.loads((jobs.folder(ref) / "job.json").read_text())
        self.pids = JobGroups.from_spec(spec["cgroups"], ref).pids()
        assert len(self.pids) >= 16, self.pids  # the hog's 16 processes, in the job's groups

    def pause(self) -> None:
        self._signal(signal.SIGSTOP, stopped=True)

    def resume(self) -> None:
        self._signal(signal.SIGCONT, stopped=False)

    def _signal(self, signum: int, stopped: bool) -> None:
        for pid in self.pids:
            os.kill(pid, signum)
        wait_until(
            lambda: all(_is_stopped(pid) == stopped for pid in self.pids),
            10,
            f"the hog's processes stopped={stopped}",
        )


def _is_stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"  # the state field follows the command's ")"


def load_average() -> str:
    """The 1-minute load and the runnable/all tasks now (/proc/loadavg)."""
    fields = Path("/proc/loadavg").read_text().split()
    return f"load {fields[0]}, runnable {fields[3]}"


# A measurement that loads the machine on purpose (a hog spinning for 30-45 s beside 21
# evaluations): in the slow set, where fewer tests share the cores with it.
@pytest.mark.slow
def test_a_cpu_hog_leaves_another_episodes_dev_evaluation_within_3x_its_time_alone(
    jobs: Jobs,
) -> None:
    """The promise (issue 17): beside another episode's CPU hog, a dev evaluation takes at most
    3x its time alone, and the server's own work too.

    What holds it: each job's cpu group weighs as much as any other (the hog's 16 processes
    together as much as the evaluation), and all jobs' parent group as much as one busy process
    of the server. On 2 cores the hog's quota (cpu-basic: 2 vCPUs) is the whole machine and
    never throttles it: weights alone do the work. With the outside load held constant, equal
    weights mean about 1.5x (an idle machine) to 2x (a loaded one) for the evaluation's CPU-bound
    part, and about 1.5x for a single-threaded server beside the jobs' parent.

    How it measures: other engineers' tests share this machine, and their load changes within
    seconds, so a baseline taken before the hog started compares two different machines. Each
    pair measures alone (the hog's processes stopped with SIGSTOP) and beside the hog (SIGCONT)
    back to back, in ABBA order across pairs (alone-busy, busy-alone, ...) so that a load that
    drifts in one direction cancels out; each measurement is EVALUATIONS evaluations in a row,
    the median of the per-pair ratios must be <= 3, and every pair is printed with the load
    average. Measured beside a whole second test suite on 2 cores (load 7 to 10): medians
    1.9x to 2.55x over 8 runs; single-evaluation pairs gave 2.25x to 2.8x there, and 3.14x once
    in CI."""
    model, agent, evaluator = trained_t0_artifact(jobs)

    def dev_evaluate() -> float:
        """EVALUATIONS dev evaluations one after another, as an agent's calls come: their time."""
        started = time.monotonic()
        for _ in range(EVALUATIONS):
            job = jobs.run(
                evaluator, role="dev", artifact_ref=agent.ref, base_model=model, timeout=120
            )
            assert job.state.value == "succeeded", jobs.logs(job.ref)
        return time.monotonic() - started

    def server_work(additions: int) -> float:
        """What the server does between jobs: plain Python in the test's own process, which sits
        outside the jobs' parent group as the server does. Its wall time is its CPU time
        divided by the share of a CPU the scheduler gives it. The slice lasts SERVER_WORK_S
        alone: at 0.07 s (3 million additions) it spanned only a few scheduler periods, and
        one preemption by a burst of someone else's work moved it by 50 % or more."""
        started = time.monotonic()
        total = 0
        for n in range(additions):
            total += n
        return time.monotonic() - started

    hog = jobs.submit(HOG, episode_id="ep-hog", timeout_s=300)
    wait_until(lambda: logged(jobs, hog.ref, "spinning"), 20, "the hog to spin")
    paused = PausedHog(jobs, hog.ref)
    pairs: list[tuple[str, float, float, float, float]] = []
    try:
        paused.pause()
        additions = round(3_000_000 * SERVER_WORK_S / min(server_work(3_000_000) for _ in range(3)))
        hog_running = False
        for index in range(PAIRS):
            measured: dict[bool, tuple[float, float]] = {}
            load = ""
            for busy in (False, True) if index % 2 == 0 else (True, False):
                if busy and not hog_running:
                    paused.resume()
                    time.sleep(SETTLE_S)
                elif hog_running and not busy:
                    paused.pause()
                    load = load_average()  # the outside load, without the hog's 16 runnable
                hog_running = busy
                load = load or load_average()
                measured[busy] = dev_evaluate(), server_work(additions)
            (alone, server_alone), (beside, server_beside) = measured[False], measured[True]
            pairs.append((load, alone, beside, server_alone, server_beside))
    finally:
        paused.resume()
        hog_usage = asyncio.run(jobs.backend.cancel(hog.ref, now()))
    assert hog_usage.state.value == "cancelled"
    eval_ratio = statistics.median(beside / alone for _, alone, beside, _, _ in pairs)
    server_ratio = statistics.median(busy / alone for _, _, _, alone, busy in pairs)
    figures = "\n".join(
        f"pair {n} ({load}): {EVALUATIONS} dev_evaluate alone {alone:.2f} s, beside the hog "
        f"{beside:.2f} s "
        f"({beside / alone:.2f}x); server work alone {s_alone:.3f} s, beside the hog "
        f"{s_busy:.3f} s ({s_busy / s_alone:.2f}x)"
        for n, (load, alone, beside, s_alone, s_busy) in enumerate(pairs, 1)
    ) + (f"\nmedians: dev_evaluate {eval_ratio:.2f}x, server work {server_ratio:.2f}x")
    print(figures)
    assert eval_ratio <= 3, figures
    assert server_ratio <= 3, figures
