"""OpenEnv's client without its server side: what a process that only plays episodes loads.

Any import under `openenv.core` first runs `openenv/core/__init__.py`, which imports the whole
`openenv.core.env_server` package, whose `__init__` imports openenv's HTTP server (FastAPI),
its fastmcp-based `MCPEnvironment` and, whenever Gradio is installed (openenv 0.10 depends on
it), its Gradio web UI. A client needs none of it: `PostTrainEnv` uses four modules
(`client_types`, `mcp_client`, `env_client` and the wire models of `env_server.mcp_types` and
`env_server.types`). Measured on this 2-core machine, idle: `from posttrain_env import
PostTrainEnv` took 0.86 s and 1,401 modules with the packages' `__init__`s run (Gradio hidden;
with Gradio, 5.8 s), 0.2 s and 437 modules without them.

`load()` puts those two packages in `sys.modules` with their `__init__` not run yet
(`DeferredPackage`): their submodules import as usual, and the first name anyone asks of the
package itself (`from openenv.core.env_server import create_app`, `openenv.core.EnvClient`,
`import *`) runs its `__init__` then, so every openenv name still works, only later. That
`__init__` runs inside each guard `guard_deferred_init` registered, Gradio hidden always: its
`__init__` treats the web UI as optional (`except ModuleNotFoundError:
create_web_interface_app = None`) and takes that path, as an install without Gradio does; Gradio
itself imports normally for anyone who asks for it. The gateway adds a guard of its own
(`mcp_gateway/openenv_slim.py`: fastmcp left out).

`posttrain_env.client` and `posttrain_env.agents.play` call `load()` before their first import
of openenv. If openenv is already loaded, it does nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN = "gradio"
# The packages whose `__init__` loads openenv's server side; a parent before its child.
DEFERRED = ("openenv.core", "openenv.core.env_server")
InitGuard = Callable[[], AbstractContextManager[None]]


class HideGradio(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == HIDDEN or fullname.startswith(HIDDEN + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None  # every other module: the usual finders


@contextmanager
def gradio_hidden() -> Iterator[None]:
    """While inside, importing Gradio fails as if it were not installed."""
    finder = HideGradio()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


# What a deferred `__init__` runs inside, and the packages whose `__init__` runs now
# (process-wide, like `sys.modules` itself: one import state per process).
_guards: list[InitGuard] = [gradio_hidden]
_initializing: set[str] = set()
_init_lock = threading.RLock()  # another thread asking meanwhile waits for the whole `__init__`


class DeferredPackage(ModuleType):
    """A package whose `__init__` has not run: found in `sys.modules` with its `__path__`, so
    its submodules import without it; any name not there yet runs the `__init__` first (inside
    the registered guards) and is then looked up as usual."""

    def __getattr__(self, name: str) -> object:
        with _init_lock:
            if type(self) is DeferredPackage and self.__name__ not in _initializing:
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                _initializing.add(self.__name__)
                try:
                    with ExitStack() as guards:
                        for guard in _guards:
                            guards.enter_context(guard())
                        spec.loader.exec_module(self)
                finally:
                    _initializing.discard(self.__name__)
                # An ordinary module from here on, as if imported whole.
                self.__class__ = ModuleType  # pyright: ignore[reportAttributeAccessIssue]
        # While its `__init__` runs, a name it has not set yet is missing (its own `from .
        # import x` then imports the submodule), as in any package being imported.
        return ModuleType.__getattribute__(self, name)


def guard_deferred_init(guard: InitGuard) -> None:
    """Run the deferred packages' `__init__`, whenever it runs, inside `guard()` too."""
    if guard not in _guards:
        _guards.append(guard)


def deferred() -> bool:
    """True while some package of DEFERRED has not run its `__init__`."""
    return any(isinstance(sys.modules.get(name), DeferredPackage) for name in DEFERRED)


def load() -> None:
    """Make `openenv.core`'s client modules importable without openenv's server side (nothing
    when openenv.core is loaded already)."""
    if "openenv.core" in sys.modules:
        return
    importlib.import_module("openenv")  # its own `__init__` is light (names it loads lazily)
    for name in DEFERRED:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations is not None, name
        package = DeferredPackage(name)
        package.__spec__ = spec
        package.__loader__ = spec.loader
        package.__file__ = spec.origin
        package.__path__ = list(spec.submodule_search_locations)
        package.__package__ = name
        sys.modules[name] = package
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, package)
