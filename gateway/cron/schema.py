"""The cron sub-system's tables in ``state.db`` (SQL in ``store.py``). One step of the
ordered list in ``gateway/storage.py``; never edit it once shipped, append a new one.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

# Scheduled jobs and their runs. Times are UTC epoch seconds. ``rev`` changes with a
# job's definition or state, so a running scheduler sees edits made by another process
# (the CLI); a run row is written before the run starts and finished together with its
# outbox delivery.
CRON_JOBS = Migration(
    "0007_cron_jobs",
    """
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
""",
)
