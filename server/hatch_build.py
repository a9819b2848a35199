"""Where the service's packages are: in the tree, at its root (`../`); in the sdist built from it,
beside this file. The wheel takes them from whichever holds them, so both `uv build --package
posttrain-server` (sdist, then a wheel from it) and an editable install work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# The service's packages, one per layer (README.md, "How it is built").
LAYERS = (
    "posttrain_common",
    "job_launcher",
    "tasks",
    "activities",
    "workflows",
    "mcp_gateway",
    "posttrain_server",
)


def layer_sources(root: Path) -> dict[str, str]:
    """Each layer's folder (in the tree, or in an unpacked sdist) -> its name in the archive."""
    sources = {}
    for name in LAYERS:
        tree, unpacked = root.parent / name, root / name
        folder = unpacked if unpacked.is_dir() else tree
        if not folder.is_dir():
            raise FileNotFoundError(f"{name}/ is neither in {root.parent} nor in {root}")
        sources[str(folder)] = name
    return sources


class CustomBuildHook(BuildHookInterface):  # the name hatchling looks for
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            return  # dev-mode-dirs puts the tree's root on the path instead
        build_data["force_include"].update(layer_sources(Path(self.root)))
