"""The journal is written in the same transaction as the memory write: a writer killed
with SIGKILL between the two leaves both or neither — on SQLite, where the curated files
are files beside ``state.db`` (stage → write → commit, settled by the next process), and
on PostgreSQL, where the row and its entry share one transaction.

Real processes: each writer is a forked child that opens its own database and files;
the parent kills it (exactly between two steps, or at random moments, over and over),
then opens the store as the next process would and checks that the journal, replayed,
is exactly what the file or row holds.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.journal import (
    SHARED,
    Actor,
    Entry,
    Evidence,
    JournalQuery,
    Layer,
    NewEntry,
    Provenance,
    Trust,
)
from mnemo.memory.journal_sqlite import SqliteJournal

MP = multiprocessing.get_context("fork")
BY = Provenance(Actor.MODEL, Trust.STATED, speaker="telegram:1", message="m1")


class Pausing:
    """A ``DocumentJournal`` that stops for ever at one step (after staging, or before
    committing), having told the parent it got there: the parent then kills it."""

    def __init__(self, inner: SqliteJournal, at: str, there: Any) -> None:
        self.inner, self.at, self.there = inner, at, there

    def _pause(self, step: str) -> None:
        if step == self.at:
            self.there.set()
            time.sleep(3600)

    def stage(self, entry: NewEntry, evidence: Evidence) -> int:
        entry_id = self.inner.stage(entry, evidence)
        self._pause("staged")
        return entry_id

    def commit(self, entry_id: int) -> None:
        self._pause("written")
        self.inner.commit(entry_id)

    def abort(self, entry_id: int) -> None:
        self.inner.abort(entry_id)

    def staged(self, layer: Layer | None = None, target: str | None = None) -> list[tuple[int, str | None]]:
        return self.inner.staged(layer, target)


def _migrated(home: Path) -> None:
    """``state.db`` migrated and closed again: a forked child opens its own (no threads
    of the parent's database are copied into it)."""
    db = state_database(home / "state.db")
    db.open_sync()
    db.close_sync()


def _paused_writer(home: str, at: str, there: Any) -> None:
    db = state_database(Path(home) / "state.db")
    db.open_sync()
    files = MemoryFiles(Path(home) / "memories", journal=Pausing(SqliteJournal(db), at, there))
    files.shared().add("The deploy key rotates on Mondays", BY)


async def _settled(home: Path) -> tuple[list[Entry], list[tuple[int, str | None]], tuple[str, ...]]:
    """What the next process finds once it opened the store (which settles)."""
    db = state_database(home / "state.db")
    await db.open()
    try:
        journal = SqliteJournal(db)
        await journal.settle()
        entries = await journal.history(JournalQuery(layer=Layer.CURATED, target=SHARED, limit=100_000))
        staged = journal.staged()
    finally:
        await db.close()
    return entries, staged, MemoryFiles(home / "memories").shared().load().entries


@pytest.mark.parametrize("at", ["staged", "written"])
async def test_a_writer_killed_between_file_and_journal_leaves_both_or_neither(
    tmp_path: Path, at: str
) -> None:
    home = tmp_path / "home"
    _migrated(home)
    there = MP.Event()
    child = MP.Process(target=_paused_writer, args=(str(home), at, there))
    child.start()
    assert there.wait(60), "the writer reached the step"
    os.kill(child.pid or 0, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL

    entries, staged, on_disk = await _settled(home)
    assert staged == []
    if at == "staged":  # killed before the file was written: neither
        assert on_disk == () and entries == []
    else:  # killed after the file was written, before the commit: both
        assert on_disk == ("The deploy key rotates on Mondays",)
        assert [(e.op, e.new, e.trust, e.message) for e in entries] == [
            ("add", "The deploy key rotates on Mondays", "stated", "m1")
        ]


# --- kill -9 at random moments, over and over -------------------------------------------


def replay(entries: list[Entry]) -> list[str]:
    """The file the journal describes: its entries applied oldest first."""
    out: list[str] = []
    for e in sorted(entries, key=lambda e: e.id):
        if e.op == "add" and e.new is not None:
            out.append(e.new)
        elif e.op == "replace" and e.old in out:
            out[out.index(e.old)] = e.new or ""
        elif e.op == "remove" and e.old in out:
            out.remove(e.old)
    return out


def _ops(file: Any, start: int) -> None:
    """Adds, replaces and removes of unique entries, for ever (killed from outside)."""
    k = start
    while True:
        current = file.load().entries
        if len(current) < 5 or k % 3 == 0:
            file.add(f"note {k} {'x' * (k % 30)}".strip(), BY)
        elif k % 3 == 1:
            file.replace(current[k % len(current)], f"note {k} replaced", BY)
        else:
            file.remove(current[k % len(current)], BY)
        k += 1


def _sqlite_writer(home: str, start: int) -> None:
    db = state_database(Path(home) / "state.db")
    db.open_sync()
    _ops(MemoryFiles(Path(home) / "memories", journal=SqliteJournal(db)).shared(), start)


ROUNDS = 25


async def test_sqlite_files_and_journal_agree_after_random_kills(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _migrated(home)
    rng = random.Random(7)
    for round_ in range(ROUNDS):
        child = MP.Process(target=_sqlite_writer, args=(str(home), round_ * 1000))
        child.start()
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(10)
        entries, staged, on_disk = await _settled(home)
        assert staged == []
        assert replay(entries) == list(on_disk), f"round {round_}"
    assert len(entries) > ROUNDS, "the writers got work done between kills"


def _pg_writer(url: str, start: int) -> None:
    from mnemo.memory.pg.curated import PgCuratedFiles

    _ops(PgCuratedFiles(url).shared(), start)


async def test_postgresql_rows_and_journal_agree_after_random_kills(pg_cluster: Any) -> None:
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.curated import PgCuratedFiles
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.journal import PgJournal

    url = pg_cluster.fresh_database()
    db = PgDatabase(url, migrations=PG_MIGRATIONS, max_size=2)
    await db.open()
    await db.close()  # migrated; the children and the checks open their own connections
    rng = random.Random(11)
    for round_ in range(ROUNDS // 2):
        child = MP.Process(target=_pg_writer, args=(url, round_ * 1000))
        child.start()
        time.sleep(rng.uniform(0.3, 0.8))
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(10)
        db = PgDatabase(url, migrations=PG_MIGRATIONS, max_size=2)
        await db.open()
        try:
            entries = await PgJournal(db).history(
                JournalQuery(layer=Layer.CURATED, target=SHARED, limit=100_000)
            )

            async def version(c: Any) -> int:
                row = await (
                    await c.execute("SELECT version FROM curated_memory WHERE owner = ''")
                ).fetchone()
                return int(row["version"]) if row is not None else 0

            stored = await db.read(version)
        finally:
            await db.close()
        rows = PgCuratedFiles(url)
        try:
            on_row = rows.shared().load().entries
        finally:
            rows.close()
        assert replay(entries) == list(on_row), f"round {round_}"
        assert stored == len(entries), "every version of the row has exactly one entry"
    assert len(entries) > ROUNDS // 2
