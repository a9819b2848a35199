"""The `find-links` of this machine's pip configuration (read, never written).

The local backend installs job packages with uv, which does not read pip's configuration. On
machines that keep wheels on disk for pip (these do: a CPU build of torch lies in the folder
pip's `find-links` names), jobs should see the same folders, or a job asking for torch would
download a multi-GB CUDA build from PyPI. Only local folders are taken; URLs are left to pip.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from pathlib import Path

# pip's own configuration files, in the order pip reads them (later ones win for a key).
CONFIG_FILES = (
    Path("/etc/xdg/pip/pip.conf"),
    Path("/etc/pip.conf"),
    Path("~/.pip/pip.conf"),
    Path("~/.config/pip/pip.conf"),
)


def pip_find_links(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The existing local folders pip's configuration and environment name as find-links."""
    value = ""
    files = [Path(environ["PIP_CONFIG_FILE"])] if environ.get("PIP_CONFIG_FILE") else []
    for path in [*CONFIG_FILES, *files]:
        parser = configparser.ConfigParser()
        try:
            parser.read(path.expanduser(), encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue  # a file pip itself would complain about: not ours to fix
        for section in ("global", "install"):
            if parser.has_option(section, "find-links"):
                value = parser.get(section, "find-links")
    value = environ.get("PIP_FIND_LINKS", value)
    folders = [entry for entry in value.split() if "://" not in entry or entry.startswith("file:")]
    paths = [Path(entry.removeprefix("file://")) for entry in folders]
    return [str(path) for path in paths if path.is_dir()]
