"""Named, append-only schema migrations of ``state.db``, tracked by ``PRAGMA user_version``.

``user_version`` is the number of migrations applied: migration ``migrations[i]``
takes the database from version ``i`` to ``i + 1``. Each one runs in its own
``BEGIN IMMEDIATE`` transaction together with the version bump, so a crash leaves the
database at the old or the new version, never in between. A database whose version is
higher than ``len(migrations)`` was written by a newer mnemo and is refused with
``SchemaTooNew`` (running old code on it could corrupt what it does not understand).
The applied names are also kept in ``schema_migrations`` for humans and ``doctor``.

This module is the runner and memory's own steps (sessions, messages, FTS, the CJK
index). Every other sub-system keeps its steps next to its code (e.g.
``gateway/delivery/schema.py``), and the one ordered list of ``state.db`` is assembled
in ``gateway/storage.py`` (``STATE_MIGRATIONS``), the only place that may import both
sides. Adding a table — define its ``Migration("0008_…", sql)`` beside its owner and
append it at the end of that list. Never edit, reorder or remove a migration that has
shipped: existing databases have already run it (the runner checks that the names it
finds in ``schema_migrations`` are the list's, in order). SQL is split into statements
with ``sqlite3.complete_statement`` (so ``CREATE TRIGGER … BEGIN …; END;`` works); a step that needs Python (a backfill)
passes ``python=fn`` which runs after the SQL on the same connection, inside the same
transaction. ``executescript`` is never used: it would commit the open transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mnemo.memory import cjk
from mnemo.memory.errors import SchemaTooNew, StoreError


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str = ""
    python: Callable[[sqlite3.Connection], None] | None = None


def statements(sql: str) -> Iterator[str]:
    """Split a script into complete statements (trigger bodies stay whole)."""
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:80]!r}")


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(
    conn: sqlite3.Connection, migrations: Sequence[Migration], *, path: Path | str = "state.db"
) -> int:
    """Apply the pending migrations in order; return the resulting version.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Raises
    ``SchemaTooNew`` for a database of a newer mnemo, ``StoreError`` when the steps it
    has applied are not this list's first ones.
    """
    migrations = tuple(migrations)
    current = schema_version(conn)
    if current > len(migrations):
        known = f" ({migrations[-1].name})" if migrations else ""
        raise SchemaTooNew(
            f"{path} has schema version {current}, but this mnemo only knows versions up to "
            f"{len(migrations)}{known}: it was written by a newer mnemo. "
            "Upgrade mnemo, or point --home at another profile."
        )
    _check_history(conn, migrations, current, path)
    for version in range(current, len(migrations)):
        m = migrations[version]
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            if schema_version(conn) != version:
                conn.execute("ROLLBACK")
                return migrate(conn, migrations, path=path)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            for stmt in statements(m.sql):
                conn.execute(stmt)
            if m.python is not None:
                m.python(conn)
            conn.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                (version + 1, m.name, datetime.now(UTC).isoformat(timespec="seconds")),
            )
            conn.execute(f"PRAGMA user_version = {version + 1:d}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return len(migrations)


def _check_history(
    conn: sqlite3.Connection, migrations: Sequence[Migration], current: int, path: Path | str
) -> None:
    """The steps a database has applied must be this list's first ``current`` ones: a
    list assembled in another order would otherwise skip or re-run a step silently."""
    if current == 0:
        return
    try:
        applied = conn.execute(
            "SELECT version, name FROM schema_migrations WHERE version <= ? ORDER BY version", (current,)
        ).fetchall()
    except sqlite3.OperationalError:
        return  # no schema_migrations table: nothing recorded to compare with
    for version, name in applied:
        expected = migrations[version - 1].name
        if name != expected:
            raise StoreError(
                f"{path}: schema version {version} is {name!r} in the database but {expected!r} in this mnemo's "
                "migration list; the list was reordered"
            )


# --- the migrations --------------------------------------------------------------------

_SESSIONS_AND_MESSAGES = """
-- One row per chat (session key); its integer id is the chat's search scope token.
CREATE TABLE chats (
    id       INTEGER PRIMARY KEY,
    chat_key TEXT NOT NULL UNIQUE
);
CREATE TABLE sessions (
    id                 TEXT PRIMARY KEY,
    chat_no            INTEGER NOT NULL REFERENCES chats(id),
    chat_key           TEXT NOT NULL,
    platform           TEXT NOT NULL,
    chat_id            TEXT NOT NULL,
    thread_id          TEXT,
    user_id            TEXT,
    agent_context      TEXT NOT NULL,
    source             TEXT NOT NULL,
    model              TEXT NOT NULL,
    system_prompt      TEXT NOT NULL,
    parent_session_id  TEXT REFERENCES sessions(id),
    started_at         TEXT NOT NULL,
    ended_at           TEXT,
    end_reason         TEXT,
    message_count      INTEGER NOT NULL DEFAULT 0,
    tool_call_count    INTEGER NOT NULL DEFAULT 0,
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    title              TEXT
);
CREATE INDEX sessions_by_chat ON sessions(chat_key, source, started_at);
CREATE INDEX sessions_by_parent ON sessions(parent_session_id);

CREATE TABLE messages (
    id                  INTEGER PRIMARY KEY,
    session_id          TEXT NOT NULL REFERENCES sessions(id),
    chat_no             INTEGER NOT NULL,
    role                TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    content             TEXT NOT NULL,
    tool_calls          TEXT,
    tool_call_id        TEXT,
    tool_name           TEXT,
    is_error            INTEGER NOT NULL DEFAULT 0,
    author_id           TEXT,
    author_name         TEXT,
    platform_message_id TEXT,
    created_at          TEXT NOT NULL,
    token_count         INTEGER NOT NULL DEFAULT 0,
    finish_reason       TEXT,
    meta                TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX messages_by_session ON messages(session_id, id);
-- Counters kept by the database, so appending a message is one statement.
CREATE TRIGGER messages_count_ai AFTER INSERT ON messages BEGIN
    UPDATE sessions SET
        message_count = message_count + 1,
        tool_call_count = tool_call_count + coalesce(json_array_length(new.tool_calls), 0)
    WHERE id = new.session_id;
END;

-- FTS5 external-content index, Porter-stemmed ('adopted' finds 'adopting'). The
-- 'scope' column holds one token per chat ('c' || chat_no) so a scoped query is an AND
-- inside the index and bm25 is computed only for the chat's own rows. The view is the
-- content table: FTS5 reads it for 'rebuild', 'integrity-check' and snippets.
-- One index only on this hot path: every extra FTS index roughly halves the
-- one-transaction-per-message write rate.
CREATE VIEW messages_fts_docs AS SELECT id, content, 'c' || chat_no AS scope FROM messages;
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, scope, content='messages_fts_docs', content_rowid='id',
    tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, scope) VALUES (new.id, new.content, 'c' || new.chat_no);
END;
CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, scope)
    VALUES ('delete', old.id, old.content, 'c' || old.chat_no);
END;
CREATE TRIGGER messages_fts_au AFTER UPDATE OF content, chat_no ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, scope)
    VALUES ('delete', old.id, old.content, 'c' || old.chat_no);
    INSERT INTO messages_fts(rowid, content, scope) VALUES (new.id, new.content, 'c' || new.chat_no);
END;
"""

_CJK_VIEW = """
-- Unigram + bigram text of unspaced scripts (see memory/cjk.py); NULL for most rows.
ALTER TABLE messages ADD COLUMN cjk TEXT;
CREATE VIEW messages_cjk_docs AS
    SELECT id, cjk, 'c' || chat_no AS scope FROM messages WHERE cjk IS NOT NULL;
CREATE VIRTUAL TABLE messages_cjk USING fts5(
    cjk, scope, content='messages_cjk_docs', content_rowid='id'
);
CREATE TRIGGER messages_cjk_ai AFTER INSERT ON messages WHEN new.cjk IS NOT NULL BEGIN
    INSERT INTO messages_cjk(rowid, cjk, scope) VALUES (new.id, new.cjk, 'c' || new.chat_no);
END;
CREATE TRIGGER messages_cjk_ad AFTER DELETE ON messages WHEN old.cjk IS NOT NULL BEGIN
    INSERT INTO messages_cjk(messages_cjk, rowid, cjk, scope)
    VALUES ('delete', old.id, old.cjk, 'c' || old.chat_no);
END;
CREATE TRIGGER messages_cjk_au_old AFTER UPDATE OF cjk, chat_no ON messages WHEN old.cjk IS NOT NULL BEGIN
    INSERT INTO messages_cjk(messages_cjk, rowid, cjk, scope)
    VALUES ('delete', old.id, old.cjk, 'c' || old.chat_no);
END;
CREATE TRIGGER messages_cjk_au_new AFTER UPDATE OF cjk, chat_no ON messages WHEN new.cjk IS NOT NULL BEGIN
    INSERT INTO messages_cjk(rowid, cjk, scope) VALUES (new.id, new.cjk, 'c' || new.chat_no);
END;
"""


def _backfill_cjk(conn: sqlite3.Connection) -> None:
    # The UPDATE fires messages_cjk_au_new, which indexes the row.
    rows = conn.execute("SELECT id, content FROM messages").fetchall()
    for row_id, content in rows:
        text = cjk.index_text(content)
        if text is not None:
            conn.execute("UPDATE messages SET cjk = ? WHERE id = ?", (text, row_id))


# memory's own steps of the ordered ``state.db`` list (assembled in gateway/storage.py,
# which alone knows where the gateway's tables go between them).
SESSIONS_AND_MESSAGES = Migration("0001_sessions_and_messages", _SESSIONS_AND_MESSAGES)
CJK_VIEW = Migration("0003_cjk_view", _CJK_VIEW, python=_backfill_cjk)


# --- 0008: the contextual index -----------------------------------------------------------

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def context_sql(m: str) -> str:
    """SQL for the ``context`` column of message alias ``m``: who said it, the date in
    words (``7 May 2023``) and the previous turn of the same session."""
    months = " ".join(f"WHEN '{i:02d}' THEN '{name}'" for i, name in enumerate(_MONTHS, 1))
    return (
        f"coalesce({m}.author_name, {m}.role) || ' ' || (0 + substr({m}.created_at, 9, 2)) || ' '"
        f" || (CASE substr({m}.created_at, 6, 2) {months} ELSE '' END) || ' ' || substr({m}.created_at, 1, 4)"
        f" || ' ' || coalesce((SELECT p.content FROM messages p WHERE p.session_id = {m}.session_id"
        f" AND p.id < {m}.id ORDER BY p.id DESC LIMIT 1), '')"
    )


_CONTEXTUAL_INDEX = f"""
-- Every message indexed with its context (memory/ranking.py ContextRetriever): the
-- message itself in 'content', and in 'context' who said it, the date in words and
-- the previous turn of the session; the rowid stays the message's own id. Contentless:
-- the context is recomputed for 'delete' (messages are append-only, the previous turn
-- never changes). It replaces messages_fts, which stays only until every old row has
-- been re-indexed in the background (memory/reindex.py; state in search_reindex).
CREATE VIRTUAL TABLE messages_ctx USING fts5(
    content, context, scope, content='', tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_ctx_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_ctx(rowid, content, context, scope)
    VALUES (new.id, new.content, {context_sql("new")}, 'c' || new.chat_no);
END;
CREATE TRIGGER messages_ctx_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_ctx(messages_ctx, rowid, content, context, scope)
    VALUES ('delete', old.id, old.content, {context_sql("old")}, 'c' || old.chat_no);
END;
-- The chat's participants (their names are removed from queries: every turn of theirs
-- carries the name in its context, so it matches everything and finds nothing).
CREATE TABLE chat_speakers (
    chat_no INTEGER NOT NULL,
    name    TEXT NOT NULL,
    PRIMARY KEY (chat_no, name)
) WITHOUT ROWID;
CREATE TRIGGER chat_speakers_ai AFTER INSERT ON messages WHEN new.author_name IS NOT NULL BEGIN
    INSERT OR IGNORE INTO chat_speakers(chat_no, name) VALUES (new.chat_no, new.author_name);
END;
-- Background re-indexing of the rows written before this step: ids next_id..last_id.
CREATE TABLE search_reindex (
    name    TEXT PRIMARY KEY,
    next_id INTEGER NOT NULL,
    last_id INTEGER NOT NULL,
    started_at TEXT NOT NULL
);
"""

LEGACY_FTS_DROP = (
    "DROP TRIGGER IF EXISTS messages_fts_ai",
    "DROP TRIGGER IF EXISTS messages_fts_ad",
    "DROP TRIGGER IF EXISTS messages_fts_au",
    "DROP TABLE IF EXISTS messages_fts",
)


def _plan_reindex(conn: sqlite3.Connection) -> None:
    lo, hi = conn.execute("SELECT min(id), max(id) FROM messages").fetchone()
    if lo is None:
        for stmt in LEGACY_FTS_DROP:  # nothing to re-index: the old index goes now
            conn.execute(stmt)
        return
    conn.execute(
        "INSERT INTO search_reindex(name, next_id, last_id, started_at) VALUES ('messages_ctx', ?, ?, ?)",
        (lo, hi, datetime.now(UTC).isoformat(timespec="seconds")),
    )


CONTEXTUAL_INDEX = Migration("0008_contextual_index", _CONTEXTUAL_INDEX, python=_plan_reindex)


_MESSAGE_VECTORS = """
-- Sentence embeddings of messages for the optional semantic retriever (memory/semantic.py):
-- float32 blobs written in the background; empty unless search.semantic is on.
CREATE TABLE message_vectors (
    id      INTEGER PRIMARY KEY,
    chat_no INTEGER NOT NULL,
    model   TEXT NOT NULL,
    vec     BLOB NOT NULL
);
CREATE INDEX message_vectors_by_chat ON message_vectors(chat_no, model, id);
"""

MESSAGE_VECTORS = Migration("0009_message_vectors", _MESSAGE_VECTORS)
