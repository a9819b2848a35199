"""A first command that starts fast (issue 20): the server and the demo load openenv without its
Gradio web UI (about 6 s of imports on a small machine), and the demo's own module loads almost
nothing until it runs (its stack loads in a thread while Temporal boots)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Gradio: openenv's web UI. fastmcp: openenv's server-side MCPEnvironment, whose py-key-value
# dependency installs beartype's import hook, slowing every later import (the worker's workflow
# sandbox's included) for the rest of the process.
HEAVY = ("gradio", "gradio_client", "pandas", "matplotlib", "fastmcp", "key_value", "beartype")


def packages_loaded_by(code: str, watch: tuple[str, ...] = HEAVY) -> list[str]:
    """The top-level packages among `watch` that running `code` in a fresh process loads."""
    probe = (
        f"{code}\n"
        "import sys\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({watch!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return eval(done.stdout.strip().splitlines()[-1])  # a printed list of names


@pytest.mark.parametrize(
    "code",
    [
        "import mcp_gateway.app",
        "import posttrain_server.server, mcp_gateway.app",
        # What `posttrain-env demo` loads: the command line, the demo, then its whole stack.
        "import posttrain_server.cli\nfrom posttrain_server import demo\ndemo.load_modules()",
    ],
)
def test_the_gateway_and_the_demo_load_no_gradio(code: str) -> None:
    assert packages_loaded_by(code) == []


def test_the_client_and_its_agents_load_openenv_without_its_web_ui() -> None:
    """What an agent's process imports (issue 25: the client's own start-up): openenv's client
    and wire types, not Gradio (it was 4 s of the client's 5.8 s import, 2,458 modules), and
    Gradio stays importable afterwards."""
    code = (
        "from posttrain_env import PostTrainEnv\n"
        "import posttrain_env.agents.play\n"
        "from openenv.core.env_server.mcp_types import CallToolAction\n"
        "assert PostTrainEnv.__name__ and CallToolAction.__name__\n"
    )
    # Gradio is found again once the client loaded (the finder that hid it is gone): importing
    # it would prove no more, for 4 s of CPU.
    found_after = (
        "import importlib.util, sys\n"
        "from posttrain_env.openenv_light import HideGradio\n"
        "assert not [f for f in sys.meta_path if isinstance(f, HideGradio)]\n"
        "assert importlib.util.find_spec('gradio') is not None\n"
    )
    watch = ("gradio", "gradio_client", "pandas", "matplotlib")
    assert packages_loaded_by(code + found_after, watch) == []


def test_the_client_loads_none_of_openenvs_server_side_which_stays_importable() -> None:
    """The client's import (issue 45): openenv's client modules and wire models, none of its
    server side (the `__init__`s of `openenv.core` and `openenv.core.env_server`: FastAPI,
    uvicorn, fastmcp). Measured idle (bench/client_import.py): 0.18 s and 442 modules, from
    0.76 s and 1,401 with those `__init__`s run. The server side imports on demand afterwards,
    still without Gradio."""
    code = (
        "from posttrain_env import PostTrainEnv\n"
        "import posttrain_env.agents.play\n"
        "import sys\n"
        "openenv = sorted(m for m in sys.modules if m.split('.')[0] == 'openenv')\n"
        "print(len(sys.modules), openenv)\n"
    )
    web = ("fastapi", "starlette", "uvicorn", "fastmcp", "gradio", "pandas", "temporalio")
    assert packages_loaded_by(code, web) == []
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    count, names = probe.stdout.split(" ", 1)
    assert int(count) < 600, count  # 442 here; 1,401 with openenv's server side
    assert "openenv.core.env_server.http_server" not in names
    assert "openenv.core.mcp_client" in names and "openenv.core.env_server.mcp_types" in names
    # Asked for by name, openenv's server side loads then (Gradio hidden, as before).
    later = (
        "from posttrain_env import PostTrainEnv\n"
        "from openenv.core.env_server import create_app, create_web_interface_app\n"
        "import openenv.core\n"
        "assert create_app.__module__ == 'openenv.core.env_server.http_server'\n"
        "assert create_web_interface_app is None and openenv.core.EnvClient.__name__\n"
        "from openenv.core.env_server.mcp_types import CallToolAction\n"
        "assert PostTrainEnv.__mro__[1].__module__ == 'openenv.core.mcp_client'\n"
    )
    assert packages_loaded_by(later, ("gradio", "fastapi")) == ["fastapi"]


def test_the_demo_module_itself_loads_neither_openenv_nor_temporal() -> None:
    watch = ("openenv", "temporalio", "mcp", "fastapi", "uvicorn")
    assert packages_loaded_by("import posttrain_server.demo", watch) == []


def test_openenv_loaded_slim_serves_its_wire_types_and_gradio_stays_importable() -> None:
    """Gradio is hidden only while openenv is imported: anyone may import it afterwards."""
    probe = (
        "from mcp_gateway import openenv_slim\n"
        "openenv_slim.load()\n"
        "import sys\n"
        "from openenv.core.env_server import create_web_interface_app\n"
        "from openenv.core.env_server.mcp_types import CallToolAction\n"
        "from openenv.core.mcp_client import MCPToolClient\n"
        "print(create_web_interface_app, 'gradio' in sys.modules)\n"
        "import gradio\n"
        "print('gradio' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["None", "False", "True"]


def test_openenv_loaded_slim_keeps_fastmcp_out_and_fastmcp_stays_importable() -> None:
    """openenv's fastmcp-based environment gets a stand-in that refuses to be used; fastmcp
    itself imports normally afterwards."""
    probe = (
        "from mcp_gateway import openenv_slim\n"
        "openenv_slim.load()\n"
        "import sys\n"
        "from openenv.core.env_server import mcp_environment\n"
        "print('fastmcp' in sys.modules)\n"
        "try:\n"
        "    mcp_environment.Client(None)\n"
        "except RuntimeError as err:\n"
        "    print('refused' if 'openenv_slim' in str(err) else err)\n"
        "import fastmcp\n"
        "print(fastmcp.Client.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "refused", "fastmcp.client.client"]
