"""Forget one owner's facts in ``facts.db`` so that nothing of them is left in the file.

Only the standard library (no numpy): ``mnemo users erase`` runs it without loading
the provider. Deleting through SQL fires the FTS triggers; an FTS5 ``delete`` only adds
a tombstone segment, so the index is then merged (``optimize``) for the old terms to
leave it; ``secure_delete`` zeroes freed pages, ``VACUUM`` rebuilds the file and the
WAL is checkpointed and truncated.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def count_owner(path: Path, owner: str) -> int:
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM facts WHERE owner = ?", (owner,)).fetchone()[0])
    finally:
        conn.close()


def erase_owner(path: Path, owner: str) -> int:
    """Delete ``owner``'s facts, their memory banks and entities only they named;
    return the number of facts removed."""
    if not path.exists():
        return 0
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA secure_delete=ON")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "DELETE FROM fact_entities WHERE fact_id IN (SELECT id FROM facts WHERE owner = ?)", (owner,)
        )
        n = conn.execute("DELETE FROM facts WHERE owner = ?", (owner,)).rowcount
        conn.execute("DELETE FROM memory_banks WHERE owner = ?", (owner,))
        conn.execute("DELETE FROM entities WHERE id NOT IN (SELECT entity_id FROM fact_entities)")
        conn.execute("INSERT INTO facts_fts(facts_fts) VALUES ('optimize')")
        conn.execute("COMMIT")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return n
    finally:
        conn.close()
