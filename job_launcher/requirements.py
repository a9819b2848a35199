"""Validation of an agent job's script and dependencies (DESIGN §6 item 3, §9).

Shared by the broker's `jobs_submit` checks (the workflows import this module, so it is pure:
standard library and `packaging`, no I/O) and by the launcher builder (which checks the
script's syntax as the job's Python, job_launcher.syntax).

Public API:

    validate_requirements(requirements) -> list[str]
        Each string must be a plain PyPI requirement: a name, optional extras, optional version
        specifiers, optional environment marker. URLs, VCS references, local paths, `-`-options
        and index/find-links settings are refused. Returns the normalized strings (canonical
        name, sorted extras, packaging's rendering of specifiers and marker), which always match
        `STRICT_REQUIREMENT_PATTERN` — the same pattern the stdlib launcher re-checks with.
        Raises ToolError(invalid_dependency, message, requirement=<the offending string, cut>).

    script_dependencies(script) -> list[str]
        The `dependencies` of the script's PEP 723 `# /// script` block, unvalidated ([] when the
        script has no block). Every other header setting (`requires-python`, `[tool.uv]` indexes,
        `exclude-newer`, …) is ignored. Raises ToolError(invalid_script) for a malformed block.

    script_exclude_newer(script) -> str | None
        The header's `[tool.uv] exclude-newer`, for the project's own evaluators (their install
        honours it, as `uv run` would); never read from an agent's script.

    validate_text(script) -> None
        UTF-8 encodable, at most MAX_SCRIPT_BYTES, not blank, no control characters but tab,
        newline, carriage return and form feed. Raises ToolError(invalid_script).

    validate_script(script) -> None
        validate_text, and compiles with this interpreter (the server's). Only for episodes
        started before scripts were checked as their job's Python (workflows/episode/tools.py
        replays them so); the launcher's builder and new episodes check the job's grammar
        (job_launcher.syntax). Raises ToolError(invalid_script).

    merged_dependencies(script, dependencies) -> list[str]
        The validated union of `dependencies` and the script's header dependencies, duplicates
        dropped, first occurrence's order kept, at most MAX_DEPENDENCIES.
        Raises ToolError(invalid_dependency) (or invalid_script for a malformed header).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.limits import (
    MAX_DEPENDENCIES,
    MAX_ERROR_DETAIL_CHARS,
    MAX_REQUIREMENT_CHARS,
    MAX_SCRIPT_BYTES,
    cut_text,
)

# Control characters a script may not contain: all but tab, newline, form feed and carriage
# return. Each one takes six bytes as JSON, so a legal-sized script of them would otherwise be
# a payload of 1.5 MB; no Python source needs them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")

# The strict form every normalized requirement takes. The launcher (standard library only) keeps
# an identical copy and re-checks the package list with it before installing anything; a test
# asserts that the two patterns are the same. No `/`, `:`, `@`, `#`, `\` or leading `-` can pass,
# so no URL, path, VCS reference or option ever reaches the installer.
STRICT_REQUIREMENT_PATTERN = (
    r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?"  # canonical name
    r"(?:\[[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?(?:,[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)*\])?"  # extras
    r"(?:(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+"  # first specifier
    r"(?:,(?:===|==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]+)*)?"  # more specifiers
    r"(?:; [A-Za-z0-9_.<>=!~ ()\"',*+-]+)?"  # environment marker
)
_STRICT = re.compile(STRICT_REQUIREMENT_PATTERN)
# An `exclude-newer` uv accepts: a date, or a UTC or offset time. The launcher keeps an
# identical copy (a test asserts it) and re-checks before passing it to uv.
EXCLUDE_NEWER_PATTERN = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2}))?"
)

# The reference regular expression of PEP 723 (https://peps.python.org/pep-0723/).
_PEP723_BLOCK = re.compile(
    r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$"
)


def _refuse(requirement: object, why: str) -> ToolError:
    # The agent's string is quoted cut (a script header can hold one of 240 KB): the message
    # must still say why, and the answer stays small.
    text = requirement if isinstance(requirement, str) else repr(requirement)
    quoted = cut_text(repr(text), MAX_ERROR_DETAIL_CHARS)
    return ToolError(
        ErrorType.invalid_dependency,
        f"dependency {quoted}: {why}. Give plain PyPI requirement strings such as "
        "'numpy', 'transformers[torch]>=4.40,<5' or 'trl==0.9.6; python_version >= \"3.10\"'; "
        "packages are installed from PyPI wheels only.",
        requirement=cut_text(text, MAX_ERROR_DETAIL_CHARS),
    )


def _normalize(raw: object) -> str:
    if not isinstance(raw, str):
        raise _refuse(raw, "a dependency must be a string")
    text = raw.strip()
    if not text:
        raise _refuse(raw, "the requirement is empty")
    if len(text) > MAX_REQUIREMENT_CHARS:
        raise _refuse(raw, f"the requirement is longer than {MAX_REQUIREMENT_CHARS} characters")
    if text.startswith("-"):
        raise _refuse(
            raw, "installer options (such as --index-url, -e, -r, --find-links) are not allowed"
        )
    if any(ch in text for ch in "\r\n\t\0\\") or not text.isprintable():
        raise _refuse(raw, "control characters and backslashes are not allowed")
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise _refuse(raw, f"not a valid requirement ({exc})") from None
    if req.url:
        raise _refuse(raw, "URLs, VCS references and local paths are not allowed")
    name = canonicalize_name(req.name)
    extras = sorted(canonicalize_name(e) for e in req.extras)
    out = name + (f"[{','.join(extras)}]" if extras else "")
    specifier: SpecifierSet = req.specifier
    out += str(specifier)
    if req.marker is not None:
        marker: Marker = req.marker
        out += f"; {marker}"
    if not _STRICT.fullmatch(out):
        raise _refuse(raw, "it uses characters outside plain names, versions and markers")
    return out


def validate_requirements(requirements: Sequence[str]) -> list[str]:
    """Normalized plain PyPI requirements; ToolError(invalid_dependency) on the first bad one."""
    if isinstance(requirements, str):
        raise _refuse(requirements, "dependencies must be a list of strings, not one string")
    return [_normalize(r) for r in requirements]


def _script_header(script: str) -> dict[str, object]:
    """The TOML table of the script's PEP 723 `script` block ({} when there is none)."""
    blocks = [m for m in _PEP723_BLOCK.finditer(script) if m.group("type") == "script"]
    if not blocks:
        return {}
    if len(blocks) > 1:
        raise ToolError(
            ErrorType.invalid_script,
            "the script has more than one '# /// script' block; keep one (PEP 723)",
        )
    content = "".join(
        line[2:] if line.startswith("# ") else line[1:]
        for line in blocks[0].group("content").splitlines(keepends=True)
    )
    try:
        return tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(
            ErrorType.invalid_script,
            f"the script's '# /// script' block is not valid TOML ({exc}); fix or remove it",
        ) from None


def script_dependencies(script: str) -> list[str]:
    """The `dependencies` list of the script's PEP 723 `script` block ([] when there is none)."""
    deps = _script_header(script).get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ToolError(
            ErrorType.invalid_script,
            "the script's PEP 723 'dependencies' must be a list of requirement strings",
        )
    return list(deps)


def script_exclude_newer(script: str) -> str | None:
    """The `[tool.uv] exclude-newer` of the script's PEP 723 block (None when it has none), for
    the project's own evaluators only: an agent's header settings are ignored (DESIGN §6 item
    3). Raises ToolError(invalid_script) unless it is an RFC 3339 time or date
    (EXCLUDE_NEWER_PATTERN, which the launcher re-checks)."""
    tool = _script_header(script).get("tool", {})
    uv = tool.get("uv", {}) if isinstance(tool, dict) else {}
    value = uv.get("exclude-newer") if isinstance(uv, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(EXCLUDE_NEWER_PATTERN, value):
        raise ToolError(
            ErrorType.invalid_script,
            f"the script's exclude-newer {value!r} is not an RFC 3339 date or time",
        )
    return value


def validate_text(script: str) -> None:
    """Raise ToolError(invalid_script) unless the script is UTF-8, small enough, not blank and
    free of control characters (the rules that do not depend on a Python version)."""
    if not isinstance(script, str):
        raise ToolError(ErrorType.invalid_script, "the script must be a string of Python code")
    try:
        data = script.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(
            ErrorType.invalid_script, f"the script is not valid UTF-8 text ({exc.reason})"
        ) from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise ToolError(
            ErrorType.invalid_script,
            f"the script is {len(data)} bytes; the limit is {MAX_SCRIPT_BYTES}. Put large data "
            "in a dataset instead of the script.",
        )
    if not script.strip():
        raise ToolError(ErrorType.invalid_script, "the script is empty")
    control = _CONTROL.search(script)
    if control is not None:
        line = script.count("\n", 0, control.start()) + 1
        name = "NUL" if control.group() == "\0" else repr(control.group())
        raise ToolError(
            ErrorType.invalid_script,
            f"the script contains the control character {name} (line {line}); only tab, "
            "newline, carriage return and form feed are allowed",
        )


def validate_script(script: str) -> None:
    """validate_text, and the script compiles with this interpreter: what episodes started
    before SYNTAX_OF_THE_JOBS_PYTHON checked, kept so that they replay. Everything else checks
    the grammar of the job's own Python (job_launcher.syntax)."""
    validate_text(script)
    try:
        compile(script, "script.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise ToolError(
            ErrorType.invalid_script, f"the script does not compile{where}: {exc}"
        ) from None


def merged_dependencies(script: str, dependencies: Sequence[str]) -> list[str]:
    """Validated union of `dependencies` and the script's PEP 723 dependencies, order kept."""
    merged: list[str] = []
    seen: set[str] = set()
    for req in validate_requirements(dependencies) + validate_requirements(
        script_dependencies(script)
    ):
        if req not in seen:
            seen.add(req)
            merged.append(req)
    if len(merged) > MAX_DEPENDENCIES:
        raise ToolError(
            ErrorType.invalid_dependency,
            f"{len(merged)} dependencies (argument and script header together); the limit is "
            f"{MAX_DEPENDENCIES}. Drop packages that your dependencies already pull in.",
            requirement=merged[MAX_DEPENDENCIES],
        )
    return merged
