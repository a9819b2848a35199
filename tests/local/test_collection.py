"""A job's outputs become its artifact whole or not at all (issue 30, tracked as 41): every kind
of file a job can leave in /data/outputs, every name it can give one.

These run `activities/backends/local/collection.py` on trees made here, as root (devices and
other owners need it); tests/local/test_sandbox.py runs the same through real jobs.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from activities.backends.local.collection import Caps, collect, escaped, survey
from activities.backends.local.scratch import remove_tree
from posttrain_env.limits import MAX_ARTIFACT_DEPTH, MAX_ARTIFACT_PATH_BYTES

MIB = 1 << 20
CAPS = Caps(artifact_bytes=64 * MIB, entries=1000)


def outputs_with(tmp_path: Path) -> Path:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "model.safetensors").write_bytes(b"weights")
    (outputs / "sub").mkdir()
    (outputs / "sub" / "notes.txt").write_text("notes")
    return outputs


def allocated(path: Path) -> int:
    return path.lstat().st_blocks * 512


def test_regular_files_and_folders_are_kept_whole_with_inert_modes(tmp_path: Path) -> None:
    outputs = outputs_with(tmp_path)
    os.chmod(outputs / "sub" / "notes.txt", 0o4777)  # setuid and world-writable in the job
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is None
    assert (done.files, done.bytes) == (2, len(b"weights") + len(b"notes"))
    artifact = tmp_path / "artifact"
    assert (artifact / "model.safetensors").read_bytes() == b"weights"
    assert (artifact / "sub" / "notes.txt").read_text() == "notes"
    modes = {stat.S_IMODE(p.lstat().st_mode) for p in artifact.rglob("*")}
    assert modes == {0o755, 0o644}
    assert not (tmp_path / "artifact.partial").exists()


def test_a_sparse_file_is_counted_by_its_apparent_size_and_kept_sparse(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    with open(outputs / "big.bin", "wb") as fh:
        fh.write(b"head")
        fh.seek(40 * MIB)
        fh.write(b"middle")
        fh.truncate(60 * MIB)  # a trailing hole too
    done = collect(outputs, tmp_path / "artifact", CAPS)
    copy = tmp_path / "artifact" / "big.bin"
    assert done.refusal is None
    assert done.bytes == 60 * MIB == copy.stat().st_size  # what the episode is charged for
    assert allocated(copy) < 1 * MIB  # what the host holds: the data, not the holes
    with open(copy, "rb") as fh:
        assert fh.read(4) == b"head"
        fh.seek(40 * MIB)
        assert fh.read(6) == b"middle"
        fh.seek(30 * MIB)
        assert fh.read(16) == bytes(16)


def test_a_huge_sparse_file_over_the_cap_is_refused_by_how_much_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    outputs = outputs_with(tmp_path)
    with open(outputs / "big.bin", "wb") as fh:
        fh.truncate(1900 * MIB)  # no disk of the job's own, 1,900 MiB of artifact
    done = collect(outputs, tmp_path / "artifact", Caps(artifact_bytes=1024 * MIB, entries=100))
    assert done.refusal is not None
    assert done.refusal.type == "limit_reached" and done.refusal.cap == "artifact"
    over = 1900 * MIB + len(b"weights") + len(b"notes") - 1024 * MIB
    assert done.refusal.over_by_bytes == over
    assert f"{over} over this job's artifact cap" in done.refusal.message
    assert (done.files, done.bytes) == (0, 0)
    assert list((tmp_path / "artifact").iterdir()) == []


def test_the_episode_storage_left_caps_the_artifact_and_names_itself(tmp_path: Path) -> None:
    outputs = outputs_with(tmp_path)
    (outputs / "more.bin").write_bytes(b"x" * 1000)
    caps = Caps(artifact_bytes=64 * MIB, entries=100, storage_bytes=500, storage_cap_bytes=4000)
    done = collect(outputs, tmp_path / "artifact", caps)
    assert done.refusal is not None and done.refusal.cap == "storage"
    assert done.refusal.cap_bytes == 4000
    assert done.refusal.over_by_bytes == 1000 + 12 - 500
    assert "this episode could still keep" in done.refusal.message
    assert list((tmp_path / "artifact").iterdir()) == []


def test_exactly_at_the_cap_is_kept(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "a").write_bytes(b"x" * 100)
    done = collect(outputs, tmp_path / "artifact", Caps(artifact_bytes=100, entries=10))
    assert done.refusal is None and done.bytes == 100


def test_a_hard_link_is_a_file_per_name_counted_per_name(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "a.bin").write_bytes(b"y" * 1000)
    os.link(outputs / "a.bin", outputs / "b.bin")
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is None and (done.files, done.bytes) == (2, 2000)
    a, b = (tmp_path / "artifact" / n for n in ("a.bin", "b.bin"))
    assert a.read_bytes() == b.read_bytes() == b"y" * 1000
    assert a.stat().st_ino != b.stat().st_ino and a.stat().st_nlink == 1


@pytest.mark.parametrize("kind", ["symlink", "fifo", "socket", "char_device", "block_device"])
def test_anything_but_a_folder_or_a_regular_file_refuses_the_whole_artifact(
    tmp_path: Path, kind: str
) -> None:
    outputs = outputs_with(tmp_path)
    where = outputs / "sub" / "odd"
    if kind == "symlink":
        os.symlink("/etc/passwd", where)
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(where))
    elif kind == "char_device":
        os.mknod(where, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    else:
        os.mknod(where, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # a loop device's
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is not None and done.refusal.type == "not_allowed"
    expected = {
        "symlink": "a symbolic link",
        "fifo": "a named pipe (fifo)",
        "socket": "a socket",
        "char_device": "a character device",
        "block_device": "a block device",
    }[kind]
    assert f"/data/outputs/sub/odd: it is {expected}" in done.refusal.message
    assert list((tmp_path / "artifact").iterdir()) == []  # not the two regular files either
    assert os.path.realpath("/etc/passwd") and Path("/etc/passwd").exists()


def test_outputs_that_are_a_link_are_refused_and_never_followed(tmp_path: Path) -> None:
    os.symlink("/etc", tmp_path / "outputs")
    done = collect(tmp_path / "outputs", tmp_path / "artifact", CAPS)
    assert (
        done.refusal is not None and "/data/outputs: it is a symbolic link" in done.refusal.message
    )
    assert list((tmp_path / "artifact").iterdir()) == []


def test_no_outputs_is_an_empty_artifact(tmp_path: Path) -> None:
    done = collect(tmp_path / "outputs", tmp_path / "artifact", CAPS)
    assert done.refusal is None and (done.files, done.bytes) == (0, 0)
    assert (tmp_path / "artifact").is_dir()


def test_a_name_that_is_not_utf8_is_refused_with_its_bytes_escaped(tmp_path: Path) -> None:
    outputs = outputs_with(tmp_path)
    with open(os.path.join(os.fsencode(outputs), b"\xff\xfe-x"), "w") as fh:
        fh.write("x")
    (outputs / "zzz-after").write_text("after")  # a name collection would reach after it
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is not None and done.refusal.type == "not_allowed"
    assert "/data/outputs/\\xff\\xfe-x: its name is not UTF-8" in done.refusal.message
    done.refusal.message.encode()  # the message itself is valid text
    assert list((tmp_path / "artifact").iterdir()) == []


@pytest.mark.parametrize("name", ["line\nbreak", "tab\there", "esc\x1b[31m", "del\x7f", "c1\x85"])
def test_a_name_with_control_characters_is_refused_with_them_escaped(
    tmp_path: Path, name: str
) -> None:
    outputs = outputs_with(tmp_path)
    (outputs / name).write_text("x")
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is not None
    assert f"/data/outputs/{escaped(name)}: its name holds a control character" in (
        done.refusal.message
    )
    assert "\n" not in done.refusal.message and "\x1b" not in done.refusal.message


def test_unicode_names_are_kept(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "modèle-权重 🙂.safetensors").write_bytes(b"w")
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is None
    assert (tmp_path / "artifact" / "modèle-权重 🙂.safetensors").read_bytes() == b"w"


def deep(top: Path, depth: int) -> None:
    here = os.getcwd()
    try:
        os.chdir(top)
        for _ in range(depth):
            os.mkdir("d")
            os.chdir("d")
        Path("bottom").write_bytes(b"x")
    finally:
        os.chdir(here)


def test_a_tree_deeper_than_the_artifact_may_go_is_refused_not_cut(tmp_path: Path) -> None:
    outputs = outputs_with(tmp_path)
    try:
        deep(outputs, 1500)  # far past the recursion limit and PATH_MAX
        done = collect(outputs, tmp_path / "artifact", Caps(artifact_bytes=MIB, entries=5000))
        assert done.refusal is not None
        assert f"it is more than {MAX_ARTIFACT_DEPTH} folders deep" in done.refusal.message
        assert list((tmp_path / "artifact").iterdir()) == []
    finally:
        remove_tree(outputs)


def test_a_tree_exactly_as_deep_as_allowed_is_kept(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    deep(outputs, MAX_ARTIFACT_DEPTH - 1)  # the file at the bottom is the last level
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is None and done.files == 1
    assert (tmp_path / "artifact" / ("d/" * (MAX_ARTIFACT_DEPTH - 1)) / "bottom").is_file()


def test_a_path_longer_than_the_artifact_holds_is_refused(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    path = outputs
    for _ in range(MAX_ARTIFACT_PATH_BYTES // 201 + 1):
        path = path / ("n" * 200)
    path.mkdir(parents=True)
    done = collect(outputs, tmp_path / "artifact", CAPS)
    assert done.refusal is not None
    assert f"longer than {MAX_ARTIFACT_PATH_BYTES} bytes" in done.refusal.message


def test_more_entries_than_the_cap_refuse_the_artifact(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    for n in range(11):
        (outputs / str(n)).write_text("x")
    done = collect(outputs, tmp_path / "artifact", Caps(artifact_bytes=MIB, entries=10))
    assert done.refusal is not None and done.refusal.cap == "entries"
    assert survey(outputs, Caps(artifact_bytes=MIB, entries=11)).refusal is None


def test_a_copy_that_fails_leaves_no_artifact_at_all(tmp_path: Path) -> None:
    outputs = outputs_with(tmp_path)
    target = tmp_path / "artifact"
    # A file whose name exists in the half-made copy already: the create (O_EXCL) fails.
    os.mkdir(tmp_path / "artifact.partial")
    with pytest.raises(OSError):
        collect(outputs, target, CAPS)
    assert not target.exists()


def test_the_escape_keeps_printable_text_and_cuts_long_names() -> None:
    assert escaped("ok/ünïcode") == "ok/ünïcode"
    assert escaped(os.fsdecode(b"a\xffb")) == "a\\xffb"
    assert escaped("a\nb\x00"[:3]) == "a\\nb"
    assert len(escaped("x" * 1000)) == 200
