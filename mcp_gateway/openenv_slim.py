"""OpenEnv without its web UI and its fastmcp-based server environment: the first import of
`openenv.core` skips Gradio and fastmcp.

Any import under `openenv.core` runs `openenv/core/env_server/__init__.py`, which imports the
package's optional Gradio web interface whenever Gradio is installed (openenv 0.10 depends on
it): about 6 s of start-up, and 170 modules, for a UI nothing here serves or uses. That
`__init__` already treats the UI as optional (`except ModuleNotFoundError:
create_web_interface_app = None`), the path a slim install without Gradio takes. `load()` takes
that path on purpose: while it imports `openenv.core`, a finder answers "no module named gradio";
once it returns, the finder is gone and Gradio imports normally for anyone who wants it.

The same `__init__` imports openenv's `MCPEnvironment` (a server-side environment built on
fastmcp), which imports fastmcp's client at load time. Nothing here uses it (the gateway serves
MCP with the MCP SDK), but fastmcp costs seconds of imports, and its py-key-value dependency
installs beartype's import hook for the rest of the process (`beartype_this_package`), which
doubled the time the worker's workflow sandbox takes to import the workflows at start. So while
openenv loads, `fastmcp` is a stand-in whose classes refuse to be used; afterwards the stand-in
is gone from `sys.modules` and the real fastmcp imports normally, but openenv's
`MCPEnvironment` (and `get_server_tools`) in this process keep the stand-in and raise if used.

Call `load()` before the process's first import of openenv; afterwards, importing any openenv
module is as usual. If openenv is already loaded, it does nothing.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from posttrain_env.openenv_light import gradio_hidden


class FastmcpLeftOut:
    """What openenv's fastmcp-based environment gets instead of fastmcp's classes."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "openenv's MCPEnvironment needs fastmcp, which mcp_gateway.openenv_slim kept out "
            "of this process (it serves MCP with the MCP SDK); import openenv before "
            "openenv_slim.load() to use it"
        )


# The fastmcp names openenv's env_server/mcp_environment.py imports at load time.
_STAND_INS = {
    "fastmcp": {"Client": FastmcpLeftOut, "FastMCP": FastmcpLeftOut},
    "fastmcp.client": {"Client": FastmcpLeftOut},
    "fastmcp.client.client": {"CallToolResult": FastmcpLeftOut, "Client": FastmcpLeftOut},
}


def _stand_ins() -> dict[str, ModuleType]:
    modules = {}
    for name, attributes in _STAND_INS.items():
        module = ModuleType(name, "a stand-in: see mcp_gateway.openenv_slim")
        module.__dict__.update(attributes)
        if name != "fastmcp.client.client":
            module.__path__ = []  # a package, for its submodule's import
        modules[name] = module
    return modules


def load() -> None:
    """Import `openenv.core` (and its wire types) without Gradio's web UI or fastmcp."""
    if "openenv.core" in sys.modules:
        return
    stand_ins = {} if "fastmcp" in sys.modules else _stand_ins()
    sys.modules.update(stand_ins)
    try:
        with gradio_hidden():
            importlib.import_module("openenv.core")
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
