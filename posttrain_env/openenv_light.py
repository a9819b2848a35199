"""OpenEnv's client without its Gradio web UI: what a process that only plays episodes loads.

Any import under `openenv.core` runs `openenv/core/env_server/__init__.py`, which imports the
package's optional Gradio web interface whenever Gradio is installed (openenv 0.10 depends on
it): about 4 s of start-up and 1,000 modules for a UI a client never serves. That `__init__`
already treats the UI as optional (`except ModuleNotFoundError: create_web_interface_app =
None`), the path an install without Gradio takes. `load()` takes that path on purpose: while it
imports `openenv.core`, a finder answers "no module named gradio"; once it returns, the finder
is gone and Gradio imports normally for anyone who wants it (only openenv's
`create_web_interface_app` stays None in this process).

`posttrain_env.client` and `posttrain_env.agents.play` call `load()` before their first import
of openenv. If openenv is already loaded, it does nothing. The server goes further and leaves
fastmcp out too (`mcp_gateway/openenv_slim.py`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN = "gradio"


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


def load() -> None:
    """Import `openenv.core` without Gradio's web UI (nothing when openenv is loaded already)."""
    if "openenv.core" in sys.modules:
        return
    with gradio_hidden():
        importlib.import_module("openenv.core")
