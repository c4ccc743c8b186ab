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
