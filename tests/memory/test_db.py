"""Database: WAL, the single writer with BEGIN IMMEDIATE and BUSY retry, readers, lifecycle."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database, is_busy
from mnemo.memory.errors import StoreBusy, StoreError


@pytest.fixture
async def db(tmp_path: Path):
    d = state_database(tmp_path / "profile" / "state.db")
    await d.open()
    yield d
    await d.close()


def _hold_write_lock(path: Path, release: threading.Event, locked: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    locked.set()
    release.wait(10)
    conn.execute("ROLLBACK")
    conn.close()


async def test_open_creates_folder_in_wal_mode_with_normal_sync(db: Database) -> None:
    assert db.path.exists()
    mode = await db.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
    sync = await db.write(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert mode == "wal"
    assert sync == 1  # NORMAL


async def test_write_commits_and_returns_the_functions_value(db: Database) -> None:
    rid = await db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('a')").lastrowid)
    keys = await db.read(lambda c: [tuple(r) for r in c.execute("SELECT id, chat_key FROM chats")])
    assert keys == [(rid, "a")]


async def test_a_failing_write_is_rolled_back_whole_and_its_error_propagates(db: Database) -> None:
    def tx(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO chats(chat_key) VALUES ('first')")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await db.write(tx)
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0]) == 0
    # The writer is still usable afterwards.
    await db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('second')"))
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0]) == 1


async def test_busy_from_another_process_is_retried_until_the_lock_is_released(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db", busy_timeout_ms=0)
    await db.open()
    release, locked = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db.path, release, locked))
    holder.start()
    try:
        assert locked.wait(5)
        pending = asyncio.ensure_future(
            db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('x')"))
        )
        await asyncio.sleep(0.3)
        assert not pending.done()  # still waiting behind the other connection's lock
        release.set()
        await pending
    finally:
        release.set()
        holder.join()
    assert db.busy_retries > 0
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0]) == 1
    await db.close()


async def test_busy_beyond_the_bounded_retries_raises_store_busy(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db", busy_timeout_ms=0, max_busy_retries=3)
    await db.open()
    release, locked = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db.path, release, locked))
    holder.start()
    try:
        assert locked.wait(5)
        with pytest.raises(StoreBusy, match="still locked"):
            await db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('x')"))
        assert db.busy_retries == 3
    finally:
        release.set()
        holder.join()
    await db.close()


async def test_reads_see_committed_data_while_another_connection_holds_the_write_lock(db: Database) -> None:
    await db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('visible')"))
    release, locked = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db.path, release, locked))
    holder.start()
    try:
        assert locked.wait(5)
        keys = await db.read(lambda c: [r[0] for r in c.execute("SELECT chat_key FROM chats")])
    finally:
        release.set()
        holder.join()
    assert keys == ["visible"]


async def test_reader_connections_cannot_write(db: Database) -> None:
    with pytest.raises(sqlite3.OperationalError):
        await db.read(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('nope')"))


async def test_passive_checkpoint_runs_after_the_configured_number_of_writes(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db", checkpoint_every=3)
    await db.open()
    # Until a checkpoint, the schema and rows live in the WAL, not in the main file.
    before = db.path.stat().st_size
    sizes = []
    for i in range(3):
        await db.write(lambda c, i=i: c.execute("INSERT INTO chats(chat_key) VALUES (?)", (f"k{i}",)))
        # The checkpoint runs on the writer thread after the caller is answered; a
        # read-only no-op queued behind it waits for it (and counts as no write).
        await asyncio.wrap_future(db._writer.submit(lambda: None))  # type: ignore[union-attr]  # the writer exists while the database is open
        sizes.append(db.path.stat().st_size)
    await db.close()
    assert sizes[0] == sizes[1] == before
    assert sizes[2] > before  # the third write triggered the checkpoint into the main file


async def test_concurrent_writes_share_a_commit_but_fail_alone(db: Database) -> None:
    def failing(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO chats(chat_key) VALUES ('doomed')")
        raise ValueError("only me")

    async def ok(i: int) -> int:
        return await db.write(
            lambda c: c.execute("INSERT INTO chats(chat_key) VALUES (?)", (f"k{i}",)).lastrowid
        )

    results = await asyncio.gather(
        *(ok(i) for i in range(20)),
        db.write(failing),
        *(ok(i) for i in range(20, 40)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and str(errors[0]) == "only me"
    keys = await db.read(lambda c: {r[0] for r in c.execute("SELECT chat_key FROM chats")})
    assert keys == {f"k{i}" for i in range(40)}  # everything but the failed write's own row


async def test_a_cancelled_write_that_has_not_started_is_not_run(db: Database) -> None:
    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda c: gate.wait(5)))
    await asyncio.sleep(0.05)  # the writer thread is now inside the blocker
    victim = asyncio.ensure_future(
        db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('never')"))
    )
    await asyncio.sleep(0.01)
    victim.cancel()
    gate.set()
    await blocker
    with pytest.raises(asyncio.CancelledError):
        await victim
    await db.write(lambda c: None)
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0]) == 0


async def test_close_is_idempotent_and_a_closed_database_refuses_work(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db")
    await db.open()
    await db.open()  # idempotent
    await db.close()
    await db.close()
    with pytest.raises(StoreError, match="not open"):
        await db.read(lambda c: 1)
    with pytest.raises(StoreError, match="not open"):
        await db.write(lambda c: 1)


def test_sync_api_works_without_an_event_loop(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db")
    db.open_sync()
    try:
        db.write_sync(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES ('cli')"))
        assert db.read_sync(lambda c: c.execute("SELECT chat_key FROM chats").fetchone()[0]) == "cli"
    finally:
        db.close_sync()


async def test_writes_from_many_coroutines_are_serialised_without_loss(db: Database) -> None:
    async def one(i: int) -> None:
        await db.write(lambda c: c.execute("INSERT INTO chats(chat_key) VALUES (?)", (f"k{i}",)))

    await asyncio.gather(*(one(i) for i in range(200)))
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0]) == 200


def test_busy_is_recognised_by_error_code_not_by_message(tmp_path: Path) -> None:
    a = sqlite3.connect(tmp_path / "x.db", isolation_level=None, timeout=0)
    b = sqlite3.connect(tmp_path / "x.db", isolation_level=None, timeout=0)
    a.execute("CREATE TABLE t(x)")
    a.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as err:
        b.execute("BEGIN IMMEDIATE")
    assert is_busy(err.value)
    with pytest.raises(sqlite3.OperationalError) as other:
        b.execute("SELECT * FROM no_such_table")
    assert not is_busy(other.value)
    a.execute("ROLLBACK")
    a.close()
    b.close()
