"""Forget one owner's facts in ``facts.db`` so that nothing of them is left in the file
(and, ``*_pg``, in the PostgreSQL tables of ``pg_store``).

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
    """How many facts ``owner`` has in ``facts.db`` (0 when there is no such file)."""
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


def _scalar(row: tuple[object, ...] | None) -> object:
    assert row is not None  # a scalar query always answers one row
    return row[0]


def count_owner_pg(url: str, owner: str) -> int:
    """``count_owner`` for the facts on PostgreSQL (``pg_store``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if _scalar(conn.execute("SELECT to_regclass('holographic.facts')").fetchone()) is None:
            return 0
        n = _scalar(
            conn.execute("SELECT COUNT(*) FROM holographic.facts WHERE owner = %s", (owner,)).fetchone()
        )
        assert isinstance(n, int)
        return n


def erase_owner_pg(url: str, owner: str) -> int:
    """``erase_owner`` for the facts on PostgreSQL: one transaction under the store's
    write lock (no replica writes in between), then ``VACUUM`` so the dead rows' space
    is reclaimed for reuse rather than left for autovacuum."""
    import psycopg

    from mnemo.providers.holographic.pg_store import WRITE_LOCK

    with psycopg.connect(url, autocommit=True) as conn:
        if _scalar(conn.execute("SELECT to_regclass('holographic.facts')").fetchone()) is None:
            return 0
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (WRITE_LOCK,))
            conn.execute(
                "DELETE FROM holographic.fact_entities WHERE fact_id IN"
                " (SELECT id FROM holographic.facts WHERE owner = %s)",
                (owner,),
            )
            n = conn.execute("DELETE FROM holographic.facts WHERE owner = %s", (owner,)).rowcount
            conn.execute("DELETE FROM holographic.memory_banks WHERE owner = %s", (owner,))
            conn.execute(
                "DELETE FROM holographic.entities e WHERE NOT EXISTS"
                " (SELECT 1 FROM holographic.fact_entities fe WHERE fe.entity_id = e.id)"
            )
        for table in ("facts", "fact_entities", "entities", "memory_banks"):
            conn.execute(f"VACUUM holographic.{table}")
        return n
