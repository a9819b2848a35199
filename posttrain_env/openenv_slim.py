"""OpenEnv without its web UI: the first import of `openenv.core` skips Gradio.

Any import under `openenv.core` runs `openenv/core/env_server/__init__.py`, which imports the
package's optional Gradio web interface whenever Gradio is installed (openenv 0.10 depends on
it): about 6 s of start-up, and 170 modules, for a UI nothing here serves or uses. That
`__init__` already treats the UI as optional (`except ModuleNotFoundError:
create_web_interface_app = None`), the path a slim install without Gradio takes. `load()` takes
that path on purpose: while it imports `openenv.core`, a finder answers "no module named gradio";
once it returns, the finder is gone and Gradio imports normally for anyone who wants it.

Call `load()` before the process's first import of openenv; afterwards, importing any openenv
module is as usual. If openenv is already loaded, it does nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN = "gradio"


class _HideGradio(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == HIDDEN or fullname.startswith(HIDDEN + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None  # every other module: the usual finders


def load() -> None:
    """Import `openenv.core` (and its wire types) without Gradio's web UI."""
    if "openenv.core" in sys.modules:
        return
    finder = _HideGradio()
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module("openenv.core")
    finally:
        sys.meta_path.remove(finder)
