"""The memory journal on PostgreSQL (``memory_journal``), the twin of
``memory/journal_sqlite.py``: the same table, states and statements.

Every layer that lives in this database writes its entry in its own transaction: the
curated rows (``memory/pg/curated.py``) and the holographic schema
(``providers/holographic/pg_store.py``) call :func:`insert_sync` on the synchronous
connection they write with; everything else goes through :class:`PgJournal`. So no
entry is ever staged here — ``settle`` has nothing to do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from mnemo.memory.errors import StoreError
from mnemo.memory.journal import (
    Entry,
    Evidence,
    JournalQuery,
    Layer,
    NewEntry,
    Trust,
    evidence_json,
    settle_all,
)
from mnemo.memory.journal_sqlite import COLUMN_NAMES, COLUMNS, history_sql, receipt
from mnemo.memory.journal_sqlite import entry_of as sqlite_entry_of
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration

PG_MEMORY_JOURNAL = PgMigration(
    "0015_memory_journal",
    """
CREATE TABLE memory_journal (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        double precision NOT NULL,
    layer     text NOT NULL,
    target    text NOT NULL,
    op        text NOT NULL,
    old       text,
    new       text,
    since     double precision,
    until     double precision,
    actor     text NOT NULL,
    trust     text NOT NULL,
    speaker   text,
    session   text,
    message   text,
    chat      text,
    tool_call text,
    reverts   bigint,
    note      text,
    state     text NOT NULL DEFAULT 'done'
              CHECK (state IN ('staged', 'done', 'proposed', 'accepted', 'rejected')),
    evidence  text,
    dedupe    text UNIQUE
);
CREATE INDEX memory_journal_target ON memory_journal(target, layer, id);
CREATE INDEX memory_journal_speaker ON memory_journal(speaker, id) WHERE speaker IS NOT NULL;
CREATE INDEX memory_journal_open ON memory_journal(state, target) WHERE state != 'done';
CREATE INDEX memory_journal_reverts ON memory_journal(reverts) WHERE reverts IS NOT NULL;
""",
)

_INSERT = (
    "INSERT INTO memory_journal(at, layer, target, op, old, new, actor, trust, speaker, session, message,"
    " chat, tool_call, reverts, note, state, dedupe)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (dedupe) DO NOTHING RETURNING id"
)
_STAGE = (
    "INSERT INTO memory_journal(at, layer, target, op, old, new, actor, trust, speaker, session, message,"
    " chat, tool_call, reverts, note, state, dedupe, evidence)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING id"
)
_PREVIOUS = (
    "SELECT id, at FROM memory_journal WHERE target = %s AND layer = %s AND new = %s AND state = 'done'"
    " AND until IS NULL AND id < %s ORDER BY id DESC LIMIT 1"
)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _stored(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL: stored as U+FFFD (as messages are)."""
    return None if text is None else text.replace("\x00", "\ufffd")


def _params(entry: NewEntry, now: float, state: str, dedupe: str | None) -> tuple[Any, ...]:
    by = entry.by
    return (
        now,
        str(entry.layer),
        entry.target,
        entry.op,
        _stored(entry.old),
        _stored(entry.new),
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
        dedupe,
    )


def entry_of(row: Sequence[Any]) -> Entry:
    """An entry from a row of ``COLUMNS`` (a tuple: sync and async connections alike)."""
    return sqlite_entry_of(dict(zip(COLUMN_NAMES, row, strict=True)))


def insert_sync(conn: psycopg.Connection[Any], entry: NewEntry, now: float, *, state: str = "done") -> int:
    """One ``done`` entry in the transaction ``conn`` has open, closing the interval of
    the value it replaced (the curated rows' and the facts' writes)."""
    row = conn.execute(_INSERT, _params(entry, now, state, None)).fetchone()
    assert row is not None  # no dedupe key: the insert happened
    entry_id = int(row[0])
    if entry.old is not None and state == "done":
        prev = conn.execute(
            _PREVIOUS, (entry.target, str(entry.layer), _stored(entry.old), entry_id)
        ).fetchone()
        if prev is not None:
            conn.execute("UPDATE memory_journal SET until = %s WHERE id = %s", (now, prev[0]))
            conn.execute("UPDATE memory_journal SET since = %s WHERE id = %s", (prev[1], entry_id))
    return entry_id


async def insert_within(
    c: Connection, entry: NewEntry, now: float, *, state: str = "done", dedupe: str | None = None
) -> int | None:
    """The same in an async transaction (``PgDatabase.write``)."""
    row = await (await c.execute(_INSERT, _params(entry, now, state, dedupe))).fetchone()
    if row is None:
        return None
    entry_id = int(row["id"])
    if entry.old is not None and state == "done":
        cur = await c.execute(_PREVIOUS, (entry.target, str(entry.layer), _stored(entry.old), entry_id))
        prev = await cur.fetchone()
        if prev is not None:
            await c.execute("UPDATE memory_journal SET until = %s WHERE id = %s", (now, prev["id"]))
            await c.execute("UPDATE memory_journal SET since = %s WHERE id = %s", (prev["at"], entry_id))
    return entry_id


async def erase_within(c: Connection, account: str, now: float, *, delete: bool) -> int:
    """As ``journal_sqlite.erase_within``: their entries go, a content-free receipt stays."""
    cur = await c.execute(
        "SELECT count(*) AS n FROM memory_journal WHERE target = %s AND layer != 'journal'", (account,)
    )
    row = await cur.fetchone()
    n = int(row["n"]) if row is not None else 0
    if not delete:
        return n
    await c.execute("DELETE FROM memory_journal WHERE target = %s AND layer != 'journal'", (account,))
    await c.execute(
        "UPDATE memory_journal SET speaker = NULL, session = NULL, message = NULL, chat = NULL,"
        " tool_call = NULL WHERE speaker = %s",
        (account,),
    )
    await insert_within(c, receipt(n), now)
    return n


def _tuple(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in COLUMN_NAMES)


class PgJournal:
    """``JournalRepository`` and ``ProposalRepository`` on PostgreSQL."""

    def __init__(
        self,
        db: PgDatabase,
        *,
        documents: PgDocumentJournal | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.documents = documents  # the staged writes of file layers (skills), settled at open
        self.clock = clock

    async def append(self, entry: NewEntry, *, dedupe: str | None = None) -> int | None:
        now = self.clock()
        return await self.db.write(lambda c: insert_within(c, entry, now, dedupe=dedupe))

    async def _select(self, sql: str, args: Sequence[Any]) -> list[Entry]:
        async def q(c: Connection) -> list[Entry]:
            cur = await c.execute(sql, list(args))
            return [entry_of(_tuple(r)) for r in await cur.fetchall()]

        return await self.db.read(q)

    async def history(self, query: JournalQuery) -> list[Entry]:
        sql, args = history_sql(query, mark="%s")
        return await self._select(sql, args)

    async def get(self, entry_id: int) -> Entry | None:
        found = await self._select(
            f"SELECT {COLUMNS} FROM memory_journal WHERE id = %s AND state = 'done'", (entry_id,)
        )
        return found[0] if found else None

    async def reverted(self, entry_ids: Sequence[int]) -> set[int]:
        if not entry_ids:
            return set()

        async def q(c: Connection) -> set[int]:
            cur = await c.execute(
                "SELECT reverts FROM memory_journal WHERE state = 'done' AND reverts = ANY(%s)",
                (list(entry_ids),),
            )
            return {int(r["reverts"]) for r in await cur.fetchall()}

        return await self.db.read(q)

    async def trusts(self, layer: Layer, target: str, values: Sequence[str]) -> dict[str, Trust]:
        if not values:
            return {}

        async def q(c: Connection) -> dict[str, Trust]:
            cur = await c.execute(
                "SELECT new, trust FROM memory_journal WHERE target = %s AND layer = %s AND state = 'done'"
                " AND new = ANY(%s) ORDER BY id",
                (target, str(layer), [_stored(v) for v in values]),
            )
            return {r["new"]: Trust(r["trust"]) for r in await cur.fetchall()}

        return await self.db.read(q)

    async def settle(self) -> int:
        """Rows and the holographic schema write their entries in their own transaction;
        only file layers (skills) stage theirs."""
        if self.documents is None:
            return 0
        return await asyncio.to_thread(settle_all, self.documents)

    async def propose(self, entry: NewEntry) -> int:
        now = self.clock()
        entry_id = await self.db.write(lambda c: insert_within(c, entry, now, state="proposed"))
        assert entry_id is not None
        return entry_id

    async def proposals(self, people: Sequence[str]) -> list[Entry]:
        return await self._select(
            f"SELECT {COLUMNS} FROM memory_journal WHERE state = 'proposed' AND speaker = ANY(%s) ORDER BY id DESC",
            (list(people),),
        )

    async def rejected(self, people: Sequence[str]) -> list[Entry]:
        return await self._select(
            f"SELECT {COLUMNS} FROM memory_journal WHERE state = 'rejected' AND speaker = ANY(%s)"
            " ORDER BY id DESC LIMIT 200",
            (list(people),),
        )

    async def decide(self, entry_id: int, accepted: bool) -> bool:
        state = "accepted" if accepted else "rejected"

        async def tx(c: Connection) -> int:
            cur = await c.execute(
                "UPDATE memory_journal SET state = %s WHERE id = %s AND state = 'proposed'", (state, entry_id)
            )
            return cur.rowcount

        return bool(await self.db.write(tx))


class PgDocumentJournal:
    """``DocumentJournal`` on PostgreSQL, for the layers that stay files on this backend
    too (skills): blocking, on a small synchronous pool (``connection``: a pooled
    autocommit connection as a context manager, e.g. ``PgCuratedFiles.connection``).
    A database error is raised as ``StoreError``, as the port says."""

    def __init__(self, connection: Callable[[], Any], *, clock: Callable[[], float] = time.time) -> None:
        self._connection = connection
        self.clock = clock

    @contextmanager
    def connection(self) -> Iterator[Any]:
        try:
            with self._connection() as conn:
                yield conn
        except psycopg.Error as e:
            raise StoreError(f"the memory journal on PostgreSQL: {_first_line(e)}") from e

    def stage(self, entry: NewEntry, evidence: Evidence) -> int:
        with self.connection() as conn:
            row = conn.execute(
                _STAGE, (*_params(entry, self.clock(), "staged", None), evidence_json(evidence))
            ).fetchone()
        assert row is not None
        return int(row[0])

    def commit(self, entry_id: int) -> None:
        with self.connection() as conn, conn.transaction():
            cur = conn.execute(
                "UPDATE memory_journal SET state = 'done', evidence = NULL WHERE id = %s AND state = 'staged'"
                " RETURNING at, layer, target, old",
                (entry_id,),
            )
            row = cur.fetchone()
            if row is None or row[3] is None:
                return
            prev = conn.execute(_PREVIOUS, (row[2], row[1], row[3], entry_id)).fetchone()
            if prev is not None:
                conn.execute("UPDATE memory_journal SET until = %s WHERE id = %s", (row[0], prev[0]))
                conn.execute("UPDATE memory_journal SET since = %s WHERE id = %s", (prev[1], entry_id))

    def abort(self, entry_id: int) -> None:
        with self.connection() as conn:
            conn.execute("DELETE FROM memory_journal WHERE id = %s AND state = 'staged'", (entry_id,))

    def staged(self, layer: Layer | None = None, target: str | None = None) -> list[tuple[int, str | None]]:
        sql, args = "SELECT id, evidence FROM memory_journal WHERE state = 'staged'", []
        if layer is not None and target is not None:
            sql, args = f"{sql} AND target = %s AND layer = %s", [target, str(layer)]
        with self.connection() as conn:
            return [(int(r[0]), r[1]) for r in conn.execute(sql, args).fetchall()]
