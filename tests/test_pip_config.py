"""Where local jobs' wheels come from: pip's configured find-links, and the server setting
POSTTRAIN_LOCAL_FIND_LINKS that overrides them (never anything a job sets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain_common import pip_config
from posttrain_common.pip_config import pip_find_links
from posttrain_common.settings import Settings


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "wheels-a", tmp_path / "wheels-b"
    first.mkdir()
    second.mkdir()
    return first, second


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's pip configuration stays out: the system-wide files are not read, and the
    per-user ones (~/.pip, ~/.config/pip) come from an empty HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    user_files = [path for path in pip_config.CONFIG_FILES if str(path).startswith("~")]
    assert len(user_files) == 2
    monkeypatch.setattr(pip_config, "CONFIG_FILES", tuple(user_files))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    return home


def config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "pip.conf"
    path.write_text(text)
    return {"PIP_CONFIG_FILE": str(path)}


def test_pips_find_links_are_its_existing_local_folders_only(
    tmp_path: Path, folders: tuple[Path, Path]
) -> None:
    first, second = folders
    environ = config(
        tmp_path,
        f"[global]\nfind-links = {first}\n  file://{second}\n  {tmp_path / 'missing'}\n"
        "  https://example.org/wheels\n",
    )
    assert pip_find_links(environ) == [str(first), str(second)]


def test_the_per_user_file_is_read_and_pip_config_file_read_after_it(
    tmp_path: Path, home: Path, folders: tuple[Path, Path]
) -> None:
    first, second = folders
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nfind-links = {first}\n")
    assert pip_find_links({}) == [str(first)]
    assert pip_find_links(config(tmp_path, f"[global]\nfind-links = {second}\n")) == [str(second)]


def test_the_install_section_and_the_environment_win_as_they_do_for_pip(
    tmp_path: Path, folders: tuple[Path, Path]
) -> None:
    first, second = folders
    environ = config(
        tmp_path, f"[global]\nfind-links = {first}\n[install]\nfind-links = {second}\n"
    )
    assert pip_find_links(environ) == [str(second)]
    assert pip_find_links({**environ, "PIP_FIND_LINKS": f"{first} {second}"}) == [
        str(first),
        str(second),
    ]


def test_a_pip_configuration_pip_could_not_read_gives_no_folders(tmp_path: Path) -> None:
    assert pip_find_links(config(tmp_path, "find-links without a section\n[[[")) == []
    assert pip_find_links({"PIP_CONFIG_FILE": str(tmp_path / "absent.conf")}) == []


def test_the_setting_defaults_to_pips_find_links(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = folders
    monkeypatch.delenv("POSTTRAIN_LOCAL_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", str(first))
    assert Settings().local_find_link_list == [str(first)]


def test_the_setting_names_the_folders_or_none_whatever_pip_says(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = folders
    monkeypatch.setenv("PIP_FIND_LINKS", str(first))
    monkeypatch.setenv("POSTTRAIN_LOCAL_FIND_LINKS", f" {second} ,, /elsewhere ")
    assert Settings().local_find_link_list == [str(second), "/elsewhere"]
    monkeypatch.setenv("POSTTRAIN_LOCAL_FIND_LINKS", "")
    assert Settings().local_find_link_list == []  # empty: no folders, not pip's
