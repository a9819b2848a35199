"""Whether a script parses as the Python its job will run (3.12 on Hugging Face's default image,
the job interpreter's own version locally), not as the server's.

    check_syntax(script, python) -> None      raises ToolError(invalid_script) with the place

Used by the launcher's builder (every backend builds an agent job's launcher with it) and by
the episode's `check_script` activity, both with the job's Python version (`JobsBackend.
job_python_version`):

- the server's own version: the interpreter's `compile` decides (exact);
- an older version: the server's parser told that version (`ast.parse(feature_version=...)`)
  refuses the grammar added since (`except*` for 3.10, `match` for 3.9, ...; best effort, as
  the standard library says), then `compile` finds what only the compiler finds;
- a newer version: libcst's parser, configured for it, decides: it accepts every valid program
  of that version (so nothing valid is refused, e.g. 3.12's `type` statements and nested
  f-string quotes on a 3.11 server) and refuses grammar errors; a few errors that only the
  compiler finds (`return` outside a function, say) pass here and fail in the job. It is slow
  on large scripts (about 2 s for 256 KiB), hence an activity, not workflow code.
"""

from __future__ import annotations

import ast
import re
import sys

# Imported with this module (about 0.4 s), not at the first check: that check is inside a job's
# submit, whose Hub calls run against deadlines. Only the worker imports this module (the
# launcher's builder and the jobs activities), never the gateway or workflow code.
import libcst
from libcst._parser.types.config import KNOWN_PYTHON_VERSION_STRINGS

from posttrain_env.errors import ErrorType, ToolError

_VERSION = re.compile(r"3\.(\d{1,2})")


def check_syntax(script: str, python: str) -> None:
    """Raise ToolError(invalid_script) unless `script` parses as Python `python` ("3.12").
    Raises ValueError for a `python` that is no "3.<minor>" version."""
    version = _VERSION.fullmatch(python)
    if version is None:
        raise ValueError(f"a job's Python version is '3.<minor>', not {python!r}")
    job = (3, int(version[1]))
    if job > sys.version_info[:2]:
        _check_newer(script, python)
        return
    try:
        if job < sys.version_info[:2]:
            ast.parse(script, "script.py", "exec", feature_version=job)
        compile(script, "script.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise ToolError(
            ErrorType.invalid_script,
            f"the script does not compile for Python {python}{where}: {exc}",
        ) from None


def _check_newer(script: str, python: str) -> None:
    version = python if python in KNOWN_PYTHON_VERSION_STRINGS else KNOWN_PYTHON_VERSION_STRINGS[-1]
    try:
        libcst.parse_module(script, config=libcst.PartialParserConfig(python_version=version))
    except libcst.ParserSyntaxError as exc:
        raise ToolError(
            ErrorType.invalid_script,
            f"the script is not valid Python {python} (line {exc.editor_line}): {exc.message}",
        ) from None
