"""The whole PostgreSQL schema as one ordered, append-only list (``PG_MIGRATIONS``), with
the same step names as ``STATE_MIGRATIONS`` (``gateway/storage.py``) where the tables
correspond. Never edit, reorder or rename a step that has shipped: append a new one.

Differences from SQLite, all for several replicas on one database: ``jobs`` and
``outbox`` rows record who claimed them (``owner``/``sender``) and until when
(``lease_until``/``claimed_at``), and at most one job per session runs at a time across
replicas (a partial unique index, where SQLite relies on its single writer).
"""

from __future__ import annotations

from mnemo.gateway.storage_pg.budgets import BUDGETS, UPKEEP
from mnemo.gateway.storage_pg.heartbeats import REPLICAS
from mnemo.gateway.storage_pg.mcp import MCP
from mnemo.gateway.storage_pg.media_usage import MEDIA_USAGE
from mnemo.gateway.storage_pg.rate_limits import RATE_LIMITS
from mnemo.memory.pg.curated import CURATED_MEMORY
from mnemo.memory.pg.db import PgMigration
from mnemo.memory.pg.journal import PG_MEMORY_JOURNAL
from mnemo.memory.pg.policy import PG_MEMORY_POLICIES
from mnemo.memory.pg.schema import CJK_VIEW, SESSIONS_AND_MESSAGES

INBOX = PgMigration(
    "0002_inbox",
    """
CREATE TABLE inbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    platform    text NOT NULL,
    chat_id     text NOT NULL,
    message_id  text NOT NULL,
    payload     text NOT NULL,
    state       text NOT NULL DEFAULT 'received'
                CHECK (state IN ('received', 'processing', 'done', 'failed')),
    attempts    integer NOT NULL DEFAULT 0,
    error       text,
    received_at timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (platform, chat_id, message_id)
);
CREATE INDEX inbox_unfinished ON inbox(id) WHERE state IN ('received', 'processing');
""",
)

OUTBOX = PgMigration(
    "0004_outbox",
    """
CREATE TABLE outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    platform text NOT NULL,
    chat_id text NOT NULL,
    thread_id text,
    text text NOT NULL,
    kind text NOT NULL DEFAULT 'reply',
    reply_to text,
    mention_user_id text,
    session_id text,
    inbox_id bigint,
    state text NOT NULL DEFAULT 'queued',
    attempts integer NOT NULL DEFAULT 0,
    possible_duplicate boolean NOT NULL DEFAULT false,
    not_before double precision NOT NULL DEFAULT 0,
    created_at double precision NOT NULL,
    sent_at double precision,
    platform_ids text,
    error text,
    sender text,
    claimed_at double precision
);
CREATE INDEX outbox_pending ON outbox(state, not_before);
CREATE UNIQUE INDEX outbox_inbox ON outbox(inbox_id) WHERE inbox_id IS NOT NULL;
""",
)

PAIRINGS = PgMigration(
    "0005_pairings",
    """
CREATE TABLE pairings (
    code text PRIMARY KEY,
    platform text NOT NULL,
    user_id text NOT NULL,
    user_name text NOT NULL DEFAULT '',
    state text NOT NULL DEFAULT 'pending',
    created_at double precision NOT NULL,
    decided_at double precision,
    decided_by text
);
CREATE INDEX pairings_user ON pairings(platform, user_id, state);
""",
)

JOBS = PgMigration(
    "0006_jobs",
    """
CREATE TABLE jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    session_id text NOT NULL,
    payload text NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    not_before double precision NOT NULL DEFAULT 0,
    checkpoint text NOT NULL DEFAULT '{}',
    error text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    started_at double precision,
    finished_at double precision,
    owner text,
    lease_until double precision
);
CREATE UNIQUE INDEX jobs_single_flight ON jobs(session_id, kind) WHERE state IN ('queued', 'running');
CREATE UNIQUE INDEX jobs_one_running ON jobs(session_id) WHERE state = 'running';
CREATE INDEX jobs_due ON jobs(state, not_before);
CREATE INDEX jobs_session ON jobs(session_id, kind);
""",
)

CRON_JOBS = PgMigration(
    "0007_cron_jobs",
    """
CREATE TABLE cron_jobs (
    id text PRIMARY KEY,
    platform text NOT NULL,
    chat_id text NOT NULL,
    chat_type text NOT NULL,
    thread_id text,
    user_id text NOT NULL,
    source text NOT NULL,
    created_by text NOT NULL,
    prompt text NOT NULL,
    schedule_kind text NOT NULL,
    schedule text NOT NULL,
    timezone text NOT NULL,
    start_at double precision,
    state text NOT NULL DEFAULT 'active',
    next_run_at double precision,
    last_run_at double precision,
    last_result text,
    rev integer NOT NULL DEFAULT 1,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);
CREATE INDEX cron_jobs_chat ON cron_jobs(platform, chat_id);
CREATE TABLE cron_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id text NOT NULL REFERENCES cron_jobs(id) ON DELETE CASCADE,
    trigger text NOT NULL,
    state text NOT NULL,
    scheduled_for double precision,
    requested_at double precision,
    started_at double precision,
    finished_at double precision,
    pid integer,
    session_id text,
    outbox_id bigint,
    detail text
);
CREATE INDEX cron_runs_job ON cron_runs(job_id, id);
CREATE INDEX cron_runs_open ON cron_runs(state) WHERE state IN ('requested', 'running', 'interrupted');
""",
)

# The platform message showing a reply while it is generated (gateway/delivery/streams.py).
STREAMS = PgMigration(
    "0012_streams",
    """
CREATE TABLE streams (
    inbox_id bigint PRIMARY KEY,
    platform text NOT NULL,
    chat_id text NOT NULL,
    thread_id text,
    message_id text NOT NULL,
    created_at double precision NOT NULL
);
""",
)

# Linked identities (gateway/people/links.py, storage_pg/links.py); ``usr`` because
# ``user`` is reserved in PostgreSQL.
IDENTITY_LINKS = PgMigration(
    "0011_identity_links",
    """
CREATE TABLE identity_links (
    member text PRIMARY KEY,
    canonical text NOT NULL,
    linked_at double precision NOT NULL,
    linked_by text NOT NULL
);
CREATE INDEX identity_links_canonical ON identity_links(canonical);
CREATE TABLE link_codes (
    code_hash text PRIMARY KEY,
    usr text NOT NULL UNIQUE,
    expires_at double precision NOT NULL
);
CREATE TABLE identity_generation (
    id integer PRIMARY KEY CHECK (id = 1),
    n bigint NOT NULL
);
INSERT INTO identity_generation (id, n) VALUES (1, 0);
""",
)

# The twin of ``gateway/jobs/schema.py``'s step: provider writes get their dedupe key in
# its own column, ``session_id`` names their session again ('' for an erasure), and
# neither "one job per (session, kind)" nor "one running job per session" applies to a
# job with a key (single flight per key instead). ``payload::json``, not jsonb: a NUL
# escape in a queued turn's text must not stop the upgrade.
JOBS_DEDUPE_KEY = PgMigration(
    "0013_jobs_dedupe_key",
    """
ALTER TABLE jobs ADD COLUMN dedupe_key text;
-- The old indexes go first: several writes of one session share its id after the update.
DROP INDEX jobs_single_flight;
DROP INDEX jobs_one_running;
UPDATE jobs SET dedupe_key = session_id,
    session_id = CASE WHEN payload::json #>> '{payload,op}' = 'forget_user' THEN ''
        ELSE COALESCE(payload::json #>> '{payload,scope,session_id}', '') END
    WHERE kind = 'provider_write';
CREATE UNIQUE INDEX jobs_single_flight ON jobs(session_id, kind)
    WHERE state IN ('queued', 'running') AND dedupe_key IS NULL;
CREATE UNIQUE INDEX jobs_one_running ON jobs(session_id) WHERE state = 'running' AND dedupe_key IS NULL;
CREATE UNIQUE INDEX jobs_dedupe_single_flight ON jobs(dedupe_key)
    WHERE state IN ('queued', 'running') AND dedupe_key IS NOT NULL;
CREATE INDEX jobs_dedupe ON jobs(dedupe_key) WHERE dedupe_key IS NOT NULL;
""",
)

# search.semantic's vectors (memory/pg/semantic.py), pgvector when the server has it.
MESSAGE_VECTORS = PgMigration(
    "0009_message_vectors",
    """
CREATE TABLE message_vectors (
    id      bigint PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    chat_no bigint NOT NULL,
    model   text NOT NULL,
    vec     bytea NOT NULL
);
CREATE INDEX message_vectors_by_chat ON message_vectors(chat_no, model, id);
-- pgvector when the server has it; otherwise the bytes alone (no error).
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS vector;
    ALTER TABLE message_vectors ADD COLUMN embedding vector(384);
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'pgvector is not available: message vectors are kept as bytes';
END
$$;
""",
)


PG_MIGRATIONS: tuple[PgMigration, ...] = (
    SESSIONS_AND_MESSAGES,
    INBOX,
    CJK_VIEW,
    OUTBOX,
    PAIRINGS,
    JOBS,
    CRON_JOBS,
    STREAMS,
    IDENTITY_LINKS,
    REPLICAS,  # storage_pg/heartbeats.py: replicas, inbox.owner, mnemo_replica_alive()
    BUDGETS,  # storage_pg/budgets.py: the spending ledger
    CURATED_MEMORY,  # memory/pg/curated.py: MEMORY.md and every USER.md as rows
    RATE_LIMITS,  # storage_pg/rate_limits.py: the per-user rate limit's shared window
    JOBS_DEDUPE_KEY,  # the dedupe key of provider writes in its own column
    MEDIA_USAGE,  # storage_pg/media_usage.py: what people store, for media.quota
    PG_MEMORY_JOURNAL,  # memory/pg/journal.py: every memory write with its provenance
    PG_MEMORY_POLICIES,  # memory/pg/policy.py: what may be remembered, per person and chat
    MCP,  # storage_pg/mcp.py: MCP client tokens, tool catalogs, reload requests
    UPKEEP,  # storage_pg/budgets.py: background memory work, for its caps and reports
    MESSAGE_VECTORS,  # memory/pg/semantic.py uses it: search.semantic's vectors
)
