"""Schema migrations: from empty, from the previous version with data kept, refusal of
a newer database, and all-or-nothing application."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from mnemo.gateway.storage import STATE_MIGRATIONS as MIGRATIONS
from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database
from mnemo.memory.errors import SchemaTooNew, StoreError
from mnemo.memory.migrations import Migration, migrate, schema_version, statements


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


async def test_an_empty_database_is_migrated_to_the_latest_version(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db")
    await db.open()
    await db.close()
    conn = _connect(db.path)
    assert schema_version(conn) == len(MIGRATIONS)
    assert {"chats", "sessions", "messages", "messages_ctx", "messages_cjk", "inbox"} <= _tables(conn)
    assert "messages_fts" not in _tables(conn)  # replaced by messages_ctx (0008): nothing to re-index
    names = [r[0] for r in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]
    assert names == [m.name for m in MIGRATIONS]
    conn.close()


async def test_opening_twice_applies_nothing_new(tmp_path: Path) -> None:
    for _ in range(2):
        db = state_database(tmp_path / "state.db")
        await db.open()
        assert db.schema_version == len(MIGRATIONS)
        await db.close()
    conn = _connect(tmp_path / "state.db")
    assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS)
    conn.close()


async def test_a_version_1_database_is_upgraded_in_place_with_its_data_kept(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = _connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    assert migrate(conn, MIGRATIONS[:1]) == 1
    conn.execute("INSERT INTO chats(id, chat_key) VALUES (1, 'telegram:dm:7')")
    conn.execute(
        "INSERT INTO sessions(id, chat_no, chat_key, platform, chat_id, agent_context, source, model, system_prompt,"
        " started_at) VALUES ('s1', 1, 'telegram:dm:7', 'telegram', '7', 'primary', 'chat', 'm', 'sys',"
        " '2024-01-01T00:00:00.000000+00:00')"
    )
    for text in ("We adopted a beagle puppy", "我养了一只小狗"):
        conn.execute(
            "INSERT INTO messages(session_id, chat_no, role, content, created_at) VALUES ('s1', 1, 'user', ?,"
            " '2024-01-01T00:00:01.000000+00:00')",
            (text,),
        )
    conn.close()

    db = state_database(path)
    await db.open()
    assert db.schema_version == len(MIGRATIONS)
    rows = await db.read(lambda c: [r[0] for r in c.execute("SELECT content FROM messages ORDER BY id")])
    count = await db.read(
        lambda c: c.execute("SELECT message_count FROM sessions WHERE id = 's1'").fetchone()[0]
    )
    stemmed = await db.read(
        lambda c: c.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'adopting'").fetchall()
    )
    # The CJK view was created later: the migration back-filled the old row.
    cjk = await db.read(
        lambda c: c.execute("SELECT rowid FROM messages_cjk WHERE messages_cjk MATCH '小狗'").fetchall()
    )
    for table in ("messages_fts", "messages_cjk"):
        await db.write(lambda c, t=table: c.execute(f"INSERT INTO {t}({t}) VALUES ('integrity-check')"))
    await db.close()
    assert rows == ["We adopted a beagle puppy", "我养了一只小狗"]
    assert count == 2  # the counter trigger ran for the rows written at version 1
    assert [r[0] for r in stemmed] == [1]
    assert [r[0] for r in cjk] == [2]


async def test_a_database_from_a_newer_mnemo_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = _connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    conn.close()
    db = state_database(path)
    with pytest.raises(SchemaTooNew, match=r"written by a newer mnemo"):
        await db.open()
    assert not db.is_open


def test_a_failing_migration_leaves_the_database_at_the_previous_version(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "state.db")
    broken = (*MIGRATIONS, Migration("9999_broken", "CREATE TABLE half_done(x);\nCREATE TABLE oops(;"))
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, broken)
    assert schema_version(conn) == len(MIGRATIONS)
    assert "half_done" not in _tables(conn)
    conn.close()


def test_appending_a_migration_upgrades_an_existing_database(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "state.db")
    migrate(conn, MIGRATIONS)
    calls = []
    extended = (
        *MIGRATIONS,
        Migration(
            "9999_appended",
            "CREATE TABLE appended_demo (id INTEGER PRIMARY KEY, state TEXT NOT NULL);\n"
            "CREATE INDEX appended_demo_pending ON appended_demo(state) WHERE state = 'pending';",
            python=lambda c: calls.append(c.execute("SELECT count(*) FROM appended_demo").fetchone()[0]),
        ),
    )
    assert migrate(conn, extended) == len(MIGRATIONS) + 1
    assert "appended_demo" in _tables(conn)
    assert calls == [0]  # the Python step ran once, after the SQL, in the same transaction
    conn.close()


def test_statements_keep_trigger_bodies_whole() -> None:
    sql = """
    CREATE TABLE a(x);
    CREATE TRIGGER t AFTER INSERT ON a BEGIN
        INSERT INTO a VALUES (1);
        INSERT INTO a VALUES (2);
    END;
    CREATE INDEX i ON a(x);
    """
    parts = list(statements(sql))
    assert len(parts) == 3
    assert parts[1].startswith("CREATE TRIGGER") and parts[1].endswith("END;")


def test_statements_reject_an_unterminated_statement() -> None:
    with pytest.raises(ValueError, match="incomplete"):
        list(statements("CREATE TABLE a(x)"))


# --- the list assembled from the sub-systems' schema modules --------------------------

HISTORICAL_NAMES = [
    "0001_sessions_and_messages",
    "0002_inbox",
    "0003_cjk_view",
    "0004_outbox",
    "0005_pairings",
    "0006_jobs",
    "0007_cron_jobs",
]


# Every step shipped so far, in order: existing databases count on it (append only).
SHIPPED_NAMES = [
    *HISTORICAL_NAMES,
    "0008_contextual_index",
    "0009_message_vectors",
    "0010_budgets",
    "0011_identity_links",
    "0012_streams",
    "0013_jobs_dedupe_key",
]
SHIPPED_PG_NAMES = [
    *HISTORICAL_NAMES,
    "0012_streams",
    "0011_identity_links",
    "pg_replicas",
    "0010_budgets",
    "pg_curated_memory",
    "pg_rate_limits",
    "0013_jobs_dedupe_key",
]


def test_shipped_steps_keep_their_names_and_order_on_both_backends() -> None:
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS

    assert [m.name for m in MIGRATIONS[: len(SHIPPED_NAMES)]] == SHIPPED_NAMES
    assert [m.name for m in PG_MIGRATIONS[: len(SHIPPED_PG_NAMES)]] == SHIPPED_PG_NAMES


def _legacy_migrations():
    """``memory/migrations.py`` as it was when it held every table in one list (commit
    94559e0, kept verbatim in tests/memory/data)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "legacy_migrations_0007", Path(__file__).parent / "data" / "legacy_migrations_0007.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _schema(conn: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
    return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()


def test_the_assembled_list_is_the_historical_one_step_for_step() -> None:
    legacy = _legacy_migrations()
    # Later steps are appended after the historical ones (0008_contextual_index, ...).
    assert [m.name for m in MIGRATIONS[: len(HISTORICAL_NAMES)]] == HISTORICAL_NAMES
    assert [m.name for m in legacy.MIGRATIONS] == HISTORICAL_NAMES
    for new, old in zip(MIGRATIONS[: len(HISTORICAL_NAMES)], legacy.MIGRATIONS, strict=True):
        assert new.sql == old.sql, new.name
        assert (new.python is None) == (old.python is None), new.name


async def test_a_database_of_the_single_list_code_is_at_version_7_and_nothing_reruns(tmp_path: Path) -> None:
    legacy = _legacy_migrations()
    path = tmp_path / "state.db"
    conn = _connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    assert legacy.migrate(conn) == 7
    conn.execute(
        "INSERT INTO outbox(platform, chat_id, text, created_at) VALUES ('telegram', '7', 'hi', 1.0)"
    )
    # Mark the recorded history: a re-run step would insert a new row and fail on the
    # version key, or leave these untouched values changed.
    conn.execute("UPDATE schema_migrations SET applied_at = 'legacy'")
    schema_before = _schema(conn)
    conn.close()

    db = Database(path, migrations=MIGRATIONS[:7])  # the historical steps; later ones are appended
    await db.open()
    assert db.schema_version == 7
    history = await db.read(
        lambda c: c.execute(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()
    )
    outbox = await db.read(lambda c: c.execute("SELECT text FROM outbox").fetchall())
    schema_after = await db.read(_schema)
    await db.close()
    assert [tuple(r) for r in history] == [(i + 1, n, "legacy") for i, n in enumerate(HISTORICAL_NAMES)]
    assert [r[0] for r in outbox] == ["hi"]
    assert [tuple(r) for r in schema_after] == [tuple(r) for r in schema_before]

    # And a database created by the assembled list has exactly the legacy schema.
    fresh = Database(tmp_path / "fresh.db", migrations=MIGRATIONS[:7])
    await fresh.open()
    fresh_schema = await fresh.read(_schema)
    await fresh.close()
    assert [tuple(r) for r in fresh_schema] == [tuple(r) for r in schema_before]


def test_a_list_in_another_order_is_refused_against_an_existing_database(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "state.db")
    migrate(conn, MIGRATIONS[:2])
    swapped = (MIGRATIONS[0], MIGRATIONS[2], MIGRATIONS[1], *MIGRATIONS[3:])
    with pytest.raises(StoreError, match="0002_inbox"):
        migrate(conn, swapped)
    assert schema_version(conn) == 2
    conn.close()
