"""Unit tests of job_launcher.requirements: the broker's and the builder's shared checks."""

from __future__ import annotations

import re

import pytest

from job_launcher import launcher
from job_launcher.requirements import (
    EXCLUDE_NEWER_PATTERN,
    STRICT_REQUIREMENT_PATTERN,
    merged_dependencies,
    script_dependencies,
    script_exclude_newer,
    validate_requirements,
    validate_script,
)
from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import MAX_DEPENDENCIES, MAX_SCRIPT_BYTES


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("numpy", "numpy"),
        ("  NumPy  ", "numpy"),
        ("Transformers[Torch,accel]>=4.40,<5", "transformers[accel,torch]<5,>=4.40"),
        ('trl==0.9.6; python_version >= "3.10"', 'trl==0.9.6; python_version >= "3.10"'),
        ("foo ; sys_platform=='linux'", 'foo; sys_platform == "linux"'),
        ("torch==2.13.0+cpu", "torch==2.13.0+cpu"),
        ("Zope.Interface~=6.0", "zope-interface~=6.0"),
        ("peft==0.11.*", "peft==0.11.*"),
    ],
)
def test_plain_requirements_are_normalized(raw: str, normalized: str) -> None:
    assert validate_requirements([raw]) == [normalized]
    # The normalized form is what the launcher's strict pattern re-checks, and it is stable.
    assert re.fullmatch(STRICT_REQUIREMENT_PATTERN, normalized)
    assert validate_requirements([normalized]) == [normalized]


@pytest.mark.parametrize(
    "raw",
    [
        "foo @ https://example.com/foo-1.0-py3-none-any.whl",
        "foo @ file:///tmp/foo-1.0-py3-none-any.whl",
        "git+https://github.com/org/repo.git",
        "foo @ git+https://github.com/org/repo.git@main",
        "./local/package",
        "/abs/path/foo-1.0-py3-none-any.whl",
        "https://example.com/foo.tar.gz",
        "-e .",
        "-r requirements.txt",
        "--index-url https://evil.example/simple",
        "--extra-index-url=https://evil.example/simple",
        "--find-links /tmp",
        "foo --index-url https://evil.example/simple",
        "foo==1.0 --hash=sha256:abcd",
        "foo\n--index-url https://evil.example/simple",
        "foo===1.0/../x",
        "C:\\packages\\foo.whl",
        "",
        "   ",
        "x" * 300,
    ],
)
def test_urls_paths_vcs_and_options_are_invalid_dependencies(raw: str) -> None:
    with pytest.raises(ToolError) as info:
        validate_requirements([raw])
    assert info.value.type is ErrorType.invalid_dependency
    assert info.value.details["requirement"] == raw
    assert "PyPI" in info.value.message


def test_one_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(ToolError) as info:
        validate_requirements("numpy")
    assert info.value.type is ErrorType.invalid_dependency


def test_non_string_requirement_is_refused() -> None:
    with pytest.raises(ToolError) as info:
        validate_requirements([3])  # type: ignore[list-item]
    assert info.value.type is ErrorType.invalid_dependency


def test_launcher_re_checks_with_the_same_strict_pattern() -> None:
    assert launcher.STRICT_REQUIREMENT_PATTERN == STRICT_REQUIREMENT_PATTERN
    assert launcher.EXCLUDE_NEWER_PATTERN == EXCLUDE_NEWER_PATTERN
    assert launcher.MAX_PACKAGES == MAX_DEPENDENCIES


HEADER = """\
# /// script
# requires-python = ">=3.12"
# dependencies = [
#   "numpy>=1.26",
#   "Transformers[torch]",
# ]
# [tool.uv]
# index-url = "https://evil.example/simple"
# exclude-newer = "2024-01-01T00:00:00Z"
# ///
import numpy
"""


def test_script_dependencies_reads_only_the_dependencies_of_the_script_block() -> None:
    assert script_dependencies(HEADER) == ["numpy>=1.26", "Transformers[torch]"]


def test_script_without_a_block_has_no_dependencies() -> None:
    assert script_dependencies("print('hi')\n# /// not closed\n") == []
    assert script_dependencies("# /// pyproject\n# x = 1\n# ///\n") == []


@pytest.mark.parametrize(
    "script",
    [
        "# /// script\n# dependencies = [\n# ///\n",
        '# /// script\n# dependencies = "numpy"\n# ///\n',
        "# /// script\n# dependencies = [1, 2]\n# ///\n",
        "# /// script\n# dependencies = []\n# ///\n# /// script\n# dependencies = []\n# ///\n",
    ],
)
def test_malformed_script_block_is_an_invalid_script(script: str) -> None:
    with pytest.raises(ToolError) as info:
        script_dependencies(script)
    assert info.value.type is ErrorType.invalid_script


def test_validate_script_accepts_a_compiling_utf8_script() -> None:
    validate_script("print('héllo ✓')\n")


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("def f(:\n    pass\n", "compile"),
        ("print('\udcff')\n", "UTF-8"),
        ("x = 1\0\n", "NUL"),
        ("#" * (MAX_SCRIPT_BYTES + 1), str(MAX_SCRIPT_BYTES)),
    ],
)
def test_invalid_scripts_are_refused_with_the_reason(script: str, needle: str) -> None:
    with pytest.raises(ToolError) as info:
        validate_script(script)
    assert info.value.type is ErrorType.invalid_script
    assert needle in info.value.message


def test_script_at_the_size_limit_is_accepted() -> None:
    validate_script("#" * MAX_SCRIPT_BYTES)


def test_merged_dependencies_is_the_deduplicated_ordered_union() -> None:
    merged = merged_dependencies(HEADER, ["torch==2.13.0", "NUMPY>=1.26", "peft"])
    assert merged == ["torch==2.13.0", "numpy>=1.26", "peft", "transformers[torch]"]


def test_merged_dependencies_refuses_a_bad_header_dependency() -> None:
    script = '# /// script\n# dependencies = ["foo @ https://evil.example/foo.whl"]\n# ///\n'
    with pytest.raises(ToolError) as info:
        merged_dependencies(script, ["numpy"])
    assert info.value.type is ErrorType.invalid_dependency
    assert info.value.details["requirement"] == "foo @ https://evil.example/foo.whl"


def test_merged_dependencies_are_capped() -> None:
    exactly = [f"pkg{i}" for i in range(MAX_DEPENDENCIES)]
    assert len(merged_dependencies("", exactly)) == MAX_DEPENDENCIES
    script = '# /// script\n# dependencies = ["one-more"]\n# ///\n'
    with pytest.raises(ToolError) as info:
        merged_dependencies(script, exactly)
    assert info.value.type is ErrorType.invalid_dependency
    assert str(MAX_DEPENDENCIES) in info.value.message


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ('# [tool.uv]\n# exclude-newer = "2026-11-30T00:00:00Z"\n', "2026-11-30T00:00:00Z"),
        ('# [tool.uv]\n# exclude-newer = "2025-06-01"\n', "2025-06-01"),
        (
            '# [tool.uv]\n# exclude-newer = "2025-06-01T10:00:00.5+02:00"\n',
            "2025-06-01T10:00:00.5+02:00",
        ),
        ("# dependencies = []\n", None),
    ],
)
def test_an_evaluators_exclude_newer_is_read_from_its_header(header: str, expected) -> None:
    script = f"# /// script\n{header}# ///\nprint(1)\n"
    assert script_exclude_newer(script) == expected
    assert script_exclude_newer("print(1)\n") is None


@pytest.mark.parametrize(
    "value", ['"yesterday"', '"2025-06-01 --index-url x"', "20250601", '"2025-06-01T10:00"']
)
def test_an_exclude_newer_that_is_not_an_rfc_3339_time_is_refused(value: str) -> None:
    script = f"# /// script\n# [tool.uv]\n# exclude-newer = {value}\n# ///\nprint(1)\n"
    with pytest.raises(ToolError) as info:
        script_exclude_newer(script)
    assert info.value.type is ErrorType.invalid_script
