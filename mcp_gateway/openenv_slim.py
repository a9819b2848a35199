"""OpenEnv without its web UI and its fastmcp-based server environment, for the gateway.

The gateway needs only openenv's wire models (`mcp_gateway/wire.py`): `load()` makes them
importable without running the `__init__`s of `openenv.core` and `openenv.core.env_server`, as
the client does (`posttrain_env/openenv_light.py`: Gradio's web UI, about 6 s of start-up, and
openenv's HTTP server are not loaded). Should anything later ask those packages for a name of
their own, their `__init__` runs then, with Gradio hidden and with `fastmcp` a stand-in.

That `__init__` imports openenv's `MCPEnvironment` (a server-side environment built on
fastmcp), which imports fastmcp's client at load time. Nothing here uses it (the gateway serves
MCP with the MCP SDK), but fastmcp costs seconds of imports, and its py-key-value dependency
installs beartype's import hook for the rest of the process (`beartype_this_package`), which
doubled the time the worker's workflow sandbox takes to import the workflows at start. So while
that `__init__` runs, `fastmcp` is a stand-in whose classes refuse to be used; afterwards the
stand-in is gone from `sys.modules` and the real fastmcp imports normally, but openenv's
`MCPEnvironment` (and `get_server_tools`) in this process keep the stand-in and raise if used.

Call `load()` before the process's first import of openenv (after the client's own `load()` is
fine: it adds the fastmcp guard). If openenv is already loaded whole, it does nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from posttrain_env import openenv_light


class FastmcpLeftOut:
    """What openenv's fastmcp-based environment gets instead of fastmcp's classes."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "openenv's MCPEnvironment needs fastmcp, which mcp_gateway.openenv_slim kept out "
            "of this process (it serves MCP with the MCP SDK); import openenv before "
            "openenv_slim.load() to use it"
        )


# The fastmcp names openenv/core/env_server/mcp_environment.py imports at load time.
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


@contextmanager
def fastmcp_left_out() -> Iterator[None]:
    """While inside, `fastmcp` (unless it is loaded already) is the stand-in."""
    stand_ins = {} if "fastmcp" in sys.modules else _stand_ins()
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def load() -> None:
    """Make openenv's wire types importable without Gradio's web UI or fastmcp (nothing when
    openenv.core is loaded already)."""
    if "openenv.core" in sys.modules and not openenv_light.deferred():
        return
    openenv_light.load()
    openenv_light.guard_deferred_init(fastmcp_left_out)
