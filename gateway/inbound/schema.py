"""The inbound sub-system's table in ``state.db``: pairing requests of unknown DM users
(read and written by ``PairingStore`` in ``access.py``). One step of the ordered list
in ``gateway/storage.py``; never edit it once shipped, append a new migration.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

PAIRINGS = Migration(
    "0005_pairings",
    """
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
""",
)
