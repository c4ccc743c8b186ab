"""The memory journal in ``state.db`` (``memory_journal``): ``JournalRepository``,
``DocumentJournal`` and ``ProposalRepository`` on SQLite.

One table holds every entry. ``state`` is ``done`` for a write that happened,
``staged`` between the two steps of a write to a layer outside ``state.db`` (with its
``evidence``, ``memory/journal.py``), and ``proposed`` / ``accepted`` / ``rejected``
for a write a person has to confirm first (``remember: ask``). ``dedupe`` keeps a
provider write journaled once however often its job is retried.

Every function of a connection here runs inside the caller's transaction
(``Database.write``), so the curated rows' twin on PostgreSQL (``memory/pg/journal.py``)
and these stay the same statements.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from mnemo.memory.db import Database, inserted_id
from mnemo.memory.journal import (
    Actor,
    Entry,
    Evidence,
    JournalQuery,
    Layer,
    NewEntry,
    Provenance,
    Trust,
    evidence_json,
    settle_all,
    when,
)
from mnemo.memory.migrations import Migration

log = structlog.get_logger(__name__)

MEMORY_JOURNAL = Migration(
    "0015_memory_journal",
    """
CREATE TABLE memory_journal (
    id        INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
    layer     TEXT NOT NULL,
    target    TEXT NOT NULL,
    op        TEXT NOT NULL,
    old       TEXT,
    new       TEXT,
    since     REAL,
    until     REAL,
    actor     TEXT NOT NULL,
    trust     TEXT NOT NULL,
    speaker   TEXT,
    session   TEXT,
    message   TEXT,
    chat      TEXT,
    tool_call TEXT,
    reverts   INTEGER,
    note      TEXT,
    state     TEXT NOT NULL DEFAULT 'done'
              CHECK (state IN ('staged', 'done', 'proposed', 'accepted', 'rejected')),
    evidence  TEXT,
    dedupe    TEXT UNIQUE
);
CREATE INDEX memory_journal_target ON memory_journal(target, layer, id);
CREATE INDEX memory_journal_speaker ON memory_journal(speaker, id) WHERE speaker IS NOT NULL;
CREATE INDEX memory_journal_open ON memory_journal(state, target) WHERE state != 'done';
CREATE INDEX memory_journal_reverts ON memory_journal(reverts) WHERE reverts IS NOT NULL;
""",
)

# The columns an ``Entry`` is read from, in order (both backends' SELECTs).
COLUMN_NAMES = (
    "id", "at", "layer", "target", "op", "old", "new", "since", "until", "actor", "trust", "speaker",
    "session", "message", "chat", "tool_call", "reverts", "note",
)  # fmt: skip
COLUMNS = ", ".join(COLUMN_NAMES)


def entry_of(row: sqlite3.Row | dict[str, Any]) -> Entry:
    """An entry from a row of ``COLUMNS`` by name (PostgreSQL's tuples go through
    ``memory/pg/journal.py``'s ``entry_of``)."""
    return Entry(
        id=int(row["id"]),
        time=datetime.fromtimestamp(float(row["at"]), UTC),
        layer=row["layer"],
        target=row["target"],
        op=row["op"],
        old=row["old"],
        new=row["new"],
        since=when(row["since"]),
        until=when(row["until"]),
        actor=row["actor"],
        trust=row["trust"],
        speaker=row["speaker"],
        session=row["session"],
        message=row["message"],
        chat=row["chat"],
        tool_call=row["tool_call"],
        reverts=None if row["reverts"] is None else int(row["reverts"]),
        note=row["note"],
    )


def insert_within(
    conn: sqlite3.Connection,
    entry: NewEntry,
    now: float,
    *,
    state: str = "done",
    evidence: Evidence | None = None,
    dedupe: str | None = None,
) -> int | None:
    """Insert one entry in the caller's transaction; a ``done`` one closes the interval
    of the value it replaced. None: ``dedupe`` was journaled already."""
    by = entry.by
    cur = conn.execute(
        "INSERT INTO memory_journal(at, layer, target, op, old, new, actor, trust, speaker, session, message,"
        " chat, tool_call, reverts, note, state, evidence, dedupe)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (dedupe) DO NOTHING",
        (
            now,
            str(entry.layer),
            entry.target,
            entry.op,
            entry.old,
            entry.new,
            by.actor,
            str(by.trust),
            by.speaker,
            by.session,
            by.message,
            by.chat,
            by.tool_call,
            by.reverts,
            entry.note,
            state,
            None if evidence is None else evidence_json(evidence),
            dedupe,
        ),
    )
    if cur.rowcount == 0:
        return None
    entry_id = inserted_id(cur)
    if state == "done":
        close_within(conn, entry_id)
    return entry_id


def close_within(conn: sqlite3.Connection, entry_id: int) -> None:
    """``entry_id`` replaced or removed ``old``: the entry that wrote ``old`` ends now
    (``until``), and this one records since when ``old`` had been valid (``since``)."""
    row = conn.execute(
        "SELECT at, layer, target, old FROM memory_journal WHERE id = ?", (entry_id,)
    ).fetchone()
    if row is None or row["old"] is None:
        return
    prev = conn.execute(
        "SELECT id, at FROM memory_journal WHERE target = ? AND layer = ? AND new = ? AND state = 'done'"
        " AND until IS NULL AND id < ? ORDER BY id DESC LIMIT 1",
        (row["target"], row["layer"], row["old"], entry_id),
    ).fetchone()
    if prev is None:
        return
    conn.execute("UPDATE memory_journal SET until = ? WHERE id = ?", (row["at"], prev["id"]))
    conn.execute("UPDATE memory_journal SET since = ? WHERE id = ?", (prev["at"], entry_id))


def erase_within(conn: sqlite3.Connection, account: str, now: float, *, delete: bool) -> int:
    """A person's journal: the entries about them go, their name leaves the entries they
    caused elsewhere (shared memory keeps its text, not who said it), and one
    content-free receipt stays — when, and how many entries, never whose (an erasure
    leaves no trace of the person). Returns how many entries were (or would be) removed."""
    n = int(
        conn.execute(
            "SELECT COUNT(*) FROM memory_journal WHERE target = ? AND layer != 'journal'", (account,)
        ).fetchone()[0]
    )
    if not delete:
        return n
    conn.execute("DELETE FROM memory_journal WHERE target = ? AND layer != 'journal'", (account,))
    conn.execute(
        "UPDATE memory_journal SET speaker = NULL, session = NULL, message = NULL, chat = NULL,"
        " tool_call = NULL WHERE speaker = ?",
        (account,),
    )
    insert_within(conn, receipt(n), now)
    return n


ERASED = "erased"  # the target of an erasure receipt: it names nobody


def receipt(n: int) -> NewEntry:
    """What stays of an erased person's journal: when, and how many entries went."""
    return NewEntry(
        Layer.JOURNAL,
        ERASED,
        "erase",
        None,
        None,
        Provenance(Actor.ERASURE, Trust.ADMIN),
        note=f"erased: {n} journal entr{'y' if n == 1 else 'ies'} removed",
    )


def history_sql(query: JournalQuery, mark: str = "?") -> tuple[str, list[Any]]:
    """The SELECT of ``history`` (``mark``: the driver's placeholder)."""
    where: list[str] = ["state = 'done'"]
    args: list[Any] = []
    if query.people is not None:
        marks = ",".join([mark] * len(query.people))
        where.append(f"(target IN ({marks}) OR speaker IN ({marks}))")
        args += [*query.people, *query.people]
    if query.layer is not None:
        where.append(f"layer = {mark}")
        args.append(query.layer)
    if query.target is not None:
        where.append(f"target = {mark}")
        args.append(query.target)
    if query.since is not None:
        where.append(f"at >= {mark}")
        args.append(query.since.timestamp())
    sql = f"SELECT {COLUMNS} FROM memory_journal WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT {mark}"
    return sql, [*args, max(1, query.limit)]


class SqliteJournal:
    """The journal in ``state.db``. ``clock``: seconds since the epoch (tests move it)."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    # --- DocumentJournal (blocking; worker threads) -------------------------------
    def stage(self, entry: NewEntry, evidence: Evidence) -> int:
        now = self.clock()
        entry_id = self.db.write_sync(
            lambda c: insert_within(c, entry, now, state="staged", evidence=evidence)
        )
        assert entry_id is not None  # no dedupe key: an insert always happens
        return entry_id

    def commit(self, entry_id: int) -> None:
        self.db.write_sync(lambda c: _finish(c, entry_id))

    def abort(self, entry_id: int) -> None:
        self.db.write_sync(
            lambda c: c.execute("DELETE FROM memory_journal WHERE id = ? AND state = 'staged'", (entry_id,))
        )

    def staged(self, layer: Layer | None = None, target: str | None = None) -> list[tuple[int, str | None]]:
        sql, args = "SELECT id, evidence FROM memory_journal WHERE state = 'staged'", []
        if layer is not None and target is not None:
            sql, args = f"{sql} AND target = ? AND layer = ?", [target, str(layer)]
        rows = self.db.read_sync(lambda c: c.execute(sql, args).fetchall())
        return [(int(r["id"]), r["evidence"]) for r in rows]

    # --- JournalRepository --------------------------------------------------------
    async def append(self, entry: NewEntry, *, dedupe: str | None = None) -> int | None:
        now = self.clock()
        return await self.db.write(lambda c: insert_within(c, entry, now, dedupe=dedupe))

    async def history(self, query: JournalQuery) -> list[Entry]:
        sql, args = history_sql(query)
        rows = await self.db.read(lambda c: c.execute(sql, args).fetchall())
        return [entry_of(r) for r in rows]

    async def get(self, entry_id: int) -> Entry | None:
        row = await self.db.read(
            lambda c: c.execute(
                f"SELECT {COLUMNS} FROM memory_journal WHERE id = ? AND state = 'done'", (entry_id,)
            ).fetchone()
        )
        return None if row is None else entry_of(row)

    async def reverted(self, entry_ids: Sequence[int]) -> set[int]:
        if not entry_ids:
            return set()
        marks = ",".join("?" * len(entry_ids))
        rows = await self.db.read(
            lambda c: c.execute(
                f"SELECT reverts FROM memory_journal WHERE state = 'done' AND reverts IN ({marks})",
                list(entry_ids),
            ).fetchall()
        )
        return {int(r[0]) for r in rows}

    async def trusts(self, layer: Layer, target: str, values: Sequence[str]) -> dict[str, Trust]:
        if not values:
            return {}
        marks = ",".join("?" * len(values))
        rows = await self.db.read(
            lambda c: c.execute(
                f"SELECT new, trust FROM memory_journal WHERE target = ? AND layer = ? AND state = 'done'"
                f" AND new IN ({marks}) ORDER BY id",
                [target, str(layer), *values],
            ).fetchall()
        )
        return {r["new"]: Trust(r["trust"]) for r in rows}  # the newest wins

    async def settle(self) -> int:
        n = await asyncio.to_thread(settle_all, self)
        if n:
            log.info("journal.settled", entries=n)
        return n

    # --- ProposalRepository -------------------------------------------------------
    async def propose(self, entry: NewEntry) -> int:
        now = self.clock()
        entry_id = await self.db.write(lambda c: insert_within(c, entry, now, state="proposed"))
        assert entry_id is not None
        return entry_id

    async def proposals(self, people: Sequence[str]) -> list[Entry]:
        marks = ",".join("?" * len(people))
        rows = await self.db.read(
            lambda c: c.execute(
                f"SELECT {COLUMNS} FROM memory_journal WHERE state = 'proposed' AND speaker IN ({marks})"
                " ORDER BY id DESC",
                list(people),
            ).fetchall()
        )
        return [entry_of(r) for r in rows]

    async def rejected(self, people: Sequence[str]) -> list[Entry]:
        marks = ",".join("?" * len(people))
        rows = await self.db.read(
            lambda c: c.execute(
                f"SELECT {COLUMNS} FROM memory_journal WHERE state = 'rejected' AND speaker IN ({marks})"
                " ORDER BY id DESC LIMIT 200",
                list(people),
            ).fetchall()
        )
        return [entry_of(r) for r in rows]

    async def decide(self, entry_id: int, accepted: bool) -> bool:
        """Close a proposal; False when it was not open (decided already, or unknown)."""
        state = "accepted" if accepted else "rejected"
        n = await self.db.write(
            lambda c: (
                c.execute(
                    "UPDATE memory_journal SET state = ? WHERE id = ? AND state = 'proposed'",
                    (state, entry_id),
                ).rowcount
            )
        )
        return bool(n)


def _finish(conn: sqlite3.Connection, entry_id: int) -> None:
    cur = conn.execute(
        "UPDATE memory_journal SET state = 'done', evidence = NULL WHERE id = ? AND state = 'staged'",
        (entry_id,),
    )
    if cur.rowcount:
        close_within(conn, entry_id)
