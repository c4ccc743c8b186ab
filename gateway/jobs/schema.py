"""The worker queue's table in ``state.db`` (SQL in ``queue.py``). One step of the
ordered list in ``gateway/storage.py``; never edit it once shipped, append a new one.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

# At most one queued or running job per (session, kind): the partial unique index is
# the single-flight rule.
JOBS = Migration(
    "0006_jobs",
    """
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
""",
)

# Provider writes (``provider_writes.py``) were keyed by putting "<provider>:<write key>"
# in ``session_id``. The key gets its own column and ``session_id`` is the session the
# write came from again ('' for an erasure, which has none; the scope names it). A job
# with a key is single flight per key and does not take its session's turn, so the
# (session, kind) rule now covers the session's own work only.
JOBS_DEDUPE_KEY = Migration(
    "0013_jobs_dedupe_key",
    """
ALTER TABLE jobs ADD COLUMN dedupe_key TEXT;
-- The old index goes first: several writes of one session share its id after the update.
DROP INDEX jobs_single_flight;
UPDATE jobs SET dedupe_key = session_id,
    session_id = CASE WHEN json_extract(payload, '$.payload.op') = 'forget_user' THEN ''
        ELSE COALESCE(json_extract(payload, '$.payload.scope.session_id'), '') END
    WHERE kind = 'provider_write';
CREATE UNIQUE INDEX jobs_single_flight ON jobs(session_id, kind)
    WHERE state IN ('queued', 'running') AND dedupe_key IS NULL;
CREATE UNIQUE INDEX jobs_dedupe_single_flight ON jobs(dedupe_key)
    WHERE state IN ('queued', 'running') AND dedupe_key IS NOT NULL;
CREATE INDEX jobs_dedupe ON jobs(dedupe_key) WHERE dedupe_key IS NOT NULL;
""",
)
