"""Background re-indexing of messages written before the contextual index existed.

Migration ``0008_contextual_index`` records the ids of the old rows in
``search_reindex`` and returns at once, so opening an existing database never waits
for it. ``reindex_in_background`` (started by the app next to the gateway) then indexes
them in small write transactions (``batch`` rows each, so other writers wait at most
one batch), reporting progress; when the last batch is in, the old single-column
index ``messages_fts`` and its triggers are dropped in the same transaction.

Meanwhile searches keep working: while a ``search_reindex`` row exists,
``ContextRetriever`` answers from the old index (which still covers every message,
its triggers are kept until the end), with the same scope rule.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from mnemo.memory.db import Database
from mnemo.memory.migrations import LEGACY_FTS_DROP, context_sql

log = structlog.get_logger(__name__)

BATCH = 2000
NAME = "messages_ctx"


@dataclass(frozen=True, slots=True)
class ReindexProgress:
    done: int  # rows re-indexed so far (by id range)
    total: int
    finished: bool


def pending(conn: sqlite3.Connection) -> bool:
    """Whether old rows are still waiting for the contextual index."""
    try:
        return conn.execute("SELECT 1 FROM search_reindex WHERE name = ?", (NAME,)).fetchone() is not None
    except sqlite3.OperationalError:  # a database before the migration
        return False


def progress(conn: sqlite3.Connection) -> ReindexProgress:
    """How far the re-indexing is, from its row (no scan)."""
    try:
        row = conn.execute("SELECT next_id, last_id FROM search_reindex WHERE name = ?", (NAME,)).fetchone()
    except sqlite3.OperationalError:  # a database before the migration
        return ReindexProgress(0, 0, True)
    if row is None:
        return ReindexProgress(0, 0, True)
    first = conn.execute("SELECT min(id) FROM messages").fetchone()[0] or row[0]
    total = max(1, int(row[1]) - int(first) + 1)
    return ReindexProgress(max(0, int(row[0]) - int(first)), total, False)


def reindex_step(conn: sqlite3.Connection, batch: int = BATCH) -> ReindexProgress:
    """Index the next ``batch`` old rows (inside a write transaction)."""
    row = conn.execute("SELECT next_id, last_id FROM search_reindex WHERE name = ?", (NAME,)).fetchone()
    if row is None:
        return ReindexProgress(0, 0, True)
    next_id, last_id = int(row[0]), int(row[1])
    first = conn.execute("SELECT min(id) FROM messages").fetchone()[0] or next_id
    upto = min(last_id, next_id + batch - 1)
    conn.execute(
        "INSERT INTO messages_ctx(rowid, content, context, scope)"
        f" SELECT m.id, m.content, {context_sql('m')}, 'c' || m.chat_no FROM messages m"
        " WHERE m.id BETWEEN ? AND ?",
        (next_id, upto),
    )
    conn.execute(
        "INSERT OR IGNORE INTO chat_speakers(chat_no, name) SELECT DISTINCT chat_no, author_name FROM messages"
        " WHERE id BETWEEN ? AND ? AND author_name IS NOT NULL",
        (next_id, upto),
    )
    total = max(1, last_id - first + 1)
    if upto >= last_id:
        conn.execute("DELETE FROM search_reindex WHERE name = ?", (NAME,))
        for stmt in LEGACY_FTS_DROP:
            conn.execute(stmt)
        return ReindexProgress(total, total, True)
    conn.execute("UPDATE search_reindex SET next_id = ? WHERE name = ?", (upto + 1, NAME))
    return ReindexProgress(upto - first + 1, total, False)


async def reindex_in_background(
    db: Database,
    *,
    batch: int = BATCH,
    pause: float = 0.01,
    progress: Callable[[ReindexProgress], None] | None = None,
) -> ReindexProgress:
    """Run ``reindex_step`` until done, yielding to other writers between batches."""
    if not await db.read(pending):
        return ReindexProgress(0, 0, True)
    log.info("search.reindex_started")
    while True:
        step = await db.write(lambda c: reindex_step(c, batch))
        if progress is not None:
            progress(step)
        log.info("search.reindex_progress", done=step.done, total=step.total)
        if step.finished:
            log.info("search.reindex_finished", total=step.total)
            return step
        await asyncio.sleep(pause)


class SearchMaintenance:
    """The background work of session_search, started with the app: the re-indexing
    of old rows, then (with the semantic retriever) embedding new messages every
    ``embed_every`` seconds. Failures are logged; searches never wait for it."""

    def __init__(self, db: Database, retriever: object, *, embed_every: float = 5.0) -> None:
        self._db = db
        self._retriever = retriever
        self._every = embed_every
        self._task: asyncio.Task[None] | None = None
        self.progress: ReindexProgress | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="search-maintenance")

    async def _run(self) -> None:
        try:
            self.progress = await reindex_in_background(self._db, progress=self._note)
        except Exception as e:
            log.error("search.reindex_failed", error=repr(e))
            return
        embedder = getattr(self._retriever, "embedder", None)
        if embedder is None:
            return
        from mnemo.memory.semantic import embed_pending

        while True:
            try:
                n = await embed_pending(self._db, embedder)
                if n:
                    log.info("search.embedded", messages=n)
            except Exception as e:
                log.error("search.embed_failed", error=repr(e))
            await asyncio.sleep(self._every)

    def _note(self, step: ReindexProgress) -> None:
        self.progress = step

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
