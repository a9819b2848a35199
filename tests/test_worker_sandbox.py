"""The worker's workflow sandbox loads no third-party import hook's package again per workflow.

Whatever in the process imports fastmcp installs beartype's import hook (py-key-value, via
fastmcp, turns it on for itself at import); `mcp_gateway/openenv_slim.py` keeps openenv's load
from doing so, and the worker's sandbox passes beartype through in case anything else does.
The hook loads every module the sandbox imports and imports beartype while doing so; unless
beartype is passed through, each new workflow instance imported the whole beartype package
again, from source, on the event loop the gateway shares (issue 18: 0.4-0.6 s per instance,
multi-second stalls, a burst of 50 resets that never got in). Checked in a fresh interpreter:
which files the sandbox reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent(
    """
    import asyncio, importlib._bootstrap_external as external, json, sys
    import temporalio.workflow
    import mcp_gateway.app  # what the all-in-one server imports beside its worker
    import fastmcp.server, key_value.aio  # what installs the hook when anything imports them
    from posttrain_server.worker import WORKFLOWS, workflow_runner

    assert "beartype.claw" in sys.modules and len(sys.path_hooks) > 2, sys.path_hooks
    read = []
    get_data = external.FileLoader.get_data

    def recording(self, path):
        read.append(path)
        return get_data(self, path)

    async def main():
        runner = workflow_runner()
        defns = [temporalio.workflow._Definition.must_from_class(w) for w in WORKFLOWS[:3]]
        for defn in defns:
            runner.prepare_workflow(defn)  # the first instance of each, as a worker starts
        external.FileLoader.get_data = recording
        for defn in defns:
            runner.prepare_workflow(defn)  # what every later workflow instance costs
        print(json.dumps(read))

    asyncio.run(main())
    """
)


def test_a_new_workflow_instance_beside_the_gateway_imports_no_beartype_module_again() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read: list[str] = json.loads(done.stdout.splitlines()[-1])
    assert read, "the probe saw no file read at all: it measures nothing"
    assert [path for path in read if "beartype" in path] == []


MODELS_PROBE = textwrap.dedent(
    """
    import asyncio, json
    import temporalio.workflow
    from pydantic._internal._model_construction import ModelMetaclass
    from posttrain_server.worker import WORKFLOWS, workflow_runner

    built = []
    new = ModelMetaclass.__new__

    def recording(mcs, name, bases, namespace, *args, **kwargs):
        built.append(f"{namespace.get('__module__')}.{name}")
        return new(mcs, name, bases, namespace, *args, **kwargs)

    async def main():
        runner = workflow_runner()
        defns = [temporalio.workflow._Definition.must_from_class(w) for w in WORKFLOWS]
        for defn in defns:
            runner.prepare_workflow(defn)  # the first instance of each, as a worker starts
        ModelMetaclass.__new__ = recording
        for defn in defns:
            runner.prepare_workflow(defn)  # what every later workflow instance costs
        print(json.dumps({"workflows": len(defns), "built": built}))

    asyncio.run(main())
    """
)


def test_a_new_workflow_instance_builds_no_pydantic_model() -> None:
    """The sandbox imports a workflow's module afresh for every instance; a pydantic model
    defined there was built again each time (a fifth of a workflow process's time at thousands
    of new jobs, bench/watch_scale.py). Models live in passed-through contract modules."""
    done = subprocess.run(
        [sys.executable, "-c", MODELS_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["workflows"] >= 8, seen
    assert seen["built"] == []
