"""The curated memory (MEMORY.md, one USER.md per person) as rows on PostgreSQL.

One row per file in ``curated_memory`` (``target``, ``owner``: ``""`` for MEMORY.md,
``PLATFORM:ID`` for a USER.md), ``content`` holding exactly what the file would hold
(entries joined by ``ENTRY_DELIMITER``), so limits, the ``§`` rule, the threat scan,
the result texts and the frozen :class:`Snapshot` are those of ``memory/curated.py``:
:class:`PgCuratedFile` *is* a ``CuratedFile`` whose reads and writes go to a row.

Writes use optimistic concurrency instead of a file lock, because replicas on other
machines share no lock file: a write reads ``content`` and ``version``, decides, and
stores the new content only ``WHERE version = <what it read>`` (or inserts the first
row, ``ON CONFLICT DO NOTHING``). Zero rows changed means another writer came in
between: the write re-reads and decides again, up to ``max_attempts`` times, then
refuses with a conflict message (nothing saved). No update is ever lost.

Each write inserts its journal entry (``memory/pg/journal.py``) in the same transaction
as the row's new content, so both are there or neither — no staging as for files.

Every method blocks (a small synchronous psycopg pool of its own), like the file
implementation, so every caller runs it in a thread exactly as it does for files. A
database that cannot be reached reads as an unreadable file: the snapshot says so and
every write is refused.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from mnemo.memory.curated import (
    DEFAULT_MEMORY_LIMIT,
    DEFAULT_USER_LIMIT,
    Action,
    CuratedFile,
    MemoryBlocks,
    Target,
    WriteResult,
    _Change,
    join_entries,
    parse_entries,
)
from mnemo.memory.errors import MemoryUnreadable
from mnemo.memory.identity import Identities
from mnemo.memory.journal import SHARED, Actor, Layer, NewEntry, Provenance, Trust
from mnemo.memory.pg.db import PgMigration, redact
from mnemo.memory.pg.journal import insert_sync
from mnemo.memory.scope import UserRef

CURATED_MEMORY = PgMigration(
    "pg_curated_memory",
    """
CREATE TABLE curated_memory (
    target     text NOT NULL CHECK (target IN ('memory', 'user')),
    owner      text NOT NULL,
    content    text NOT NULL,
    version    bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, owner),
    CHECK ((target = 'memory') = (owner = ''))
);
""",
)

DEFAULT_WRITE_ATTEMPTS = 8


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _stored(text: str) -> str:
    """PostgreSQL text cannot hold NUL: stored as U+FFFD (as messages are)."""
    return text.replace("\x00", "\ufffd")


class PgCuratedFile(CuratedFile):
    """One curated file kept in a row. ``path`` is the file's name relative to the
    memories folder (``MEMORY.md``, ``users/telegram/42/USER.md``), for messages only."""

    def __init__(self, rows: PgCuratedFiles, target: Target, owner: str, name: Path, limit: int) -> None:
        super().__init__(target, name, limit, owner=owner or SHARED)
        self._rows = rows
        self._owner = owner

    def __repr__(self) -> str:
        return f"PgCuratedFile({self.target}, {str(self.path)!r}, limit={self.limit})"

    @property
    def location(self) -> str:
        return f"{redact(self._rows.url)} (curated_memory: {self.path})"

    # --- the row ---------------------------------------------------------------------
    def _read_row(self) -> tuple[tuple[str, ...], int | None]:
        """The entries and the row's version (None: no row yet, an empty file)."""
        try:
            with self._rows.connection() as conn:
                row = conn.execute(
                    "SELECT content, version FROM curated_memory WHERE target = %s AND owner = %s",
                    (str(self.target), self._owner),
                ).fetchone()
        except psycopg.Error as e:
            raise MemoryUnreadable(
                f"{self.path.name} cannot be read from PostgreSQL ({_first_line(e)})"
            ) from e
        if row is None:
            return (), None
        return parse_entries(row[0]), int(row[1])

    def _write_row(
        self, version: int | None, entries: tuple[str, ...], entry: NewEntry | None = None
    ) -> tuple[bool, int | None]:
        """Store ``entries`` if the row is still at ``version``, and ``entry`` in the
        journal in the same transaction: (stored, the entry's id). Not stored: someone
        else wrote (and neither is there)."""
        content = _stored(join_entries(entries))
        with self._rows.connection() as conn, conn.transaction():
            if version is None:
                cur = conn.execute(
                    "INSERT INTO curated_memory (target, owner, content, version) VALUES (%s, %s, %s, 1)"
                    " ON CONFLICT (target, owner) DO NOTHING",
                    (str(self.target), self._owner, content),
                )
            else:
                cur = conn.execute(
                    "UPDATE curated_memory SET content = %s, version = version + 1, updated_at = now()"
                    " WHERE target = %s AND owner = %s AND version = %s",
                    (content, str(self.target), self._owner, version),
                )
            if cur.rowcount != 1:
                return False, None
            if entry is None or not self._rows.journaled:
                return True, None
            return True, insert_sync(conn, entry, self._rows.clock())

    def _read(self) -> tuple[str, ...]:
        return self._read_row()[0]

    # --- the transaction -------------------------------------------------------------
    def _transact(
        self,
        action: Action,
        decide: Callable[[tuple[str, ...]], _Change | WriteResult],
        by: Provenance | None = None,
    ) -> WriteResult:
        attempts = self._rows.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                current, version = self._read_row()
            except MemoryUnreadable as e:  # not _failure: it would wait for the database again
                return WriteResult(
                    False,
                    f"{e}: every write is refused until it can be read, so nothing is overwritten.",
                    action,
                    self.target,
                    0,
                    self.limit,
                )
            outcome = decide(current)
            if isinstance(outcome, WriteResult):
                return outcome
            try:
                stored, entry_id = self._write_row(
                    version, outcome.entries, self.journal_entry(action, outcome, by)
                )
                if stored:
                    return self._saved(action, outcome, entry_id)
            except psycopg.Error as e:
                return self._failure(
                    action, f"Writing {self.path.name} failed ({_first_line(e)}). Nothing was saved."
                )
            self._rows.conflicts += 1
            if attempt < attempts:
                time.sleep(random.uniform(0.001, 0.010) * attempt)
        return self._failure(
            action,
            f"Conflict: {self.path.name} was changed by other writers {attempts} times while this {action} was "
            "being saved. Nothing was saved; retry.",
        )


class PgCuratedFiles:
    """``CuratedRepository`` on PostgreSQL: the same files as ``MemoryFiles``, as rows.

    ``identities`` works as for ``MemoryFiles``: ``user`` is the canonical account's
    USER.md, ``own`` exactly this account's. Cheap to construct; the pool connects on
    first use; ``close`` it when done."""

    def __init__(
        self,
        url: str,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        user_limit: int = DEFAULT_USER_LIMIT,
        *,
        identities: Identities | None = None,
        max_attempts: int = DEFAULT_WRITE_ATTEMPTS,
        connect_timeout_s: float = 10.0,
        pool_size: int = 4,
        journaled: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.url = url
        self.memory_limit = memory_limit
        self.user_limit = user_limit
        self.identities = identities
        self.max_attempts = max_attempts
        self.conflicts = 0  # version conflicts seen (each one re-read and retried)
        self.journaled = journaled  # False only to measure the journal's cost (bench/)
        self.clock = clock
        self._connect_timeout_s = connect_timeout_s
        self._pool_size = pool_size
        self._pool: ConnectionPool[Any] | None = None
        self._lock = threading.Lock()

    def connection(self) -> Any:
        """A pooled connection (autocommit) as a context manager."""
        with self._lock:
            if self._pool is None:
                pool: ConnectionPool[Any] = ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self._pool_size,
                    open=False,
                    kwargs={"autocommit": True},
                    timeout=self._connect_timeout_s,
                    name="mnemo-curated",
                )
                pool.open(wait=False)
                self._pool = pool
            return self._pool.connection()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def shared(self) -> PgCuratedFile:
        return PgCuratedFile(self, Target.MEMORY, "", Path("MEMORY.md"), self.memory_limit)

    def user(self, ref: UserRef) -> PgCuratedFile:
        return self.own(self.identities.canonical(ref) if self.identities is not None else ref)

    def own(self, ref: UserRef) -> PgCuratedFile:
        name = Path("users") / ref.platform / ref.user_id / "USER.md"
        return PgCuratedFile(self, Target.USER, f"{ref.platform}:{ref.user_id}", name, self.user_limit)

    def copy_own(self, source: UserRef, dest: UserRef) -> None:
        """``dest``'s own USER.md becomes a copy of ``source``'s own (removed if there is
        none), in one transaction; a writer of ``dest`` meanwhile sees a conflict and
        decides again on the copy."""
        with self.connection() as conn, conn.transaction():
            row = conn.execute(
                "SELECT content FROM curated_memory WHERE target = 'user' AND owner = %s", (str(source),)
            ).fetchone()
            self._journal_link(
                conn, dest, "copy", f"the profile became a copy of {source}'s (accounts unlinked)"
            )
            if row is None:
                conn.execute("DELETE FROM curated_memory WHERE target = 'user' AND owner = %s", (str(dest),))
                return
            conn.execute(
                "INSERT INTO curated_memory (target, owner, content, version) VALUES ('user', %s, %s, 1)"
                " ON CONFLICT (target, owner) DO UPDATE SET content = excluded.content,"
                " version = curated_memory.version + 1, updated_at = now()",
                (str(dest), row[0]),
            )

    def drop_own(self, ref: UserRef) -> None:
        """Remove exactly this account's USER.md row (its entries were merged into another's)."""
        with self.connection() as conn, conn.transaction():
            cur = conn.execute("DELETE FROM curated_memory WHERE target = 'user' AND owner = %s", (str(ref),))
            if cur.rowcount:
                self._journal_link(conn, ref, "drop", "the profile was merged into a linked account's")

    def _journal_link(self, conn: Any, ref: UserRef, op: str, note: str) -> None:
        if self.journaled:
            by = Provenance(Actor.LINKS, Trust.ADMIN)
            insert_sync(conn, NewEntry(Layer.CURATED, str(ref), op, None, None, by, note), self.clock())

    def blocks(self, speaker: UserRef | None) -> MemoryBlocks:
        return MemoryBlocks(self.shared().load(), None if speaker is None else self.user(speaker).load())
