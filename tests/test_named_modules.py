"""Every module a comment, a docstring or a page of the docs names exists (issue 45: seven of
them named files gone since the move to feature folders, `episode_tools` and the like).

A name is a path or a file name ending in `.py`: a path must be a file of the repository (or
end one), a bare name the name of one. A path into another project must be a file of it where
it is installed here; the few named files that are no module of any project are listed below.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `workflows/job/contract.py`, `train.py`; not `<workflow>_contract.py` (a pattern), nor a
# name's tail (`x.train.py` names no `train` module).
NAMED = re.compile(r"(?<![\w./<>-])((?:[\w-]+/)*[A-Za-z][\w-]*\.py)\b")
# Files named that are no module of ours or of an installed project.
NOT_MODULES = {
    "train.py": "the agent's script, written where the client runs (a task's reference solution)",
    "first_client.py": "docs/getting-started.md's program, saved by whoever follows the page",
}
# Projects whose files are named but which are not installed in the server's environment.
NOT_INSTALLED = {
    "bfcl_eval": "BFCL's wheel: `tasks fetch` reads its files and never installs it",
    "trl": "installed in training jobs' venvs only (tests/training pins it)",
}


def tracked(suffix: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", f"*{suffix}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return listed.stdout.split()


def parsed(source: str) -> ast.Module:
    """ast.parse, again once on CPython 3.11's spurious "AST constructor recursion depth
    mismatch" SystemError (gh-106905: its depth counter leaks on an error path; seen once in a
    loaded suite, in a process with other threads). A real syntax error still raises."""
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def names_in(path: str) -> Iterator[tuple[int, str]]:
    text = (ROOT / path).read_text()
    if path.endswith(".md"):
        passages: Iterator[tuple[int, str]] = enumerate(text.splitlines(), 1)
    else:
        passages = comments_and_docstrings(text)
    for line, passage in passages:
        for found in NAMED.finditer(passage):
            yield line + passage.count("\n", 0, found.start()), found.group(1)


def installed_file(name: str) -> bool | None:
    """Whether `name` (`openenv/core/__init__.py`) is a file of the installed project its first
    part names; None when no installed project has that name."""
    top = name.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return any((Path(p).parent / name).is_file() for p in spec.submodule_search_locations)


def exists(name: str, files: set[str], basenames: set[str]) -> bool:
    if name in NOT_MODULES:
        return True
    if "/" not in name:
        return name in basenames
    if name in files or any(f.endswith(f"/{name}") for f in files):
        return True
    if name.split("/", 1)[0] in NOT_INSTALLED:
        return True
    return bool(installed_file(name))


def test_every_module_named_in_a_comment_docstring_or_page_exists() -> None:
    files = set(tracked(""))
    basenames = {Path(f).name for f in files}
    named = [
        (path, line, name)
        for path in tracked(".py") + tracked(".md")
        for line, name in names_in(path)
    ]
    assert len(named) > 300  # the code names its modules often: the scan reads them
    missing = [
        f"{p}:{line}: {name}" for p, line, name in named if not exists(name, files, basenames)
    ]
    assert missing == [], "named but not found (a module moved or gone?):\n" + "\n".join(missing)


def test_the_scan_finds_a_stale_name_and_passes_what_exists() -> None:
    source = (
        '"""Its tools (`episode_tools.py`); the jobs (workflows/episode/jobs.py)."""\n'
        "# the ids live in workflows/ids.py, BFCL's in bfcl_eval/eval_checker/x.py\n"
        "X = 'train.py'  # a string in code is not a comment: nothing named here\n"
    )
    named = [
        name
        for _line, name in comments_and_docstrings(source)
        for name in [m.group(1) for m in NAMED.finditer(name)]
    ]
    assert sorted(named) == [
        "bfcl_eval/eval_checker/x.py",
        "episode_tools.py",
        "workflows/episode/jobs.py",
        "workflows/ids.py",
    ]
    files = set(tracked(""))
    basenames = {Path(f).name for f in files}
    assert [n for n in named if not exists(n, files, basenames)] == ["episode_tools.py"]
    assert installed_file("openenv/core/__init__.py") is True
    assert installed_file("openenv/core/no_such_module.py") is False
