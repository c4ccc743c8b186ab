"""Automatic backups (mnemo/backups.py, `mnemo backup …`): scheduled on a controlled
clock, pruned beyond ``backup.keep``, verified (a flipped byte or a changed member is
caught), restored into a stopped profile, consistent while the bot writes."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sqlite3
import stat
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.archives.restore import verify_archive
from mnemo.backups import BackupScheduler, backup_now, list_backups, prune
from mnemo.cli.main import main
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.errors import ArchiveRefused
from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.sessions import NewMessage, SessionStore
from mnemo.profile_lock import hold

START = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def settings_for(home: Path, **overrides: object) -> Settings:
    return load_settings(home, environ={}, overrides={"gateway.timezone": "Europe/Berlin", **overrides})


async def seed(home: Path, texts: list[str]) -> None:
    db = state_database(home / "state.db")
    await db.open()
    try:
        store = SessionStore(db)
        s = await store.create_session(
            chat_key="telegram:1",
            platform="telegram",
            chat_id="1",
            thread_id=None,
            user_id="1",
            agent_context="dm",
            source="chat",
            model="m",
            system_prompt="",
        )
        await store.append_messages(s.id, [NewMessage("user", t) for t in texts])
    finally:
        await db.close()
    MemoryFiles(home / "memories", 2200, 1375).shared().add("the deploy runs on Fridays")


def contents(db_path: Path) -> list[str]:
    conn = sqlite3.connect(db_path)
    try:
        return [r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")]
    finally:
        conn.close()


def unpack_member(archive: Path, name: str, where: Path) -> Path:
    with tarfile.open(archive, "r:gz") as tar:
        f = tar.extractfile(name)
        assert f is not None
        out = where / Path(name).name
        out.write_bytes(f.read())
    return out


class Time:
    """A clock the scheduler's sleep moves forward; done once it passes ``end``."""

    def __init__(self, now: datetime, end: datetime) -> None:
        self.now, self.end = now, end
        self.done = asyncio.Event()
        self.slept: list[float] = []

    def clock(self) -> datetime:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)
        if self.now > self.end:
            self.done.set()
            await asyncio.Event().wait()  # parked until the scheduler stops
        await asyncio.sleep(0)


async def test_scheduled_backups_run_at_04_local_and_are_pruned_beyond_keep(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    await seed(home, ["hello"])
    settings = settings_for(home, **{"backup.keep": 2})
    time = Time(START, START + timedelta(days=3))
    scheduler = BackupScheduler(settings, clock=time.clock, sleep=time.sleep)
    await scheduler.start()
    try:
        await time.done.wait()
    finally:
        await scheduler.stop()
    folder = home / "backups"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    # 04:00 in Berlin (UTC+1 in January) is 03:00 UTC; three ran, the oldest was pruned.
    assert [b.created for b in list_backups(folder)] == [
        datetime(2026, 1, 12, 3, 0, tzinfo=UTC),
        datetime(2026, 1, 13, 3, 0, tzinfo=UTC),
    ]
    assert scheduler.last == list_backups(folder)[-1].path and scheduler.last_error is None
    assert all(stat.S_IMODE(b.path.stat().st_mode) == 0o600 for b in list_backups(folder))
    assert verify_archive(scheduler.last).rows >= 2
    assert not list(folder.glob(".*.tmp"))  # written through a temp file, renamed


def test_next_run_follows_the_crontab_in_local_time(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, **{"backup.schedule": "30 2 * * 0"})
    scheduler = BackupScheduler(settings)
    # Sundays 02:30 Berlin; 2026-07-12 is a Sunday (summer: UTC+2).
    assert scheduler.next_run(datetime(2026, 7, 8, tzinfo=UTC)) == datetime(2026, 7, 12, 0, 30, tzinfo=UTC)


def test_prune_keeps_the_newest_and_leaves_other_files_alone(tmp_path: Path) -> None:
    for day in range(1, 6):
        (tmp_path / f"mnemo-backup-202601{day:02d}-030000.tar.gz").write_bytes(b"x")
    (tmp_path / "my-notes.tar.gz").write_bytes(b"keep me")
    removed = prune(tmp_path, 2)
    assert [p.name for p in removed] == [f"mnemo-backup-202601{d:02d}-030000.tar.gz" for d in (1, 2, 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mnemo-backup-20260104-030000.tar.gz",
        "mnemo-backup-20260105-030000.tar.gz",
        "my-notes.tar.gz",
    ]


async def test_verify_catches_a_flipped_byte_and_a_changed_member(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    await seed(home, [f"message {i} " + "x" * 200 for i in range(200)])
    archive = backup_now(settings_for(home), START).path
    assert verify_archive(archive).rows >= 200

    flipped = tmp_path / "flipped.tar.gz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    with pytest.raises(ArchiveRefused):
        verify_archive(flipped)

    # A well-formed archive whose MEMORY.md differs from what the manifest recorded.
    changed = tmp_path / "changed.tar.gz"
    with tarfile.open(archive, "r:gz") as src, tarfile.open(changed, "w:gz") as dst:
        for info in src.getmembers():
            body = src.extractfile(info).read() if info.isfile() else b""
            if info.name == "memories/MEMORY.md":
                body = body.replace(b"Fridays", b"Mondays")
                info.size = len(body)
            dst.addfile(info, io.BytesIO(body) if info.isfile() else None)
    with pytest.raises(ArchiveRefused, match="memories/MEMORY.md does not match its checksum"):
        verify_archive(changed)

    # A member whose rows were cut short, its checksum recomputed: the count catches it.
    short = tmp_path / "short.tar.gz"
    with tarfile.open(archive, "r:gz") as src, tarfile.open(short, "w:gz") as dst:
        manifest = json.loads(src.extractfile("mnemo-export.json").read())
        for info in src.getmembers():
            body = src.extractfile(info).read() if info.isfile() else b""
            if info.name == "data/state/messages.jsonl":
                body = b"".join(body.splitlines(keepends=True)[:-1])
                info.size = len(body)
                manifest["sha256"][info.name] = hashlib.sha256(body).hexdigest()
            if info.name == "mnemo-export.json":
                continue
            dst.addfile(info, io.BytesIO(body) if info.isfile() else None)
        data = json.dumps(manifest).encode()
        head = tarfile.TarInfo("mnemo-export.json")
        head.size = len(data)
        dst.addfile(head, io.BytesIO(data))
    with pytest.raises(ArchiveRefused, match="holds 199 rows, the manifest says 200"):
        verify_archive(short)

    assert main(["--home", str(home), "backup", "verify", str(archive)]) == 0
    assert main(["--home", str(home), "backup", "verify", str(changed)]) == 1


async def test_restore_round_trips_a_profile_and_keeps_what_it_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    await seed(home, ["before the backup"])
    assert main(["--home", str(home), "backup", "now"]) == 0
    [backup] = list_backups(home / "backups")
    assert main(["--home", str(home), "backup", "list"]) == 0
    assert str(backup.path) in capsys.readouterr().out

    # Life goes on after the backup...
    await seed(home, ["after the backup"])
    assert contents(home / "state.db") == ["before the backup", "after the backup"]
    # ...and a running profile is never restored into, nor one that holds data without --force.
    with hold(home):
        assert main(["--home", str(home), "backup", "restore", str(backup.path), "--force"]) == 1
    assert main(["--home", str(home), "backup", "restore", str(backup.path)]) == 1
    assert "already holds data" in capsys.readouterr().err
    assert contents(home / "state.db") == ["before the backup", "after the backup"]

    assert main(["--home", str(home), "backup", "restore", str(backup.path), "--force"]) == 0
    assert contents(home / "state.db") == ["before the backup"]
    assert (home / "memories" / "MEMORY.md").read_text().count("the deploy runs on Fridays") == 1
    [aside] = home.glob(".replaced-*")
    assert contents(aside / "state.db") == ["before the backup", "after the backup"]
    assert list_backups(home / "backups") == [backup]  # the backups themselves are untouched


async def test_a_backup_taken_while_the_bot_writes_is_consistent(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    await seed(home, ["first"])
    db = state_database(home / "state.db")
    await db.open()
    store = SessionStore(db)
    [session] = await store.list_sessions(None)
    stop = asyncio.Event()
    batches = 0

    async def writer() -> None:
        nonlocal batches
        while not stop.is_set() or batches < 5:
            # Every write is one transaction of a question and its answer.
            await store.append_messages(
                session.id,
                [
                    NewMessage("user", f"q{batches}"),
                    NewMessage("assistant", f"a{batches}"),
                ],
            )
            batches += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(writer())
    try:
        while batches < 3:
            await asyncio.sleep(0)
        archive = (await asyncio.to_thread(backup_now, settings_for(home), START)).path
        stop.set()
        await task
    finally:
        stop.set()
        await db.close()
    assert verify_archive(archive).rows >= 2
    rows = unpack_member(archive, "data/state/messages.jsonl", tmp_path).read_text().splitlines()
    snapshot = [json.loads(line)["content"] for line in rows]
    pairs = snapshot[1:]
    assert snapshot[0] == "first" and len(pairs) >= 6 and len(pairs) % 2 == 0
    assert pairs == [x for i in range(len(pairs) // 2) for x in (f"q{i}", f"a{i}")]
    assert len(contents(home / "state.db")) >= len(snapshot)
    manifest = json.loads(unpack_member(archive, "mnemo-export.json", tmp_path).read_text())
    assert set(manifest["sha256"]) == set(manifest["files"])
    assert manifest["tables"]["state/messages"]["rows"] == len(snapshot)


async def test_the_app_runs_the_backup_schedule_while_it_runs_unless_disabled(
    tmp_path: Path,
) -> None:
    from mnemo.app import open_app

    def scheduled() -> bool:
        return any(t.get_name() == "backup-scheduler" and not t.done() for t in asyncio.all_tasks())

    for enabled in (True, False):
        home = tmp_path / str(enabled)
        home.mkdir()
        settings = load_settings(
            home,
            environ={},
            overrides={"backup.enabled": enabled, "web.enabled": False},
        )
        async with open_app(settings, trial=True):
            assert scheduled() is enabled
        assert not scheduled()
