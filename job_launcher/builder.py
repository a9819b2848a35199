"""Server side: build the launcher text that a job runs (DESIGN §9, launcher embedding).

Public API:

    LauncherConfig(...)            backend-only settings, frozen; never anything of the agent's
    build_launcher(script, packages, config=LauncherConfig(), *, python) -> str
        The complete launcher (job_launcher/launcher.py) with the agent's script and the
        configuration embedded base64-encoded. `packages` is the agent's `dependencies`
        argument; the script's PEP 723 dependencies are merged in here (merged_dependencies),
        every other header setting is ignored. `python` is the version of the Python the job
        runs ("3.12": the backend's `job_python_version`); the script must parse as that
        version, whatever the server runs (job_launcher.syntax). Raises
        ToolError(invalid_script) or ToolError(invalid_dependency) exactly as the broker's
        jobs_submit checks do.
    launcher_source() -> str       the template (launcher.py, job_launcher/loopback.py inlined)
    read_embedded(text) -> (dict, str)   the configuration and script a built launcher holds
                                   (ValueError when `text` is not a launcher this module built)

The job then runs `python3 <launcher> [--phase install|run|all]` (or `uv run <launcher>`: the
launcher's own PEP 723 header declares no dependencies) with the per-job nonce in the
environment variable NONCE_ENV (`POSTTRAIN_NONCE`). The nonce is never embedded: the launcher
reads it, scrubs it from its environment, and prints it only on its own trusted lines, which
`job_launcher.trusted_lines.trusted_payloads(lines, LAUNCHER_TAG, nonce)` reads back:

    {"stage": "installed", "packages": {name: version}, "installer": "uv"|"pip"}
    {"stage": "exit", "exit_code": N, "signal": S|None}          final: the script ran
    {"stage": <failed stage>, "error": <message>}                  final: the script never ran
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from job_launcher.requirements import EXCLUDE_NEWER_PATTERN, merged_dependencies, validate_text
from job_launcher.syntax import check_syntax

NONCE_ENV = "POSTTRAIN_NONCE"
LAUNCHER_PATH = Path(__file__).with_name("launcher.py")
LOOPBACK_PATH = Path(__file__).with_name("loopback.py")
# launcher.py's one import of the loopback supervisor, replaced by that module's text.
_LOOPBACK_IMPORT = re.compile(r"^from job_launcher\.loopback import \([^)]*\)\n", re.MULTILINE)

_CONFIG_LINE = '_EMBEDDED_CONFIG = ""\n'
_SCRIPT_LINE = '_EMBEDDED_SCRIPT = ""\n'
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_SECRET_LIKE = re.compile(r"TOKEN|SECRET|PASSWORD|KEY|NONCE|CREDENTIAL", re.IGNORECASE)
# What the launcher sets itself in the script's environment; `pass_env` may not name them.
_LAUNCHER_SET_ENV = frozenset(
    {"HOME", "USER", "LOGNAME", "PATH", "VIRTUAL_ENV", "TMPDIR", "PYTHONUNBUFFERED", "LANG"}
    | {"LC_ALL", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"}
    | {"HF_HUB_DISABLE_TELEMETRY"}
)


@dataclass(frozen=True)
class LauncherConfig:
    """Backend-only launcher settings, kept apart from the agent's package list.

    python      interpreter the job's venv is built on; None: the launcher's own base
                interpreter. It must be executable by the job's uid (/usr/bin/python3 locally;
                not a pyenv Python under a 0700 /root).
    data_dir    the job's working directory; `<data_dir>/outputs` is the only place it may write.
    venv_dir    where the fresh venv is created; required for split phases (install, then run);
                None with --phase all: a fresh temporary folder.
    uid, gid    the id the script runs as (the local backend chooses one per job so concurrent
                jobs never share one); None: an id no account or live process uses.
    find_links  local wheel folders (tests: a generated wheel; torch from this machine's pip
                find-links). Never something an agent's script can set.
    no_index    install from `find_links` only, without PyPI (tests).
    index_url   a package mirror that replaces PyPI (None: PyPI). Never an extra index.
    installer   "auto" (uv when found, else pip), "uv" or "pip".
    loopback_tcp  the loopback-only TCP policy where the machine allows it (job_launcher/
                loopback.py); False: AF_UNIX sockets only, the sandbox line says so.
    uv          path of the uv binary; None: `uv` on PATH.
    extra_env   extra environment for the script (not secrets: names that look like tokens,
                keys or secrets are refused).
    user        USER/LOGNAME for the script (getpass.getuser() fails for an unnamed uid).
    pass_env    names of variables the launcher passes from its own environment to the
                script: an evaluation's nonce, task parameters and grader seed (the values
                arrive at run time, like the nonce; they are never embedded). () for agent
                jobs, whose script gets none of them.
    exclude_newer  the evaluator's pinned `[tool.uv] exclude-newer` (uv's --exclude-newer);
                None for agent jobs, whose header settings are ignored.
    """

    python: str | None = None
    data_dir: str = "/data"
    venv_dir: str | None = None
    uid: int | None = None
    gid: int | None = None
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    index_url: str | None = None
    installer: str = "auto"
    uv: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    user: str = "job"
    pass_env: tuple[str, ...] = ()
    exclude_newer: str | None = None
    loopback_tcp: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.pass_env, str):
            raise ValueError("pass_env is a tuple of names, not one string")
        for key in self.pass_env:
            if not _ENV_NAME.fullmatch(key) or key in _LAUNCHER_SET_ENV:
                raise ValueError(f"pass_env may not name {key!r}")
        if self.exclude_newer is not None and not re.fullmatch(
            EXCLUDE_NEWER_PATTERN, self.exclude_newer
        ):
            raise ValueError(f"exclude_newer {self.exclude_newer!r} is not an RFC 3339 time")
        for name in (self.uid, self.gid):
            if name is not None and not 0 < name < 2**32 - 1:
                raise ValueError(f"job uid/gid must be a non-root id, got {name}")
        for key, value in self.extra_env.items():
            if not _ENV_NAME.fullmatch(key) or _SECRET_LIKE.search(key):
                raise ValueError(f"extra_env may not set {key!r}")
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(f"extra_env {key!r} must be a string without NUL")
        if self.installer not in ("auto", "uv", "pip"):
            raise ValueError(f"installer must be auto, uv or pip, not {self.installer!r}")
        if isinstance(self.find_links, str):
            raise ValueError("find_links is a tuple of folders, not one string")

    def as_json(self, packages: list[str]) -> dict[str, object]:
        return {
            "version": 1,
            "packages": packages,
            "python": self.python,
            "data_dir": self.data_dir,
            "venv_dir": self.venv_dir,
            "uid": self.uid,
            "gid": self.gid,
            "find_links": list(self.find_links),
            "no_index": self.no_index,
            "index_url": self.index_url,
            "installer": self.installer,
            "uv": self.uv,
            "env": dict(self.extra_env),
            "user": self.user,
            "pass_env": list(self.pass_env),
            "exclude_newer": self.exclude_newer,
            "loopback_tcp": self.loopback_tcp,
        }


@cache
def launcher_source() -> str:
    """launcher.py with job_launcher/loopback.py inlined in place of its import of it: the one
    standard-library file a job runs."""
    text = LAUNCHER_PATH.read_text(encoding="utf-8")
    if text.count(_CONFIG_LINE) != 1 or text.count(_SCRIPT_LINE) != 1:
        raise RuntimeError("launcher.py lost its embedding placeholders")
    imports = _LOOPBACK_IMPORT.findall(text)
    if len(imports) != 1:
        raise RuntimeError("launcher.py must import job_launcher.loopback in one statement")
    module = LOOPBACK_PATH.read_text(encoding="utf-8")
    inlined = f"# -- job_launcher/loopback.py, inlined by job_launcher.builder --\n{module}\n"
    return text.replace(imports[0], inlined, 1)


def build_launcher(
    script: str, packages: Sequence[str], config: LauncherConfig | None = None, *, python: str
) -> str:
    """The launcher text for one job whose interpreter is Python `python`; see the module
    docstring."""
    config = config or LauncherConfig()
    validate_text(script)
    # The job's grammar, not the server's: a 3.12 job may use 3.12 syntax on a 3.11 server.
    check_syntax(script, python)
    merged = merged_dependencies(script, packages)
    config_b64 = base64.b64encode(
        json.dumps(config.as_json(merged), separators=(",", ":")).encode()
    ).decode("ascii")
    script_b64 = base64.b64encode(script.encode("utf-8")).decode("ascii")
    return (
        launcher_source()
        .replace(_CONFIG_LINE, f'_EMBEDDED_CONFIG = "{config_b64}"\n', 1)
        .replace(_SCRIPT_LINE, f'_EMBEDDED_SCRIPT = "{script_b64}"\n', 1)
    )


_EMBEDDED = re.compile(r'^_EMBEDDED_(CONFIG|SCRIPT) = "([A-Za-z0-9+/=]*)"$', re.MULTILINE)


def read_embedded(text: str) -> tuple[dict[str, object], str]:
    """The configuration (as LauncherConfig.as_json wrote it) and the script embedded in a
    launcher built by build_launcher. Raises ValueError for any other text."""
    found = {kind: value for kind, value in _EMBEDDED.findall(text)}
    rest = _EMBEDDED.sub(lambda m: f'_EMBEDDED_{m.group(1)} = ""', text)
    if set(found) != {"CONFIG", "SCRIPT"} or rest != launcher_source():
        raise ValueError("not a launcher built from job_launcher/launcher.py")
    config = json.loads(base64.b64decode(found["CONFIG"], validate=True))
    return config, base64.b64decode(found["SCRIPT"], validate=True).decode("utf-8")
