"""memory's tables on PostgreSQL: sessions, messages and their full-text index.

The same two steps, under the same names, as ``memory/migrations.py`` for SQLite; the
gateway's steps go between them in the one ordered list (``gateway/storage_pg/schema.py``).
Never edit a step that has shipped: append a new one.

Search: ``messages.tsv`` is a generated ``tsvector`` (English stemming, so 'adopted'
finds 'adopting'), indexed together with ``chat_no`` in one GIN index (``btree_gin``):
the chat scope is part of the index condition, so a chat's query never ranks another
chat's rows. Unspaced scripts get their unigram+bigram text in ``messages.cjk``
(``memory/cjk.py``), indexed the same way with the ``simple`` configuration.
"""

from __future__ import annotations

from mnemo.memory.pg.db import PgMigration

SESSIONS_AND_MESSAGES = PgMigration(
    "0001_sessions_and_messages",
    """
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE TABLE chats (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chat_key text NOT NULL UNIQUE
);
CREATE TABLE sessions (
    id                 text PRIMARY KEY,
    seq                bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    chat_no            bigint NOT NULL REFERENCES chats(id),
    chat_key           text NOT NULL,
    platform           text NOT NULL,
    chat_id            text NOT NULL,
    thread_id          text,
    user_id            text,
    agent_context      text NOT NULL,
    source             text NOT NULL,
    model              text NOT NULL,
    system_prompt      text NOT NULL,
    parent_session_id  text REFERENCES sessions(id),
    started_at         timestamptz NOT NULL,
    ended_at           timestamptz,
    end_reason         text,
    message_count      integer NOT NULL DEFAULT 0,
    tool_call_count    integer NOT NULL DEFAULT 0,
    input_tokens       bigint NOT NULL DEFAULT 0,
    output_tokens      bigint NOT NULL DEFAULT 0,
    cache_read_tokens  bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    estimated_cost_usd double precision NOT NULL DEFAULT 0,
    title              text
);
CREATE INDEX sessions_by_chat ON sessions(chat_key, source, started_at);
CREATE INDEX sessions_by_parent ON sessions(parent_session_id);
CREATE TABLE messages (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id          text NOT NULL REFERENCES sessions(id),
    chat_no             bigint NOT NULL,
    role                text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    content             text NOT NULL,
    tool_calls          text,
    tool_call_id        text,
    tool_name           text,
    is_error            boolean NOT NULL DEFAULT false,
    author_id           text,
    author_name         text,
    platform_message_id text,
    created_at          timestamptz NOT NULL,
    token_count         integer NOT NULL DEFAULT 0,
    finish_reason       text,
    meta                text NOT NULL DEFAULT '{}',
    tsv                 tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, content)) STORED
);
CREATE INDEX messages_by_session ON messages(session_id, id);
CREATE INDEX messages_fts ON messages USING gin (chat_no, tsv);
""",
)

CJK_VIEW = PgMigration(
    "0003_cjk_view",
    """
ALTER TABLE messages ADD COLUMN cjk text;
ALTER TABLE messages ADD COLUMN cjk_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, coalesce(cjk, ''))) STORED;
CREATE INDEX messages_cjk ON messages USING gin (chat_no, cjk_tsv) WHERE cjk IS NOT NULL;
""",
)
