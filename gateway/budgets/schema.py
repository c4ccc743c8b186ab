"""The budgets' tables in ``state.db`` (SQL in ``ledger.py``). One step of the ordered
list in ``gateway/storage.py``; never edit it once shipped, append a new one.

``usage_days`` holds one row per payer and local day (``gateway.timezone``); a month is
the sum of its days. ``payer`` is ``PLATFORM:ID``, or ``*`` for the whole bot (every
request is counted there too, including background work that bills nobody).
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

BUDGETS = Migration(
    "0010_budgets",
    """
CREATE TABLE usage_days (
    payer TEXT NOT NULL,
    day TEXT NOT NULL,                 -- YYYY-MM-DD in gateway.timezone
    cost_usd REAL NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (payer, day)
) WITHOUT ROWID;
CREATE TABLE budget_overrides (
    payer TEXT PRIMARY KEY,
    daily_usd REAL,
    monthly_usd REAL,
    daily_tokens INTEGER,
    updated_at REAL NOT NULL
);
-- A person at a cap is told once per reset, not once per message.
CREATE TABLE budget_notices (
    payer TEXT NOT NULL,
    resets_at TEXT NOT NULL,
    PRIMARY KEY (payer, resets_at)
) WITHOUT ROWID;
""",
)

# One row per background model request (flush, review, summary, skill review,
# consolidation): upkeep's own daily caps per person and for the whole bot, the
# per-session passes per hour, and the reports that show upkeep apart from the
# conversation. ``payer`` is the canonical PLATFORM:ID, NULL for nobody's (a shared room).
UPKEEP = Migration(
    "0018_upkeep_requests",
    """
CREATE TABLE upkeep_requests (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,                  -- epoch seconds
    day TEXT NOT NULL,                 -- YYYY-MM-DD in gateway.timezone
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,                -- RequestKind: flush, review, summary, ...
    payer TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE INDEX upkeep_requests_day ON upkeep_requests (day, payer);
CREATE INDEX upkeep_requests_session ON upkeep_requests (session_id, at);
""",
)
