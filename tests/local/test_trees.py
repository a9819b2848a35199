"""Removing and collecting trees a job built: never recursing on the job's depth (issue 17)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.backends.local.scratch import remove_tree


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A folder for deep trees, removed here: pytest's own clean-up of old temporary folders
    uses shutil.rmtree, which a tree this deep crashes (in every later session on the host)."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    yield folder
    remove_tree(folder)


def deep_tree(top: Path, depth: int, name: str = "d") -> Path:
    """A chain of `depth` folders under `top` (made with relative steps: the whole path may be
    longer than PATH_MAX); returns nothing usable as a path when it is that long."""
    top.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    try:
        os.chdir(top)
        for _ in range(depth):
            os.mkdir(name)
            os.chdir(name)
        with open("bottom", "wb") as fh:
            fh.write(b"x" * 4096)
    finally:
        os.chdir(here)
    return top


def test_remove_tree_removes_a_tree_deeper_than_the_recursion_limit_and_path_max(
    scratch: Path,
) -> None:
    depth = 1500
    assert depth > sys.getrecursionlimit()
    root = deep_tree(scratch / "job", depth, name="folder-" + "x" * 20)  # 42 KB of path
    remove_tree(root)
    assert not root.exists()
    assert list(scratch.iterdir()) == []


def test_remove_tree_never_follows_links_and_opens_folders_a_job_locked(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    root = tmp_path / "job"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    os.symlink(outside, root / "a" / "link-to-outside")
    os.symlink(outside / "keep", root / "file-link")
    os.mkfifo(root / "a" / "fifo")
    os.chmod(root / "a" / "b", 0)
    os.chmod(root / "a", stat.S_IRUSR | stat.S_IXUSR)
    remove_tree(root)
    assert not root.exists()
    assert (outside / "keep").read_text() == "host file"


def test_remove_tree_does_not_clobber_a_job_file_named_like_its_own_moves(tmp_path: Path) -> None:
    root = tmp_path / "job"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / ".remove-0").mkdir()  # the name remove_tree would first move `a/b` to
    (root / ".remove-0" / "x").write_text("x")
    remove_tree(root)
    assert not root.exists()
