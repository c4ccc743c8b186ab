"""Linked identities' tables in ``state.db`` (SQL in ``links.py``). One step of the
ordered list in ``gateway/storage.py``; never edit it once shipped, append a new one.

``identity_links`` has one row per account of a linked person, the canonical account
included (its row points at itself): ``canonical`` is the ``PLATFORM:ID`` whose USER.md,
budget and provider scope they all share. ``link_codes`` holds the pending ``/link``
codes as SHA-256 digests only (a copy of the database does not give anyone a code), one
per account, deleted when used. ``identity_generation`` counts every change of the
links, so a process notices another's (``mnemo users link``) with a one-row read.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

IDENTITY_LINKS = Migration(
    "0011_identity_links",
    """
CREATE TABLE identity_links (
    member TEXT PRIMARY KEY,           -- PLATFORM:ID of one linked account
    canonical TEXT NOT NULL,           -- PLATFORM:ID they share profile, budget, scope with
    linked_at REAL NOT NULL,
    linked_by TEXT NOT NULL            -- 'code' (both accounts acted) or 'admin' (mnemo users link)
);
CREATE INDEX identity_links_canonical ON identity_links (canonical);
CREATE TABLE link_codes (
    code_hash TEXT PRIMARY KEY,        -- sha256 of the code, hex
    user TEXT NOT NULL UNIQUE,         -- PLATFORM:ID that asked for it
    expires_at REAL NOT NULL           -- unix time
);
CREATE TABLE identity_generation (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    n INTEGER NOT NULL
);
INSERT INTO identity_generation (id, n) VALUES (1, 0);
""",
)
