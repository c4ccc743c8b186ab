"""The delivery sub-system's tables in ``state.db``: the durable inbox and the outbox.

Their SQL lives in ``inbox.py`` and ``outbox.py``; the migrations are here so the
tables are defined next to the only code that reads them. They are two steps of the
one ordered list of ``state.db`` (``gateway/storage.py``) and keep their historical
names and places: never edit a migration that has shipped, append a new one.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

# Durable inbox: an accepted platform message is stored before it is acknowledged.
INBOX = Migration(
    "0002_inbox",
    """
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
""",
)

# The delivery ledger: every reply, command answer and cron result, before it is sent.
OUTBOX = Migration(
    "0004_outbox",
    """
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
""",
)

# The platform message showing a reply while it is generated (``streams.py``).
STREAMS = Migration(
    "0012_streams",
    """
CREATE TABLE streams (
    inbox_id INTEGER PRIMARY KEY,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    message_id TEXT NOT NULL,
    created_at REAL NOT NULL
);
""",
)
