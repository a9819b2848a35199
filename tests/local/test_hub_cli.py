"""`posttrain-env hub`: importing base models and datasets into the local hub."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from activities.backends.local.hub import LocalHub
from posttrain_server.commands.hub import add_hub_commands, run_hub


def hub(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`posttrain-env hub ...` in-process (the parser and handler the real entry point uses)."""
    parser = argparse.ArgumentParser(prog="posttrain-env")
    add_hub_commands(parser.add_subparsers(dest="command", required=True))
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.get("POSTTRAIN_STATE_DIR")
    os.environ["POSTTRAIN_STATE_DIR"] = str(state)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = run_hub(parser.parse_args(["hub", *args]))
            except SystemExit as exc:  # argparse's usage errors
                status = int(exc.code or 0)
    finally:
        if saved is None:
            del os.environ["POSTTRAIN_STATE_DIR"]
        else:
            os.environ["POSTTRAIN_STATE_DIR"] = saved
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def entry_point(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `posttrain-env hub ...` process."""
    env = {**os.environ, "POSTTRAIN_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "posttrain_server.cli", "hub", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_add_model_and_add_dataset_import_copies_and_print_their_revisions(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.safetensors").write_bytes(b"w" * 100)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"q": 1}\n')

    added = entry_point(state, "add-model", "org/model", str(model))
    assert added.returncode == 0, added.stderr
    revision = added.stdout.strip()
    assert len(revision) == 40
    again = hub(state, "add-model", "org/model", str(model))
    assert again.stdout.strip() == revision  # the same files: the same revision
    dataset = hub(state, "add-dataset", "data-only", str(data))
    assert dataset.returncode == 0, dataset.stderr

    local = LocalHub(state / "local" / "hub")
    folder = local.path("models", "org/model", revision)
    assert (folder / "sub" / "weights.safetensors").read_bytes() == b"w" * 100
    assert not (folder / "config.json").is_symlink()
    (model / "config.json").write_text('{"changed": true}')  # the source changes; the copy not
    assert (folder / "config.json").read_text() == "{}"
    changed = hub(state, "add-model", "org/model", str(model)).stdout.strip()
    assert changed != revision
    assert local.resolve("models", "org/model") == changed
    assert local.resolve("models", "org/model", revision) == revision

    listed = hub(state, "list")
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert any(
        "org/model" in line and f"main={changed}" in line and "2 rev" in line for line in lines
    )
    assert any(line.startswith("dataset") and "data-only" in line for line in lines)


def test_a_bad_repo_id_or_a_missing_folder_is_a_clear_error_without_a_traceback(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, words in (
        (("add-model", "../etc", str(folder)), "is not a repo id"),
        (("add-model", "a--b", str(folder)), "is not a repo id"),
        (("add-model", "org/x/y", str(folder)), "is not a repo id"),
        (("add-dataset", "org/data", str(tmp_path / "missing")), "is not a folder"),
        (("add-model", "org/model", str(empty)), "holds no files"),
    ):
        result = hub(tmp_path / "state", *args)
        assert result.returncode == 1, (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert result.stdout == ""
    usage = hub(tmp_path / "state", "add-model", "only-a-repo-id")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    # The installed entry point exits with the same status and message.
    real = entry_point(tmp_path / "state", "add-model", "../etc", str(folder))
    assert real.returncode == 1 and "is not a repo id" in real.stderr
    assert "Traceback" not in real.stderr
