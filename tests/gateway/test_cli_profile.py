"""`mnemo export` / `mnemo import` on a SQLite profile: a whole profile moves, secrets
never do, and an archive cannot write outside the home or over it without --force.
(``tests/cli/test_archives.py`` runs the same on both backends and across them.)"""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mnemo.archives.layout import MANIFEST
from mnemo.cli.main import main

ENV = "ANTHROPIC_API_KEY=sk-ant-secret-value\n"

# A folder provider with a secret setting that backs up its whole folder.
REMOTE_PLUGIN = """
from mnemo.memory.provider import Availability, MemoryProvider, Recall
from mnemo.memory.provider_config import ConfigField

class Remote(MemoryProvider):
    name = "remote"
    description = "a remote service"

    def get_config_schema(self):
        return (ConfigField("url", "service url"), ConfigField("token", "api token", secret=True))

    def backup_paths(self, home):
        return (home / "providers" / "remote",)

    def is_available(self, home, config):
        return Availability(True)

    def initialize(self, home, config):
        pass

    def prefetch(self, query, ctx):
        return Recall("")

    def get_tool_schemas(self):
        return ()

    def handle_tool_call(self, name, args, ctx):
        return "{}"

PROVIDER = Remote
"""


def run(home: Path, *argv: str) -> int:
    return main(["--home", str(home), *argv])


@pytest.fixture
def profile(tmp_path: Path) -> Iterator[Path]:
    """A profile with every kind of content, and a live state.db whose rows are still
    only in its WAL (the connection stays open during the test)."""
    home = tmp_path / "old"
    (home / "memories" / "users" / "telegram" / "1").mkdir(parents=True)
    (home / "memories" / "MEMORY.md").write_text("Deploys run on Fridays")
    (home / "memories" / "MEMORY.md.lock").write_text("")
    (home / "memories" / "users" / "telegram" / "1" / "USER.md").write_text("Alice prefers tea")
    (home / "memories" / "escape").symlink_to("/etc/hostname")
    (home / "skills" / "deploy").mkdir(parents=True)
    (home / "skills" / "deploy" / "SKILL.md").write_text("---\nname: deploy\n---\nsteps")
    (home / "SOUL.md").write_text("You are calm.")
    (home / "config.yaml").write_text("memory:\n  provider: holographic\n")
    (home / ".env").write_text(ENV)
    remote = home / "providers" / "remote"
    remote.mkdir(parents=True)
    (remote / "__init__.py").write_text(REMOTE_PLUGIN)
    assert (
        run(home, "providers", "setup", "remote", "--set", "url=https://r.example", "--set", "token=hunter2")
        == 0
    )
    assert (remote / "secrets.json").exists()
    assert run(home, "facts", "add", "Alice lives in Paris.", "--user", "telegram:1") == 0
    assert run(home, "sessions", "list") == 0  # a real mnemo state.db
    db = sqlite3.connect(home / "state.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.executemany(
        "INSERT INTO pairings(code, platform, user_id, created_at) VALUES (?, 'telegram', ?, 0)",
        [(f"code{i}", str(i)) for i in range(200)],
    )
    assert (home / "state.db-wal").stat().st_size > 0
    yield home
    db.close()


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]  # extractfile is None only for non-files


def test_export_takes_the_profile_and_never_the_secrets(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "profile.tar.gz"
    assert run(profile, "export", str(archive)) == 0
    out = capsys.readouterr().out
    assert "left out" in out and ".env" in out and "providers/remote/secrets.json" in out
    files = members(archive)
    tables = {name for name in files if name.startswith("data/")}
    assert set(files) - tables == {
        MANIFEST,
        "config.yaml",
        "SOUL.md",
        "memories/MEMORY.md",
        "memories/users/telegram/1/USER.md",
        "skills/deploy/SKILL.md",
        "providers/remote/__init__.py",
        "providers/remote/config.json",
    }
    assert {
        "data/state/sessions.jsonl",
        "data/state/messages.jsonl",
        "data/holographic/facts.jsonl",
    } <= tables
    blob = b"".join(files.values())
    assert b"sk-ant-secret-value" not in blob and b"hunter2" not in blob
    assert b"Alice lives in Paris." in files["data/holographic/facts.jsonl"]
    manifest = json.loads(files[MANIFEST])
    assert manifest["format"] == "mnemo-profile" and manifest["version"] == 2
    assert manifest["source"]["backend"] == "sqlite"
    assert set(manifest["files"]) == set(files) - {MANIFEST} == set(manifest["sha256"])


def test_a_live_database_is_exported_consistently(profile: Path, tmp_path: Path) -> None:
    archive = tmp_path / "p.tgz"
    assert run(profile, "export", str(archive)) == 0
    pairings = members(archive)["data/state/pairings.jsonl"].decode().splitlines()
    assert len(pairings) == 200  # the rows only in the WAL are in
    assert json.loads(members(archive)[MANIFEST])["tables"]["state/pairings"]["rows"] == 200


def test_import_restores_everything_into_a_fresh_home(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "p.tgz"
    run(profile, "export", str(archive))
    new = tmp_path / "new"
    capsys.readouterr()
    assert run(new, "import", str(archive)) == 0
    out = capsys.readouterr().out
    assert "set them again" in out and ".env" in out
    for rel in (
        "memories/MEMORY.md",
        "memories/users/telegram/1/USER.md",
        "skills/deploy/SKILL.md",
        "SOUL.md",
        "config.yaml",
    ):
        assert (new / rel).read_bytes() == (profile / rel).read_bytes()
    assert not (new / ".env").exists() and not (new / "providers" / "remote" / "secrets.json").exists()
    assert json.loads((new / "providers" / "remote" / "config.json").read_text()) == {
        "url": "https://r.example"
    }
    db = sqlite3.connect(new / "state.db")
    assert db.execute("SELECT count(*) FROM pairings").fetchone() == (200,)
    db.close()
    capsys.readouterr()
    assert run(new, "facts", "search", "where does Alice live", "--user", "telegram:1") == 0
    assert "Alice lives in Paris." in capsys.readouterr().out


def test_import_refuses_a_non_empty_home_without_force(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "p.tgz"
    run(profile, "export", str(archive))
    new = tmp_path / "busy"
    new.mkdir()
    (new / "SOUL.md").write_text("mine")
    assert run(new, "import", str(archive)) == 1
    assert "already holds data (SOUL.md); use --force" in capsys.readouterr().err
    assert sorted(p.name for p in new.iterdir() if p.name != ".mnemo.lock") == ["SOUL.md"]
    # A home holding only .env (secrets put there first) counts as empty.
    fresh = tmp_path / "only-env"
    fresh.mkdir()
    (fresh / ".env").write_text(ENV)
    assert run(fresh, "import", str(archive)) == 0
    assert (fresh / ".env").read_text() == ENV


def test_force_keeps_replaced_files_aside_and_drops_stale_wal(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "p.tgz"
    run(profile, "export", str(archive))
    new = tmp_path / "busy"
    (new / "memories").mkdir(parents=True)
    (new / "memories" / "OLD.md").write_text("old note")
    (new / "SOUL.md").write_text("mine")
    (new / "state.db").write_bytes(b"old db")
    (new / "state.db-wal").write_bytes(b"stale wal that would corrupt the new db")
    secrets = new / "providers" / "remote" / "secrets.json"
    secrets.parent.mkdir(parents=True)
    secrets.write_text('{"token": "local"}')
    capsys.readouterr()
    assert run(new, "import", str(archive), "--force") == 0
    [aside] = [p for p in new.iterdir() if p.name.startswith(".replaced-")]
    assert str(aside) in capsys.readouterr().out
    assert (aside / "SOUL.md").read_text() == "mine"
    assert (aside / "memories" / "OLD.md").read_text() == "old note"
    assert (aside / "state.db-wal").exists() and not (new / "state.db-wal").exists()
    assert not (new / "memories" / "OLD.md").exists()  # memories/ is the archive's, whole
    assert secrets.read_text() == '{"token": "local"}'  # providers/ is merged
    db = sqlite3.connect(new / "state.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


def test_an_export_written_inside_the_home_does_not_contain_itself(profile: Path) -> None:
    archive = profile / "backup.tar.gz"
    assert run(profile, "export", str(archive)) == 0
    assert "backup.tar.gz" not in members(archive)


# --- hostile archives ---------------------------------------------------------------------
def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_manifest(tar: tarfile.TarFile, version: int = 1, fmt: str = "mnemo-profile") -> None:
    add_file(tar, MANIFEST, json.dumps({"format": fmt, "version": version, "files": []}).encode())


def special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def build(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        tar.addfile(info)

    return build


HOSTILE: dict[str, tuple[Callable[[tarfile.TarFile], None], str]] = {
    "absolute": (lambda t: add_file(t, "/tmp/evil"), "absolute"),
    "dotdot": (lambda t: add_file(t, "memories/../../evil"), "escapes"),
    "symlink": (special("memories/link", tarfile.SYMTYPE, "/etc/passwd"), "link or special"),
    "hardlink": (special("memories/hard", tarfile.LNKTYPE, "config.yaml"), "link or special"),
    "device": (special("memories/dev", tarfile.CHRTYPE), "link or special"),
    "fifo": (special("memories/fifo", tarfile.FIFOTYPE), "link or special"),
    "dotenv": (lambda t: add_file(t, ".env", ENV.encode()), "never be imported"),
    "secrets": (lambda t: add_file(t, "providers/x/secrets.json"), "never be imported"),
    "stranger": (lambda t: add_file(t, "bin/run.sh"), "not part of a mnemo profile"),
    "nested state": (lambda t: add_file(t, "state.db/x"), "not part of a mnemo profile"),
    "duplicate": (lambda t: (add_file(t, "SOUL.md"), add_file(t, "SOUL.md")), "appears twice"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused_before_anything_is_written(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    build, message = HOSTILE[case]
    archive = tmp_path / "evil.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        add_manifest(tar)
        add_file(tar, "config.yaml", b"{}\n")
        build(tar)
    home = tmp_path / "home"
    assert run(home, "import", str(archive)) == 1
    assert message in capsys.readouterr().err
    assert not home.exists() or list(home.iterdir()) == []
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda t: add_file(t, "config.yaml"), "not a mnemo export"),
        (lambda t: add_manifest(t, version=3), "version 3 is not supported"),
        (lambda t: add_manifest(t, fmt="other"), "not a mnemo profile export"),
        (lambda t: add_file(t, MANIFEST, b"{broken"), "not valid JSON"),
    ],
)
def test_archives_that_are_not_mnemo_exports_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], build: Callable[[tarfile.TarFile], None], message: str
) -> None:
    archive = tmp_path / "other.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        build(tar)
    assert run(tmp_path / "home", "import", str(archive)) == 1
    assert message in capsys.readouterr().err


def test_a_file_that_is_not_an_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.tgz"
    junk.write_bytes(b"plain text")
    assert run(tmp_path / "home", "import", str(junk)) == 1
    assert "not a readable .tar.gz" in capsys.readouterr().err
    assert run(tmp_path / "home", "import", str(tmp_path / "missing.tgz")) == 2
