"""Moving a SQLite profile to PostgreSQL (``mnemo migrate --to postgresql://…``).

The copy, table by table, of ``$MNEMO_HOME/state.db`` into a PostgreSQL database that
has this mnemo's schema (``PG_MIGRATIONS``, applied first):

* **The source is only read.** ``state.db`` is opened read-only (``mode=ro``) and read
  inside one transaction, so the copy is one consistent snapshot and not a byte of the
  file changes. The caller holds the profile lock, so no gateway writes it meanwhile.
* **Which tables.** Every table that exists on both sides, in foreign-key order (chats,
  sessions, messages, then the gateway's); the columns both sides have (PostgreSQL-only
  columns such as the claim leases get their defaults, generated ones are computed).
  A table only SQLite has (no PostgreSQL home yet) is listed in the receipt as not
  migrated, with its row count: it stays in ``state.db``.
* **Keys are kept.** Rows keep their ids (``OVERRIDING SYSTEM VALUE`` for identity
  columns; the sequences are moved past the copied ids afterwards), so a session keeps
  its id and its messages their order.
* **Resumable and idempotent.** Each batch is one PostgreSQL transaction: ``COPY`` into a
  temporary table, ``INSERT … ON CONFLICT DO NOTHING`` into the real one, and the batch's
  last source key stored in ``mnemo_profile_migration`` (this command's ledger, one row
  per source profile). A run killed anywhere resumes after the last committed batch; a
  batch that was in flight is rolled back whole, or already committed and skipped. Once
  a migration has finished, another run copies nothing and only verifies.
* **Only into an empty database**, or one this same profile was being migrated into: the
  kept ids would collide with another profile's or a running bot's rows.
* **Verified.** After copying, every table's source keys are looked up in the target:
  ``present`` must equal the source's row count.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from mnemo.memory.errors import StoreError

if TYPE_CHECKING:  # psycopg is the postgres extra's: imported only when a migration runs
    from mnemo.memory.pg.db import Connection

T = TypeVar("T")

LEDGER = "mnemo_profile_migration"
# pg_advisory_lock key: one `mnemo migrate` at a time into a database.
MIGRATE_LOCK = "mnemo-migrate"
# Parents before children: these go first, in this order; any other common table after.
ORDER = (
    "chats",
    "sessions",
    "messages",
    "inbox",
    "outbox",
    "pairings",
    "jobs",
    "cron_jobs",
    "cron_runs",
    "streams",
)
# Rows here mean the target already serves a bot (or holds another profile).
DATA_TABLES = ("chats", "sessions", "inbox", "outbox", "jobs", "cron_jobs", "pairings")
# SQLite search's own derived state (rebuilt from messages there; PostgreSQL indexes
# messages itself with a generated tsvector).
DERIVED = frozenset({"chat_speakers", "search_reindex", "message_vectors"})
NEVER_COPIED = frozenset({"schema_migrations", "sqlite_sequence", "sqlite_stat1", "sqlite_stat4", LEDGER})
DEFAULT_BATCH = 2000
# Columns PostgreSQL names differently (``user`` is a reserved word there).
RENAMED = {"link_codes": {"user": "usr"}}

Progress = Callable[[str, int, int], None]  # (table, rows done overall, rows overall)


class MigrateRefused(StoreError):
    """The migration cannot start: the target holds other data, another migration runs."""


@dataclass
class TableCopy:
    name: str
    source_rows: int
    copied: int = 0  # inserted by this run
    present: int = 0  # source rows found in the target afterwards
    left_out_columns: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        return self.present == self.source_rows

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source_rows,
            "copied": self.copied,
            "present": self.present,
            "verified": self.verified,
        }
        if self.left_out_columns:
            out["left_out_columns"] = list(self.left_out_columns)
        return out


@dataclass(frozen=True)
class NotMigrated:
    what: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}


@dataclass
class Receipt:
    source: str
    target: str  # without its password
    tables: list[TableCopy] = field(default_factory=list)
    not_migrated: list[NotMigrated] = field(default_factory=list)
    already_complete: bool = False  # an earlier run had finished: nothing was copied
    seconds: float = 0.0

    @property
    def verified(self) -> bool:
        return all(t.verified for t in self.tables)

    @property
    def copied(self) -> int:
        return sum(t.copied for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "verified": self.verified,
            "already_complete": self.already_complete,
            "copied": self.copied,
            "tables": {t.name: t.to_json() for t in self.tables},
            "not_migrated": [n.to_json() for n in self.not_migrated],
            "seconds": round(self.seconds, 3),
        }


# --- the source ------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceTable:
    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]  # the primary key (what verification looks up in the target)
    order: tuple[str, ...]  # what the batches page by: ("rowid",) or the primary key


class Source:
    """``state.db`` opened read-only, inside one read transaction (one snapshot)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA query_only = ON")
        self._conn.execute("BEGIN")
        self._lock = asyncio.Lock()

    def close(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        self._conn.close()

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:  # one connection: one statement at a time, off the loop
            return await asyncio.to_thread(fn, self._conn)

    def identity(self, conn: sqlite3.Connection) -> str:
        """The profile's identity for the ledger: its path and when its schema was created."""
        try:
            row = conn.execute("SELECT applied_at FROM schema_migrations WHERE version = 1").fetchone()
        except sqlite3.OperationalError:
            row = None
        return f"{self.path.resolve()}#{row[0] if row else ''}"

    @staticmethod
    def tables(conn: sqlite3.Connection) -> dict[str, SourceTable]:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        virtual = [n for n, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
        out: dict[str, SourceTable] = {}
        for name, _sql in rows:
            if name in NEVER_COPIED or name in virtual or any(name.startswith(f"{v}_") for v in virtual):
                continue
            info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
            columns = tuple(r[1] for r in info)
            key = tuple(r[1] for r in sorted((r for r in info if r[5] > 0), key=lambda r: r[5]))
            try:
                conn.execute(f'SELECT rowid FROM "{name}" LIMIT 0')
                order: tuple[str, ...] = ("rowid",)
            except sqlite3.OperationalError:  # WITHOUT ROWID: page by the primary key
                order = key
            out[name] = SourceTable(name, columns, key or order, order)
        return out

    @staticmethod
    def count(conn: sqlite3.Connection, table: SourceTable, after: Sequence[Any] | None = None) -> int:
        where, args = _after(table, after)
        return int(conn.execute(f'SELECT count(*) FROM "{table.name}"{where}', args).fetchone()[0])

    @staticmethod
    def batch(
        conn: sqlite3.Connection,
        table: SourceTable,
        columns: Sequence[str],
        after: Sequence[Any] | None,
        limit: int,
    ) -> list[tuple[Any, ...]]:
        """``limit`` rows after the key ``after``: the order columns first, then ``columns``."""
        where, args = _after(table, after)
        order = ", ".join(table.order)
        back = {new: old for old, new in RENAMED.get(table.name, {}).items()}
        cols = ", ".join(f'"{back.get(c, c)}"' for c in columns)
        sql = f'SELECT {order}, {cols} FROM "{table.name}"{where} ORDER BY {order} LIMIT ?'
        return conn.execute(sql, (*args, limit)).fetchall()


def _renamed(table: SourceTable) -> SourceTable:
    """The table as PostgreSQL names its columns (``SELECT "user" AS usr``)."""
    names = RENAMED.get(table.name)
    if not names:
        return table
    return SourceTable(
        table.name,
        tuple(names.get(c, c) for c in table.columns),
        tuple(names.get(c, c) for c in table.key),
        table.order,
    )


def _after(table: SourceTable, after: Sequence[Any] | None) -> tuple[str, tuple[Any, ...]]:
    if after is None:
        return "", ()
    cols = ", ".join(table.order)
    marks = ", ".join("?" for _ in table.order)
    return f" WHERE ({cols}) > ({marks})", tuple(after)


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: stored as U+FFFD, as the PostgreSQL stores do."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


# --- the target ------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetTable:
    name: str
    columns: frozenset[str]  # those a value may be written to (not generated)
    identity: frozenset[str]


async def _target_tables(conn: Connection) -> dict[str, TargetTable]:
    rows = await (
        await conn.execute(
            "SELECT c.table_name, c.column_name, c.is_identity, c.is_generated FROM information_schema.columns c"
            " JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
        )
    ).fetchall()
    cols: dict[str, set[str]] = {}
    ident: dict[str, set[str]] = {}
    for r in rows:
        cols.setdefault(r["table_name"], set())
        ident.setdefault(r["table_name"], set())
        if r["is_generated"] == "ALWAYS":
            continue
        cols[r["table_name"]].add(r["column_name"])
        if r["is_identity"] == "YES":
            ident[r["table_name"]].add(r["column_name"])
    return {n: TargetTable(n, frozenset(cols[n]), frozenset(ident[n])) for n in cols}


def _plan(source: dict[str, SourceTable], target: dict[str, TargetTable]) -> list[str]:
    common = [n for n in source if n in target and n not in NEVER_COPIED]
    first = [n for n in ORDER if n in common]
    return first + sorted(n for n in common if n not in first)


async def _one(conn: Connection, query: str, params: Sequence[object] = ()) -> dict[str, Any]:
    """The row of a query that always returns exactly one (a SELECT of expressions)."""
    row = await (await conn.execute(query, params)).fetchone()
    if row is None:
        raise StoreError(f"PostgreSQL returned no row for: {query}")
    return row


async def _ledger(conn: Connection, source_id: str) -> dict[str, Any] | None:
    """This profile's ledger row; None when no migration of it was started here."""
    found = await _one(conn, "SELECT to_regclass(%s) AS t", (LEDGER,))
    if found["t"] is None:
        return None
    others = await (
        await conn.execute(f"SELECT source FROM {LEDGER} WHERE source <> %s", (source_id,))
    ).fetchall()
    if others:
        raise MigrateRefused(
            f"another profile ({others[0]['source'].split('#')[0]}) was migrated into this database; "
            "migrate into an empty database"
        )
    return await (await conn.execute(f"SELECT * FROM {LEDGER} WHERE source = %s", (source_id,))).fetchone()


async def _start_ledger(conn: Connection, source_id: str) -> None:
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {LEDGER} (source text PRIMARY KEY, started_at timestamptz NOT NULL DEFAULT now(),"
        " finished_at timestamptz, cursors jsonb NOT NULL DEFAULT '{}')"
    )
    await conn.execute(f"INSERT INTO {LEDGER} (source) VALUES (%s) ON CONFLICT DO NOTHING", (source_id,))


async def _refuse_if_occupied(conn: Connection, present: set[str]) -> None:
    for name in DATA_TABLES:
        if name in present:
            row = await _one(conn, f'SELECT EXISTS (SELECT 1 FROM "{name}") AS used')
            if row["used"]:
                raise MigrateRefused(
                    f"the target database already holds data (table {name} is not empty): a bot runs on it, or "
                    "another profile was copied there; migrate into an empty database"
                )


# --- the copy ----------------------------------------------------------------------------


class Migration:
    def __init__(
        self, state_db: Path, url: str, *, batch_size: int = DEFAULT_BATCH, progress: Progress | None = None
    ) -> None:
        self.state_db = state_db
        self.url = url
        self.batch_size = batch_size
        self.progress = progress or (lambda table, done, total: None)
        self._source_id = ""

    async def run(self) -> Receipt:
        import psycopg
        from psycopg.rows import dict_row

        from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
        from mnemo.memory.pg.db import PgDatabase, redact

        started = time.monotonic()
        # Opening it applies this mnemo's PostgreSQL schema (and refuses a newer one).
        db = PgDatabase(self.url, migrations=PG_MIGRATIONS, max_size=1)
        await db.open()
        await db.close()
        receipt = Receipt(source=str(self.state_db), target=redact(self.url))
        source = Source(self.state_db)
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=dict_row)
            try:
                got = await _one(
                    conn, "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS ok", (MIGRATE_LOCK,)
                )
                if not got["ok"]:
                    raise MigrateRefused("another `mnemo migrate` is copying into this database right now")
                await self._copy(source, conn, receipt)
            finally:
                await conn.close()
        finally:
            source.close()
        receipt.seconds = time.monotonic() - started
        return receipt

    async def _copy(self, source: Source, conn: Connection, receipt: Receipt) -> None:
        src_tables: dict[str, SourceTable] = await source.run(Source.tables)
        source_id: str = await source.run(source.identity)
        self._source_id = source_id
        tgt_tables = await _target_tables(conn)
        ledger = await _ledger(conn, source_id)
        if ledger is None:
            await _refuse_if_occupied(conn, set(tgt_tables))
            await _start_ledger(conn, source_id)
            cursors: dict[str, Any] = {}
        else:
            cursors = dict(ledger["cursors"])
            receipt.already_complete = ledger["finished_at"] is not None
        src_tables = {n: _renamed(t) for n, t in src_tables.items()}
        names = _plan(src_tables, tgt_tables)
        for name in sorted(set(src_tables) - set(names)):
            n = await source.run(partial(Source.count, table=src_tables[name]))
            why = (
                "SQLite search's own index, derived from the messages (PostgreSQL indexes them itself)"
                if name in DERIVED
                else "no PostgreSQL table for it yet: it stays in state.db"
            )
            receipt.not_migrated.append(NotMigrated(f"table {name} ({n} rows)", why))
        copies = {
            n: TableCopy(n, await source.run(partial(Source.count, table=src_tables[n]))) for n in names
        }
        receipt.tables = list(copies.values())
        total = sum(t.source_rows for t in receipt.tables)
        done = 0
        for name in names:
            table = src_tables[name]
            after = cursors.get(name)
            remaining = await source.run(partial(Source.count, table=table, after=after))
            done += copies[name].source_rows - remaining
        self.progress("", done, total)
        for name in names:
            table, target = src_tables[name], tgt_tables[name]
            columns = tuple(c for c in table.columns if c in target.columns)
            copies[name].left_out_columns = tuple(c for c in table.columns if c not in target.columns)
            if not receipt.already_complete:
                done = await self._copy_table(
                    source, conn, table, target, columns, cursors.get(name), copies[name], done, total
                )
                if name == "sessions" and "parent_session_id" in columns:
                    await self._link_parents(source, conn)
                if target.identity & set(columns):
                    await _advance_identity(conn, name, target.identity & set(columns))
        for name in names:
            copies[name].present = await self._verify(source, conn, src_tables[name])
        if not receipt.already_complete and receipt.verified:
            await conn.execute(f"UPDATE {LEDGER} SET finished_at = now() WHERE source = %s", (source_id,))

    async def _copy_table(
        self,
        source: Source,
        conn: Connection,
        table: SourceTable,
        target: TargetTable,
        columns: tuple[str, ...],
        after: Any,
        copy: TableCopy,
        done: int,
        total: int,
    ) -> int:
        cols = ", ".join(f'"{c}"' for c in columns)
        tmp = f"mnemo_migrate_{table.name}"
        await conn.execute(f'DROP TABLE IF EXISTS "{tmp}"')
        await conn.execute(
            f'CREATE TEMP TABLE "{tmp}" ON COMMIT DELETE ROWS AS SELECT {cols} FROM "{table.name}" '
            "WITH NO DATA"
        )
        overriding = " OVERRIDING SYSTEM VALUE" if target.identity & set(columns) else ""
        select = cols
        if table.name == "sessions" and "parent_session_id" in columns:
            # A parent not copied yet is linked after every session is in (_link_parents).
            select = ", ".join(
                f'"{c}"'
                if c != "parent_session_id"
                else f"CASE WHEN EXISTS (SELECT 1 FROM sessions p WHERE p.id = n.parent_session_id) OR EXISTS "
                f'(SELECT 1 FROM "{tmp}" q WHERE q.id = n.parent_session_id) THEN n.parent_session_id END'
                for c in columns
            )
        insert = (
            f'INSERT INTO "{table.name}" ({cols}){overriding} SELECT {select} FROM "{tmp}" n '
            "ON CONFLICT DO NOTHING"
        )
        width = len(table.order)
        while True:
            rows = await source.run(
                partial(Source.batch, table=table, columns=columns, after=after, limit=self.batch_size)
            )
            if not rows:
                return done
            last = list(rows[-1][:width])
            async with conn.transaction():
                async with conn.cursor() as cur:
                    async with cur.copy(f'COPY "{tmp}" ({cols}) FROM STDIN') as pipe:
                        for row in rows:
                            await pipe.write_row([_text(v) for v in row[width:]])
                    await cur.execute(insert)
                    copy.copied += max(cur.rowcount, 0)
                await conn.execute(
                    f"UPDATE {LEDGER} SET cursors = jsonb_set(cursors, ARRAY[%s], %s::jsonb) WHERE source = %s",
                    (table.name, json.dumps(last), self._source_id),
                )
            after = last
            done += len(rows)
            self.progress(table.name, done, total)

    async def _link_parents(self, source: Source, conn: Connection) -> None:
        pairs = await source.run(
            lambda c: c.execute(
                "SELECT id, parent_session_id FROM sessions WHERE parent_session_id IS NOT NULL"
            ).fetchall()
        )
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i : i + self.batch_size]
            await conn.execute(
                "UPDATE sessions s SET parent_session_id = v.parent"
                " FROM unnest(%s::text[], %s::text[]) AS v(id, parent)"
                " WHERE s.id = v.id AND s.parent_session_id IS DISTINCT FROM v.parent",
                ([p[0] for p in chunk], [p[1] for p in chunk]),
            )

    async def _verify(self, source: Source, conn: Connection, table: SourceTable) -> int:
        """How many of the source's rows (by primary key) the target holds."""
        cols = ", ".join(f'"{c}"' for c in table.key)
        tmp = f"mnemo_verify_{table.name}"
        width = len(table.order)
        async with conn.transaction():
            await conn.execute(f'DROP TABLE IF EXISTS "{tmp}"')
            await conn.execute(
                f'CREATE TEMP TABLE "{tmp}" ON COMMIT DROP AS SELECT {cols} FROM "{table.name}" WITH NO DATA'
            )
            after: list[Any] | None = None
            async with conn.cursor() as cur:
                async with cur.copy(f'COPY "{tmp}" ({cols}) FROM STDIN') as pipe:
                    while rows := await source.run(
                        partial(
                            Source.batch,
                            table=table,
                            columns=table.key,
                            after=after,
                            limit=max(self.batch_size, 10_000),
                        )
                    ):
                        for row in rows:
                            await pipe.write_row([_text(v) for v in row[width:]])
                        after = list(rows[-1][:width])
            match = " AND ".join(f't."{c}" = k."{c}"' for c in table.key)
            present = await _one(
                conn,
                f'SELECT count(*) AS n FROM "{tmp}" k WHERE EXISTS (SELECT 1 FROM "{table.name}" t WHERE {match})',
            )
        return int(present["n"])


async def _advance_identity(conn: Connection, table: str, columns: frozenset[str]) -> None:
    """Move each identity sequence past the copied ids, so the next row a bot inserts gets
    a new one."""
    for col in sorted(columns):
        await conn.execute(
            f'SELECT setval(pg_get_serial_sequence(%s, %s), coalesce((SELECT max("{col}") FROM "{table}"), 0) + 1,'
            " false)",
            (f'"{table}"', col),
        )


# --- curated memory and provider data ----------------------------------------------------


@dataclass
class MemoryCopy:
    """MEMORY.md and every USER.md, entry by entry through the PostgreSQL curated repository
    (the same limits and threat scan as a write by the bot; an entry already there is a
    no-op, so a second run adds nothing)."""

    files: int = 0
    entries: int = 0
    copied: int = 0
    present: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "entries": self.entries,
            "copied": self.copied,
            "present": self.present,
            "refused": [{"file": f, "reason": r} for f, r in self.refused],
        }


def curated_files(memories_dir: Path) -> list[tuple[Path, Any]]:
    """The curated files of a profile: (relative name, None for MEMORY.md or the UserRef)."""
    from mnemo.memory.errors import InvalidIdentifier
    from mnemo.memory.scope import UserRef

    out: list[tuple[Path, Any]] = []
    if (memories_dir / "MEMORY.md").is_file():
        out.append((Path("MEMORY.md"), None))
    for path in sorted((memories_dir / "users").glob("*/*/USER.md")):
        try:
            ref = UserRef(path.parent.parent.name, path.parent.name)
        except InvalidIdentifier:
            continue  # not a name mnemo writes: MemoryFiles would never read it either
        out.append((path.relative_to(memories_dir), ref))
    return out


def copy_memories(memories_dir: Path, url: str, memory_limit: int, user_limit: int) -> MemoryCopy:
    """Blocking (the curated repositories are): run it in a thread."""
    from mnemo.memory.curated import MemoryFiles
    from mnemo.memory.pg.curated import PgCuratedFiles

    files = MemoryFiles(memories_dir, memory_limit, user_limit)
    rows = PgCuratedFiles(url, memory_limit, user_limit)
    result = MemoryCopy()
    try:
        for name, ref in curated_files(memories_dir):
            src = files.shared() if ref is None else files.own(ref)
            dst = rows.shared() if ref is None else rows.own(ref)
            snap = src.load()
            result.files += 1
            if not snap.readable:
                result.refused.append((str(name), "; ".join(snap.warnings)))
                continue
            for entry in snap.entries:
                result.entries += 1
                done = dst.add(entry)
                if not done.success:
                    result.refused.append((str(name), done.message))
                elif done.changed:
                    result.copied += 1
                else:
                    result.present += 1
    finally:
        rows.close()
    return result


def curated_repository_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mnemo.memory.pg.curated") is not None


def provider_data(providers_dir: Path) -> list[str]:
    """The providers that keep data in this profile (``providers/<name>/`` with files other
    than their config)."""
    if not providers_dir.is_dir():
        return []
    return sorted(
        d.name
        for d in providers_dir.iterdir()
        if d.is_dir()
        and any(f.name not in ("config.json", "secrets.json") for f in d.rglob("*") if f.is_file())
    )
