"""Named, append-only schema migrations of ``state.db``, tracked by ``PRAGMA user_version``.

``user_version`` is the number of migrations applied: migration ``MIGRATIONS[i]``
takes the database from version ``i`` to ``i + 1``. Each one runs in its own
``BEGIN IMMEDIATE`` transaction together with the version bump, so a crash leaves the
database at the old or the new version, never in between. A database whose version is
higher than ``len(MIGRATIONS)`` was written by a newer mnemo and is refused with
``SchemaTooNew`` (running old code on it could corrupt what it does not understand).
The applied names are also kept in ``schema_migrations`` for humans and ``doctor``.

Adding a table (outbox, jobs, cron_jobs, ...) — append one entry at the end::

    Migration(
        "0004_outbox",
        '''
        CREATE TABLE outbox (...);
        CREATE INDEX outbox_pending ON outbox(state) WHERE state = 'pending';
        ''',
    ),

Never edit, reorder or remove a migration that has shipped: existing databases have
already run it. SQL is split into statements with ``sqlite3.complete_statement`` (so
``CREATE TRIGGER … BEGIN …; END;`` works); a step that needs Python (a backfill)
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
from mnemo.memory.errors import SchemaTooNew


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
    conn: sqlite3.Connection, migrations: Sequence[Migration] | None = None, *, path: Path | str = "state.db"
) -> int:
    """Apply the pending migrations in order; return the resulting version.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    migrations = MIGRATIONS if migrations is None else tuple(migrations)
    current = schema_version(conn)
    if current > len(migrations):
        known = f" ({migrations[-1].name})" if migrations else ""
        raise SchemaTooNew(
            f"{path} has schema version {current}, but this mnemo only knows versions up to "
            f"{len(migrations)}{known}: it was written by a newer mnemo. "
            "Upgrade mnemo, or point --home at another profile."
        )
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

_INBOX = """
-- Durable inbox: an accepted platform message is stored before it is acknowledged.
CREATE TABLE inbox (
    id          INTEGER PRIMARY KEY,
    platform    TEXT NOT NULL,
    chat_id     TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    payload     TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'received'
                CHECK (state IN ('received', 'processing', 'done', 'failed')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    error       TEXT,
    received_at TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (platform, chat_id, message_id)
);
CREATE INDEX inbox_unfinished ON inbox(id) WHERE state IN ('received', 'processing');
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


# The durable outbox (delivery ledger) — see gateway/outbox.py.
_OUTBOX = """
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    text TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'reply',          -- reply | command | cron | notice
    reply_to TEXT,
    mention_user_id TEXT,
    session_id TEXT,
    inbox_id INTEGER,
    state TEXT NOT NULL DEFAULT 'queued',        -- queued | sending | sent | failed
    attempts INTEGER NOT NULL DEFAULT 0,
    possible_duplicate INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    sent_at REAL,
    platform_ids TEXT,
    error TEXT
);
CREATE INDEX outbox_pending ON outbox(state, not_before);
CREATE UNIQUE INDEX outbox_inbox ON outbox(inbox_id) WHERE inbox_id IS NOT NULL;
"""

# Pairing requests of unknown DM users — see gateway/access.py.
_PAIRINGS = """
CREATE TABLE pairings (
    code TEXT PRIMARY KEY,
    platform TEXT NOT NULL,
    user_id TEXT NOT NULL,
    user_name TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'pending',   -- pending | approved | denied
    created_at REAL NOT NULL,
    decided_at REAL,
    decided_by TEXT
);
CREATE INDEX pairings_user ON pairings(platform, user_id, state);
"""


# Background jobs of the worker queue — see gateway/worker.py. At most one queued or
# running job per (session, kind): the partial unique index is the single-flight rule.
_JOBS = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    session_id TEXT NOT NULL,
    payload TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    checkpoint TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE UNIQUE INDEX jobs_single_flight ON jobs(session_id, kind) WHERE state IN ('queued', 'running');
CREATE INDEX jobs_due ON jobs(state, not_before);
CREATE INDEX jobs_session ON jobs(session_id, kind);
"""


# Scheduled jobs and their runs — see gateway/cron.py and gateway/cron_store.py.
# Times are UTC epoch seconds. ``rev`` changes with a job's definition or state, so a
# running scheduler sees edits made by another process (the CLI); a run row is written
# before the run starts and finished together with its outbox delivery.
_CRON_JOBS = """
CREATE TABLE cron_jobs (
    id TEXT PRIMARY KEY,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    chat_type TEXT NOT NULL,                 -- dm | group
    thread_id TEXT,
    user_id TEXT NOT NULL,                   -- the run speaks for this user
    source TEXT NOT NULL,                    -- tool | command | cli | config
    created_by TEXT NOT NULL,
    prompt TEXT NOT NULL,
    schedule_kind TEXT NOT NULL,             -- cron | every | at
    schedule TEXT NOT NULL,
    timezone TEXT NOT NULL,
    start_at REAL,
    state TEXT NOT NULL DEFAULT 'active',    -- active | paused | done
    next_run_at REAL,
    last_run_at REAL,
    last_result TEXT,
    rev INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX cron_jobs_chat ON cron_jobs(platform, chat_id);
CREATE TABLE cron_runs (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES cron_jobs(id) ON DELETE CASCADE,
    trigger TEXT NOT NULL,                   -- schedule | manual
    state TEXT NOT NULL,                     -- requested | running | delivered | silent | failed | missed | interrupted | paused
    scheduled_for REAL,
    requested_at REAL,
    started_at REAL,
    finished_at REAL,
    pid INTEGER,
    session_id TEXT,
    outbox_id INTEGER,
    detail TEXT
);
CREATE INDEX cron_runs_job ON cron_runs(job_id, id);
CREATE INDEX cron_runs_open ON cron_runs(state) WHERE state IN ('requested', 'running', 'interrupted');
"""


MIGRATIONS: tuple[Migration, ...] = (
    Migration("0001_sessions_and_messages", _SESSIONS_AND_MESSAGES),
    Migration("0002_inbox", _INBOX),
    Migration("0003_cjk_view", _CJK_VIEW, python=_backfill_cjk),
    # Gateway tables live in the same database and the same migration list (one
    # user_version for the whole file); their code is in gateway/outbox.py and
    # gateway/access.py.
    Migration("0004_outbox", _OUTBOX),
    Migration("0005_pairings", _PAIRINGS),
    Migration("0006_jobs", _JOBS),
    Migration("0007_cron_jobs", _CRON_JOBS),
)
