"""`posttrain-env demo [--task ID] [--script PATH]`: one whole episode on this machine, no token
needed (`t0_artifact` and its reference solution unless told otherwise).

It starts the embedded Temporal dev server, a worker on the **local** backend (forced, whatever
`POSTTRAIN_BACKEND` says, so the demo can never spend money) and the gateway, all on free ports
of 127.0.0.1, then plays the specification's client flow with `PostTrainEnv`, submitting the
task's (its family's) reference solution or the given script: it prints the prompt, the job's
states as they change, the dev score, the reward, the contamination check's counts (when the
task has one) and the spend. State lives in `<POSTTRAIN_STATE_DIR>/demo`, so later runs reuse the
generated base model and the uv cache.

A first command should start fast: this module imports only the settings at load time; the
gateway, the worker and the client (several seconds of imports on a small machine) are loaded
in a thread while the embedded Temporal server boots in its own process, and openenv without
its Gradio web UI (`mcp_gateway.openenv_slim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from posttrain_common.keys import ServerKey
from posttrain_common.settings import Settings
from tasks.registry import TASKS_DIR

if TYPE_CHECKING:
    from temporalio.client import Client

    from activities.backends.interface import JobsBackend

TASK_ID = "t0_artifact"
REFERENCE_SOLUTION = TASKS_DIR / TASK_ID / "reference_solution.py"


@dataclass
class DemoRun:
    """What the demo saw; `marks` are wall-clock times (`time.time()`) of its steps, which
    bench/episode_wall.py lays beside the local jobs' own phase times."""

    reward: float | None = None
    dev_score: float | None = None
    spend: dict[str, Any] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)
    episode_id: str = ""
    job_id: str = ""
    # `episode_end.contamination` (the counts the agent sees), when the task checks for it.
    contamination: dict[str, Any] | None = None
    marks: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Stack:
    base_url: str  # the gateway's
    client: Client  # of the embedded Temporal


# How long the demo waits, after the reward, for the episode's workflow to close: its last
# activity (the audit record) runs after the reward is answered: about a second.
EPISODE_CLOSE_WAIT_S = 60.0


@contextlib.asynccontextmanager
async def running_stack(settings: Settings) -> AsyncIterator[Stack]:
    """Embedded Temporal, a local-backend worker and the gateway."""
    from posttrain_server.temporal.dev_server import EmbeddedTemporal, EmbeddedTemporalConfig

    temporal = EmbeddedTemporal(
        EmbeddedTemporalConfig(
            state_dir=settings.state_dir, port=free_port(), ui_port=free_port(), headless=True
        )
    )
    booting = asyncio.create_task(temporal.start())
    try:
        # Temporal boots in its own process meanwhile: the imports (and the local hub's first
        # set-up) use the other core.
        # The demo's own deployment, on its own Temporal: the key of its own state dir.
        key = await asyncio.to_thread(ServerKey.load_or_create, settings.server_key_path)
        backend = await asyncio.to_thread(load_and_make_backend, settings, key)
        await booting
        import uvicorn

        from mcp_gateway.app import create_app, uvicorn_config
        from posttrain_server.temporal.client import connect
        from posttrain_server.worker import build_worker

        settings = settings.model_copy(update={"temporal_address": temporal.config.address})
        client = await connect(settings)
        async with build_worker(client, settings, backend, key=key):
            port = free_port()
            app = create_app(settings, client, key)
            server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port))
            serving = asyncio.create_task(server.serve())
            while not server.started:
                if serving.done():
                    serving.result()  # raises what stopped it
                    raise RuntimeError("the gateway stopped while starting")
                await asyncio.sleep(0.02)
            try:
                yield Stack(f"http://127.0.0.1:{port}", client)
            finally:
                server.should_exit = True
                await serving
    finally:
        if not booting.done():
            booting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await booting
        # The episode is over and the worker stopped: the server's clean shutdown (about 2 s)
        # need not hold the command up.
        temporal.stop(wait=False)


# What the demo runs, beside what it imports at load time; loaded while Temporal boots.
STACK_MODULES = (
    "uvicorn",
    "mcp_gateway.app",
    "posttrain_server.temporal.client",
    "posttrain_server.wiring",
    "posttrain_server.worker",
    "posttrain_env.client",
)


def load_modules() -> None:
    """Import the gateway, the worker and the client; openenv first, without its web UI."""
    from mcp_gateway import openenv_slim

    openenv_slim.load()
    for name in STACK_MODULES:
        importlib.import_module(name)


def load_and_make_backend(settings: Settings, key: ServerKey) -> JobsBackend:
    load_modules()
    from posttrain_server.wiring import make_backend

    return make_backend(settings, key)


@dataclass(frozen=True)
class DemoPlan:
    """What the demo plays: a task, the training script it submits (the task's reference
    solution unless given), on the task's first flavor, under the task's longest timeout."""

    task_id: str = TASK_ID
    script: str = ""
    flavor: str = "cpu-basic"
    timeout_minutes: int = 5


class DemoInputError(ValueError):
    """A task or script the demo cannot play (the message says why)."""


def demo_plan(task_id: str = TASK_ID, script: Path | None = None) -> DemoPlan:
    """The plan for `task_id`; `script` replaces its reference solution. Raises DemoInputError
    for an unknown task, a task without a reference solution, or a script it cannot read."""
    from tasks.registry import TaskSpecError, load_task

    try:
        spec = load_task(task_id)
    except TaskSpecError as err:
        raise DemoInputError(str(err)) from None
    if script is not None and not script.is_file():
        raise DemoInputError(f"--script {script}: no such file")
    path = script or TASKS_DIR / (spec.family or spec.id) / "reference_solution.py"
    if not path.is_file():
        raise DemoInputError(
            f"task {task_id!r} has no reference solution ({path} does not exist): "
            "give the training script with --script"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DemoInputError(f"cannot read the script {path}: {err}") from None
    # t0_artifact's reference solution writes its artifact in seconds; a training script gets
    # the task's longest timeout.
    timeout = 5 if task_id == TASK_ID and script is None else spec.max_timeout_minutes
    return DemoPlan(task_id, text, spec.flavors[0], timeout)


async def play(
    base_url: str, out: TextIO, mark: Callable[[str], None], plan: DemoPlan | None = None
) -> DemoRun:
    """The specification's client flow, with the plan's script as the training script."""
    load_modules()  # done already when the stack started here; nothing then
    from openenv.core.env_server.mcp_types import CallToolAction

    from posttrain_env.client import PostTrainEnv

    plan = plan or DemoPlan(script=REFERENCE_SOLUTION.read_text())
    run = DemoRun()
    async with PostTrainEnv(base_url=base_url, message_timeout_s=3600) as env:
        result = await env.reset(task_id=plan.task_id)
        meta = result.observation.metadata
        run.episode_id = meta["episode_id"]
        print(f"episode {run.episode_id} of task {plan.task_id}; the prompt:\n", file=out)
        print(meta["prompt"].strip(), "\n", file=out)
        mark("reset")
        result = await env.step(
            CallToolAction(
                tool_name="jobs_submit",
                arguments={
                    "script": plan.script,
                    "flavor": plan.flavor,
                    "timeout_minutes": plan.timeout_minutes,
                },
            )
        )
        job = result.observation.result["data"]
        assert "error" not in job, job
        run.job_id = job["job_id"]
        mark("submitted")
        print(f"job {run.job_id}: {job['state']} (reserved ${job['reserved_usd']:.6f})", file=out)
        status = job["state"]
        while status in {"queued", "running"}:
            result = await env.step(
                CallToolAction(
                    tool_name="jobs_wait", arguments={"job_id": run.job_id, "timeout_s": 300}
                )
            )
            view = result.observation.result["data"]
            if view["state"] != status:
                mark(view["state"])
                print(f"job {run.job_id}: {view['state']}", file=out)
            status = view["state"]
            run.states.append(status)
        assert status == "succeeded", result.observation.result
        evaluation = await env.step(
            CallToolAction(tool_name="dev_evaluate", arguments={"job_id": run.job_id})
        )
        mark("dev_evaluated")
        dev = evaluation.observation.result["data"]
        assert "error" not in dev, dev
        run.dev_score = dev["score"]
        print(f"dev score: {run.dev_score} (evaluation cost ${dev['cost_usd']:.6f})", file=out)
        final = await env.step(CallToolAction(tool_name="submit", arguments={"job_id": run.job_id}))
        mark("graded")
        run.reward = final.reward
        run.spend = final.observation.metadata["service_spend"]
        end = final.observation.metadata.get("episode_end") or {}
        run.contamination = end.get("contamination")
        print(f"done: {final.done}, reward: {final.reward}", file=out)
        if run.contamination is not None:
            print(f"contamination check: {json.dumps(run.contamination)}", file=out)
        settled = run.spend["settled"]
        print(
            f"spend: ${settled['usd']:.6f} settled for {settled['jobs']} job(s) and "
            f"{settled['calls']} dev evaluation(s); final: {run.spend['final']} "
            "(local prices, simulated)",
            file=out,
        )
    return run


async def demo(
    settings: Settings, out: TextIO = sys.stdout, plan: DemoPlan | None = None
) -> DemoRun:
    marks: dict[str, float] = {"start": time.time()}

    def mark(name: str) -> None:
        marks[name] = time.time()

    async with running_stack(settings) as stack:
        mark("stack_ready")
        print(
            f"Temporal, a worker (local backend) and the gateway are up at {stack.base_url}",
            file=out,
        )
        run = await play(stack.base_url, out, mark, plan)
        await episode_closed(stack.client, run.episode_id, out)
        mark("closed")
    run.marks = marks
    return run


async def episode_closed(client: Client, episode_id: str, out: TextIO) -> None:
    """Wait for the episode's workflow to close, so that the worker stops only once the
    episode's audit record is written (a later run would otherwise finish it)."""
    if not episode_id:
        return
    from workflows.ids import episode_workflow_id

    handle = client.get_workflow_handle(episode_workflow_id(episode_id))
    try:
        async with asyncio.timeout(EPISODE_CLOSE_WAIT_S):
            await handle.result()
    except TimeoutError:
        print(
            f"the episode's workflow was still open after {EPISODE_CLOSE_WAIT_S:.0f} s; "
            "the next run of the demo finishes it",
            file=out,
        )


def demo_settings() -> Settings:
    """The environment's settings, with the local backend forced and a state dir of its own."""
    settings = Settings()
    return settings.model_copy(
        update={
            "backend": "local",
            "state_dir": settings.state_dir / "demo",
            "temporal_address": "",  # always the demo's own embedded server
        }
    )


def main(task_id: str = TASK_ID, script: Path | None = None) -> int:
    """0 when the episode ended with a reward, 1 when it did not, 2 for bad input."""
    try:
        plan = demo_plan(task_id, script)
    except DemoInputError as err:
        print(f"posttrain-env demo: {err}", file=sys.stderr)
        return 2
    run = asyncio.run(demo(demo_settings(), plan=plan))
    return 0 if run.reward is not None else 1
