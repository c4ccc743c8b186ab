"""Files that hold conversations are private whatever the umask: 0600 for files
(``state.db`` and its ``-wal``/``-shm``, the holographic ``facts.db``, provider
settings), 0700 for every folder created in the profile (``providers/``, imported
``memories/users/...``)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.provider_config import write_provider_config
from mnemo.memory.scope import UserRef
from mnemo.providers.holographic.store import FactStore, NewFact


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual default: what the code must not rely on."""
    old = os.umask(0o022)
    yield
    os.umask(old)


async def test_state_db_and_its_wal_and_shm_are_0600_in_a_0700_home(tmp_path: Path) -> None:
    home = tmp_path / "new" / "home"
    db = state_database(home / "state.db")
    await db.open()
    try:
        await db.write(lambda c: c.execute("CREATE TABLE IF NOT EXISTS t(x)"))
        await db.write(lambda c: c.execute("INSERT INTO t VALUES (1)"))
        files = {p.name: mode(p) for p in home.iterdir() if p.name.startswith("state.db")}
        assert files == {"state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600}
    finally:
        await db.close()
    assert mode(home) == 0o700 and mode(home.parent) == 0o700


def test_the_holographic_facts_db_is_0600_under_0700_folders(home: Path) -> None:
    store = FactStore(home / "providers" / "holographic" / "facts.db")
    store.open()
    try:
        store.add(NewFact(owner="telegram:42", content="Ada likes green tea"))
        files = {p.name: mode(p) for p in (home / "providers" / "holographic").iterdir()}
    finally:
        store.close()
    assert files["facts.db"] == 0o600 and files.get("facts.db-wal", 0o600) == 0o600, files
    assert mode(home / "providers") == 0o700 and mode(home / "providers" / "holographic") == 0o700


def test_provider_settings_folders_are_0700(home: Path) -> None:
    path = write_provider_config(home, "someprovider", (), {})
    assert mode(path.parent) == 0o700 and mode(home / "providers") == 0o700
    assert mode(path) & 0o077 == 0


def test_an_imported_profile_has_private_folders_all_the_way_down(tmp_path: Path) -> None:
    source = tmp_path / "old"
    files = MemoryFiles(source / "memories", 2200, 1375)
    files.user(UserRef("telegram", "42")).add("Ada, prefers short answers")
    archive = tmp_path / "profile.tar.gz"
    assert main(["--home", str(source), "export", str(archive)]) == 0

    home = tmp_path / "moved"
    assert main(["--home", str(home), "import", str(archive)]) == 0
    user_md = home / "memories" / "users" / "telegram" / "42" / "USER.md"
    assert user_md.is_file()
    folders = [user_md.parent, *[p for p in user_md.parents if p.is_relative_to(home)]]
    assert {str(p.relative_to(tmp_path)): mode(p) for p in folders} == {
        str(p.relative_to(tmp_path)): 0o700 for p in folders
    }
    assert mode(user_md) == 0o600
    assert {p.name: mode(p) for p in home.glob("state.db*")} == {"state.db": 0o600}
