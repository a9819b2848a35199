"""The installed version of posttrain-server, as servers report it (MCP `serverInfo`,
`/metadata`)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

NAME = "posttrain-server"  # the server reports its own distribution's version


def installed_version() -> str:
    """The distribution's version; "0+unknown" when run from a tree that is not installed."""
    try:
        return version(NAME)
    except PackageNotFoundError:
        return "0+unknown"
