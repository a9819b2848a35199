"""Whether a script parses as the Python its job will run (3.12 on Hugging Face's default image,
the job interpreter's own version locally), not as the server's.

    check_syntax(script, python) -> None      raises ToolError(invalid_script) with the place

When the job runs the server's own Python version, the interpreter's `compile` decides (exact).
Otherwise libcst's parser does, configured for the job's version: it accepts every valid program
of that version (so nothing valid is refused, e.g. 3.12's `type` statements and nested f-string
quotes on a 3.11 server) and refuses grammar errors; a few errors that only the compiler finds
(`return` outside a function, say) pass here and fail in the job. It is slow on large scripts
(about 2 s for 256 KiB), hence an activity, not workflow code.
"""

from __future__ import annotations

import sys

from posttrain_env.errors import ErrorType, ToolError


def check_syntax(script: str, python: str) -> None:
    """Raise ToolError(invalid_script) unless `script` parses as Python `python` ("3.12")."""
    if python == f"{sys.version_info.major}.{sys.version_info.minor}":
        try:
            compile(script, "script.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
            raise ToolError(
                ErrorType.invalid_script,
                f"the script does not compile for Python {python}{where}: {exc}",
            ) from None
        return
    import libcst  # slow to import, and needed only here
    from libcst._parser.types.config import KNOWN_PYTHON_VERSION_STRINGS

    version = python if python in KNOWN_PYTHON_VERSION_STRINGS else KNOWN_PYTHON_VERSION_STRINGS[-1]
    try:
        libcst.parse_module(script, config=libcst.PartialParserConfig(python_version=version))
    except libcst.ParserSyntaxError as exc:
        raise ToolError(
            ErrorType.invalid_script,
            f"the script is not valid Python {python} (line {exc.editor_line}): {exc.message}",
        ) from None
