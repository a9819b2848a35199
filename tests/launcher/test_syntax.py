"""A script's syntax is checked for the Python its job runs, not the server's (issue 13)."""

from __future__ import annotations

import sys

import pytest

from job_launcher.syntax import check_syntax
from posttrain_env.errors import ErrorType, ToolError

SERVER = f"{sys.version_info.major}.{sys.version_info.minor}"
# Valid on 3.12 only: a `type` statement (PEP 695) and an f-string reusing its quotes (PEP 701).
PY312_ONLY = 'type Pair = tuple[int, int]\nprint(f"{"nested"}")\n'


def test_the_server_runs_python_3_11() -> None:
    assert SERVER == "3.11"  # what the cases below are about


def test_a_312_only_script_is_valid_for_312_jobs_and_not_for_311_jobs() -> None:
    check_syntax(PY312_ONLY, "3.12")
    check_syntax(PY312_ONLY, "3.13")
    with pytest.raises(ToolError) as refused:
        check_syntax(PY312_ONLY, "3.11")
    assert refused.value.type is ErrorType.invalid_script
    assert "Python 3.11" in refused.value.message


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_a_syntax_error_is_an_invalid_script_naming_the_version(python: str) -> None:
    with pytest.raises(ToolError) as refused:
        check_syntax("def broken(:\n    pass\n", python)
    assert refused.value.type is ErrorType.invalid_script
    assert f"Python {python}" in refused.value.message and "line" in refused.value.message


def test_a_version_newer_than_the_parser_knows_is_checked_as_the_newest_it_knows() -> None:
    check_syntax("x = 1\n", "3.99")
    with pytest.raises(ToolError):
        check_syntax("x = = 1\n", "3.99")


def test_syntax_newer_than_an_older_jobs_python_is_refused_for_it() -> None:
    groups = "try:\n    pass\nexcept* ValueError:\n    pass\n"
    check_syntax(groups, "3.11")
    with pytest.raises(ToolError) as refused:
        check_syntax(groups, "3.10")
    assert refused.value.type is ErrorType.invalid_script
    assert "Python 3.10" in refused.value.message and "Exception groups" in refused.value.message
    match = "match x:\n    case 1:\n        pass\n"
    check_syntax(match, "3.10")
    with pytest.raises(ToolError):
        check_syntax(match, "3.9")


def test_a_compile_error_is_found_for_an_older_jobs_python_too() -> None:
    with pytest.raises(ToolError) as refused:
        check_syntax("return 1\n", "3.10")
    assert refused.value.type is ErrorType.invalid_script and "outside function" in (
        refused.value.message
    )


@pytest.mark.parametrize("python", ["3", "python3.12", "2.7", ""])
def test_a_python_that_is_no_version_is_a_caller_error(python: str) -> None:
    with pytest.raises(ValueError, match=r"3\.<minor>"):
        check_syntax("x = 1\n", python)
