"""The layout keeps its shape (DESIGN §10): a ground and a roof, activities that never reach up
to workflows, a gateway that loads no backend, and contracts that agree with their code."""

from __future__ import annotations

import ast
import inspect
import os
import pkgutil
import socket
import subprocess
import sys
from pathlib import Path

from temporalio import activity

import activities
from activities.backends.local import plan
from activities.backends.registry import BACKENDS
from activities.campaigns.activities import CampaignActivities
from activities.campaigns.agent_turns import AgentTurnActivities
from activities.contamination.activities import ContaminationActivities
from activities.episodes.activities import EpisodeActivities
from activities.jobs.activities import JobsActivities
from activities.jobs.reaper import ReaperActivities
from activities.records.audit import AuditActivities
from activities.records.retention import RetentionActivities
from job_launcher import launcher
from posttrain_common.contracts.activities import (
    AgentsApi,
    AuditApi,
    CampaignsApi,
    ContaminationApi,
    EpisodesApi,
    JobsApi,
    ReaperApi,
    RetentionApi,
)
from posttrain_env.errors import GatewayCode
from posttrain_env.tools import TOOLS
from workflows.episode.tools import HANDLED_TOOLS

ROOT = Path(__file__).resolve().parents[1]
# Who may import whom: a module imports only from its own layer or below (README, "How it is
# built"). The client is a distribution of its own and imports nothing of the server.
LAYERS = {
    "posttrain_env": 0,  # the client: what an agent or a trainer installs
    "posttrain_common": 1,  # the server's ground: contracts between layers, key, settings
    "job_launcher": 2,
    "tasks": 2,
    "activities": 3,
    "workflows": 4,
    "mcp_gateway": 5,
    "posttrain_server": 6,  # the roof: the only place that imports every layer
}
PACKAGES = tuple(LAYERS)
# One folder per feature in each layer that has features; shared modules sit at the layer's
# root and belong to no feature.
FEATURE_FOLDERS = {
    "workflows": {"episode", "job", "campaign", "operations"},
    "activities": {"backends", "jobs", "episodes", "campaigns", "contamination", "records"},
}
SHARED_MODULES = {
    "workflows": {"__init__", "ids", "policies", "waiting", "history", "cancellation"},
    "activities": {"__init__", "heartbeat", "ports"},
}


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module that `module` (at `path`) imports: at module level or inside a
    function, absolute or relative (`from . import x`), or by a literal
    `importlib.import_module("...")` (a name computed at run time cannot be seen)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call):
            names = literal_import(node, package)
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def literal_import(call: ast.Call, package: str) -> list[str]:
    """The module an `import_module("...")` or `__import__("...")` call names, if literal."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called not in ("import_module", "__import__") or not call.args:
        return []
    first = call.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return []
    name = first.value
    if name.startswith("."):  # relative to `package=`, or to the caller's own package
        anchor = package
        for keyword in call.keywords:
            if keyword.arg == "package" and isinstance(keyword.value, ast.Constant):
                anchor = str(keyword.value.value)
        level = len(name) - len(name.lstrip("."))
        parts = anchor.split(".")
        name = ".".join([*parts[: len(parts) - level + 1], name.lstrip(".")]).rstrip(".")
    return [name]


def layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    modules = project_modules()
    upward = [
        f"{module} -> {imported}"
        for module, path in modules.items()
        for imported in imports_of(module, path, modules)
        if layer(imported) > layer(module)
    ]
    assert upward == []


def test_the_import_graph_has_no_circle() -> None:
    modules = project_modules()
    graph = {m: imports_of(m, path, modules) - {m} for m, path in modules.items()}
    done: set[str] = set()
    for start in graph:  # depth-first, iterative; a grey module met again closes a circle
        stack, grey = [(start, iter(sorted(graph[start])))], {start}
        while stack:
            module, children = stack[-1]
            child = next(children, None)
            if child is None:
                grey.discard(module)
                done.add(module)
                stack.pop()
            elif child in grey:
                circle = [m for m, _ in stack][[m for m, _ in stack].index(child) :]
                raise AssertionError(f"import circle: {' -> '.join([*circle, child])}")
            elif child not in done:
                grey.add(child)
                stack.append((child, iter(sorted(graph[child]))))


def test_the_import_graph_sees_relative_and_literal_dynamic_imports(tmp_path: Path) -> None:
    """What the two graph tests rely on: no kind of import goes unseen."""
    files = {
        "ground/__init__.py": "",
        "ground/types.py": "",
        "upper/__init__.py": "from . import sibling\n",
        "upper/sibling.py": "",
        "upper/deep/__init__.py": "",
        "upper/deep/leaf.py": (
            "import importlib\n"
            "from ..sibling import x\n"
            "from .. import other\n"
            "def late():\n"
            "    importlib.import_module('ground.types')\n"
            "    importlib.import_module('.mod', package='ground')\n"
            "    __import__('ground')\n"
            "    importlib.import_module(computed_name)\n"
        ),
        "upper/other.py": "",
        "ground/mod.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = {
        ".".join(Path(name).with_suffix("").parts).removesuffix(".__init__"): tmp_path / name
        for name in files
    }
    leaf = imports_of("upper.deep.leaf", modules["upper.deep.leaf"], modules)
    assert leaf == {"upper.sibling", "upper", "upper.other", "ground.types", "ground.mod", "ground"}
    assert imports_of("upper", modules["upper"], modules) == {"upper", "upper.sibling"}


def test_importing_every_activity_module_loads_no_workflow_module() -> None:
    names = [
        info.name
        for info in pkgutil.walk_packages(activities.__path__, "activities.")
        if not info.name.endswith("job_runner")  # the supervisor's `__main__`-style module
    ]
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'workflows'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert len(names) > 15
    assert done.stdout.strip() == "[]"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_gateway_without_a_worker_loads_no_activity_or_backend_code(tmp_path: Path) -> None:
    """`server --no-worker` serves (its /health answers 200: the probe fails otherwise), and of
    `activities/` it loads only the backends' declarations (the registry, to read whether the
    chosen backend spends money): no activity, no backend's code."""
    probe = (
        "import asyncio, os, sys, httpx\n"
        "from posttrain_server.server import serve\n"
        "async def main():\n"
        "    server = asyncio.create_task(serve('127.0.0.1', PORT, with_worker=False))\n"
        "    healthy = False\n"
        "    for _ in range(300):\n"
        "        await asyncio.sleep(0.1)\n"
        "        if server.done():\n"
        "            server.result()\n"
        "        try:\n"
        "            async with httpx.AsyncClient() as http:\n"
        "                health = await http.get('http://127.0.0.1:PORT/health')\n"
        "            if health.status_code == 200:\n"
        "                healthy = True\n"
        "                break\n"
        "        except httpx.TransportError:\n"
        "            pass\n"
        "    if not healthy:\n"
        "        print('the gateway never answered /health with 200', file=sys.stderr)\n"
        "        sys.stderr.flush()\n"
        "        os._exit(3)\n"
        "    print(sorted(m for m in sys.modules if m.split('.')[0] == 'activities'))\n"
        "    sys.stdout.flush()\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    ).replace("PORT", str(free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    env.pop("HF_TOKEN", None)
    env.update(
        {
            "POSTTRAIN_STATE_DIR": str(tmp_path),
            "POSTTRAIN_TEMPORAL_PORT": str(free_port()),
            "POSTTRAIN_TEMPORAL_UI_PORT": str(free_port()),
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    declarations = {
        "activities",
        "activities.backends",
        "activities.backends.interface",
        "activities.backends.registry",
        "activities.backends.storage",  # the interface names what a backend's storage is
        *(f"activities.backends.{name}" for name in BACKENDS),
        *(f"activities.backends.{name}.info" for name in BACKENDS),
    }
    loaded = set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert "activities.backends.registry" in loaded
    assert loaded <= declarations, sorted(loaded - declarations)


def test_every_activity_interface_method_is_implemented_as_an_activity() -> None:
    for interface, implementation in (
        (JobsApi, JobsActivities),
        (EpisodesApi, EpisodeActivities),
        (ReaperApi, ReaperActivities),
        (AuditApi, AuditActivities),
        (RetentionApi, RetentionActivities),
        (ContaminationApi, ContaminationActivities),
        (CampaignsApi, CampaignActivities),
        (AgentsApi, AgentTurnActivities),
    ):
        declared = {
            name for name, fn in vars(interface).items() if activity._Definition.from_callable(fn)
        }
        assert declared, interface
        for name in declared:
            implemented = vars(implementation).get(name)
            assert implemented is not None, f"{implementation.__name__} lacks {name}"
            definition = activity._Definition.from_callable(implemented)
            assert definition is not None and definition.name == name
            assert inspect.signature(implemented) == inspect.signature(vars(interface)[name])


def test_every_tool_of_the_registry_has_one_handler() -> None:
    assert TOOLS and set(TOOLS) == HANDLED_TOOLS


def test_the_local_install_phase_passes_exactly_what_the_launcher_keeps() -> None:
    planned = {*plan.INSTALLER_FIXED_ENV, *plan.INSTALLER_PASS_THROUGH}
    assert planned == set(launcher.INSTALLER_ENV)


def test_the_clients_retryable_code_is_the_gateways_transient_one() -> None:
    from posttrain_env.client import RETRYABLE_CODES

    assert RETRYABLE_CODES == {GatewayCode.unavailable.value}


def _feature_of(module: str) -> str | None:
    """The feature folder a module of a featured layer sits in, or None at the layer's root."""
    parts = module.split(".")
    return (
        parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / Path(*parts)).is_dir()) else None
    )


def test_every_workflow_and_activity_module_sits_in_a_feature_folder_or_is_shared() -> None:
    misplaced = []
    for module in project_modules():
        top, _, rest = module.partition(".")
        if top not in FEATURE_FOLDERS:
            continue
        feature = _feature_of(module)
        if feature is None:
            if (rest or "__init__") not in SHARED_MODULES[top]:
                misplaced.append(module)
        elif feature not in FEATURE_FOLDERS[top]:
            misplaced.append(module)
    assert misplaced == []
    for top, features in FEATURE_FOLDERS.items():
        assert {p.name for p in (ROOT / top).iterdir() if (p / "__init__.py").exists()} == features


def _decorated_classes(path: Path, decorator: str) -> list[str]:
    """Classes in `path` decorated `@workflow.defn`, or with a method decorated `@activity.defn`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        targets = (
            [node]
            if decorator == "workflow"
            else [
                item
                for item in node.body
                if isinstance(item, ast.AsyncFunctionDef | ast.FunctionDef)
            ]
        )
        for target in targets:
            for deco in target.decorator_list:
                call = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(call) == f"{decorator}.defn":
                    found.append(node.name)
                    break
    return sorted(set(found))


def test_every_workflow_sits_in_its_features_folder_and_every_activity_in_one_of_activities() -> (
    None
):
    """A feature's workflow lives in `workflows/<feature>/`, its activities in
    `activities/<feature>/` (the interfaces they implement are in `posttrain_common/contracts/`,
    which every layer above may read)."""
    workflows_found, activities_found = {}, {}
    for module, path in project_modules().items():
        for name in _decorated_classes(path, "workflow"):
            workflows_found[name] = module
        for name in _decorated_classes(path, "activity"):
            activities_found[name] = module
    assert len(workflows_found) >= 10 and len(activities_found) >= 8
    for name, module in workflows_found.items():
        assert module.split(".")[0] == "workflows" and _feature_of(module), (name, module)
    for name, module in activities_found.items():
        if module.startswith("posttrain_common.contracts."):
            continue  # the interface a workflow calls
        assert module.split(".")[0] == "activities" and _feature_of(module), (name, module)


def _client_distributions() -> set[str]:
    """The client distribution and everything it requires, transitively (extras left out)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = ["posttrain-env"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            required = requires(name) or []
        except PackageNotFoundError:
            continue  # an environment marker's package not installed here
        for text in required:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_the_client_imports_only_itself_the_standard_library_and_what_it_declares() -> None:
    """`posttrain_env` is a distribution of its own: each of its imports is the standard library,
    itself, or a package its declared requirements install (the Inspect task's `inspect_ai`
    comes with the `inspect` extra). Nothing of the server, and no server dependency."""
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    provided = packages_distributions()
    allowed = _client_distributions()
    assert "temporalio" not in allowed and "posttrain-server" not in allowed
    wrong = []
    for path in (ROOT / "posttrain_env").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "posttrain_env":
                    continue
                if path.name == "inspect_task.py" and top == "inspect_ai":
                    continue
                owners = {canonicalize_name(d) for d in provided.get(top, [])}
                if not owners & allowed:
                    wrong.append(f"{path.relative_to(ROOT)}: {name} ({sorted(owners) or '?'})")
    assert wrong == []


def test_nothing_branches_on_a_backends_name_outside_that_backends_folder() -> None:
    """Capabilities are declared by the backend (`BackendInfo`); no module compares anything
    with a backend's name, but the backend's own folder (and the registry that lists them)."""
    names = set(BACKENDS)
    branches = []
    for module, path in project_modules().items():
        parts = module.split(".")
        if parts[:2] == ["activities", "backends"] and len(parts) > 3 and parts[2] in names:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                consts = [s for s in sides if isinstance(s, ast.Constant)]
                consts += [
                    e
                    for s in sides
                    if isinstance(s, ast.Tuple | ast.List | ast.Set)
                    for e in s.elts
                    if isinstance(e, ast.Constant)
                ]
                hit = {c.value for c in consts} & names
            elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
                value = node.pattern.value
                hit = {value.value} & names if isinstance(value, ast.Constant) else set()
            else:
                continue
            if hit:
                line = node.pattern.lineno if isinstance(node, ast.match_case) else node.lineno
                branches.append(f"{path.relative_to(ROOT)}:{line}: {sorted(hit)}")
    assert branches == []
