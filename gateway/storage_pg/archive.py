"""PostgreSQL's side of archives (``ArchiveStore`` of ``gateway/archive/ports.py``): the
gateway's tables, the curated memory rows (``curated_memory``) and the holographic
provider's schema, all in ``database.url``'s database.

* **Snapshot**: one transaction, ``REPEATABLE READ, READ ONLY``: every table, the
  curated rows and the facts are read as of one instant while replicas keep writing.
  Rows stream through server-side cursors; sessions in the order they were created
  (``seq``). ``link_codes.usr`` is the archive's ``user`` (a reserved word here).
* **Load**: the schema applied first (this mnemo's steps, and the holographic one when
  the archive has facts); then one transaction empties the archived tables
  (``TRUNCATE … RESTART IDENTITY``), ``COPY``s the rows in load order with their ids,
  moves every identity sequence past them and inserts the curated rows. Nothing is
  visible to a replica before the commit; a failed load rolls back whole. What the
  tables held is first kept under ``aside`` as JSON lines (``folder.dump``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path, PurePosixPath
from typing import Any

import psycopg
from psycopg import sql

from mnemo.gateway.archive.folder import curated_path, dump, user_file
from mnemo.gateway.archive.format import FACT_TABLES, HOLOGRAPHIC, STATE_TABLES, Row, Table, normalize
from mnemo.gateway.archive.ports import Contents, Loaded, Snapshot, Source
from mnemo.gateway.errors import ArchiveRefused
from mnemo.memory.errors import InvalidIdentifier, StoreError
from mnemo.memory.pg.db import redact
from mnemo.memory.scope import UserRef

# The archive's column name -> this database's, where they differ.
RENAMED = {("link_codes", "user"): "usr"}
ITER_SIZE = 2000


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _schema_of(table: Table) -> str:
    return HOLOGRAPHIC if table.group == HOLOGRAPHIC else "public"


def _ident(table: Table) -> sql.Composable:
    if table.group == HOLOGRAPHIC:
        return sql.Identifier(HOLOGRAPHIC, table.name)
    return sql.Identifier(table.name)


def _db_column(table: Table, column: str) -> str:
    return RENAMED.get((table.name, column), column)


def _present(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], set[str]]:
    """(schema, table) -> its columns, for the schemas an archive reads (generated ones left out)."""
    rows = conn.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns"
        " WHERE table_schema IN ('public', %s) AND is_generated = 'NEVER'",
        (HOLOGRAPHIC,),
    ).fetchall()
    out: dict[tuple[str, str], set[str]] = {}
    for schema, table, column in rows:
        out.setdefault((schema, table), set()).add(column)
    return out


@dataclass
class _Snapshot:
    source: Source
    conn: psycopg.Connection[Any]
    present: dict[tuple[str, str], set[str]]

    def tables(self) -> Sequence[Table]:
        held = [t for t in STATE_TABLES if ("public", t.name) in self.present]
        if ("holographic", "facts") in self.present:
            held += [t for t in FACT_TABLES if (HOLOGRAPHIC, t.name) in self.present]
        return held

    def rows(self, table: Table) -> Iterator[Row]:
        have = self.present.get((_schema_of(table), table.name), set())
        cols = [c for c in table.columns if _db_column(table, c.name) in have]
        if not cols:
            return
        order = ["seq"] if table.name == "sessions" and "seq" in have else list(table.key)
        query = sql.SQL("SELECT {cols} FROM {table} ORDER BY {order}").format(
            cols=sql.SQL(", ").join(sql.Identifier(_db_column(table, c.name)) for c in cols),
            table=_ident(table),
            order=sql.SQL(", ").join(sql.Identifier(k) for k in order),
        )
        with self.conn.cursor(name=f"mnemo_archive_{table.group}_{table.name}") as cur:
            cur.itersize = ITER_SIZE
            cur.execute(query)
            for values in cur:
                yield {c.name: normalize(c.kind, v) for c, v in zip(cols, values, strict=True)}

    def curated(self) -> Iterator[tuple[PurePosixPath, str]]:
        if ("public", "curated_memory") not in self.present:
            return
        rows = self.conn.execute("SELECT target, owner, content FROM curated_memory ORDER BY target, owner")
        for target, owner, content in rows.fetchall():
            if target == "memory":
                yield PurePosixPath("MEMORY.md"), content
                continue
            try:
                yield user_file(UserRef.parse(owner)), content
            except InvalidIdentifier:
                continue  # not an owner mnemo writes: it never reads it either


class PgArchive:
    """The archive store of one PostgreSQL database (``database.url``); ``home`` is the
    profile's folder, whose ``state.db``, ``facts.db`` and ``memories/`` are left from
    SQLite (``mnemo migrate``) and never archived as files."""

    name = "postgresql"

    def __init__(self, url: str, home: Path, *, connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.where = redact(url)
        self.timeout = max(1, int(connect_timeout_s))
        self.owned: tuple[Path, ...] = (
            home / "state.db",
            home / "providers" / "holographic" / "facts.db",
            home / "memories",
        )

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=autocommit, connect_timeout=self.timeout)
        except psycopg.Error as e:
            raise ArchiveRefused(f"cannot connect to PostgreSQL at {self.where}: {_first_line(e)}") from None

    # --- reads -----------------------------------------------------------------------
    def contents(self) -> Contents:
        conn = self._connect(autocommit=True)
        try:
            present = _present(conn)
            rows: dict[str, int] = {}
            for t in (*STATE_TABLES, *FACT_TABLES):
                if (_schema_of(t), t.name) in present:
                    query = sql.SQL("SELECT count(*) FROM {}").format(_ident(t))
                    rows[t.label] = int(_scalar(conn.execute(query).fetchone()))
            curated = 0
            if ("public", "curated_memory") in present:
                curated = int(_scalar(conn.execute("SELECT count(*) FROM curated_memory").fetchone()))
        except psycopg.Error as e:
            raise ArchiveRefused(f"cannot read {self.where}: {_first_line(e)}") from None
        finally:
            conn.close()
        return Contents(rows, curated)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        conn = self._connect(autocommit=False)
        try:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            present = _present(conn)
            schema = "no mnemo schema"
            if ("public", "schema_migrations") in present:
                row = conn.execute(
                    "SELECT version, name FROM schema_migrations ORDER BY version DESC LIMIT 1"
                ).fetchone()
                if row is not None:
                    schema = f"{row[0]} steps, the last {row[1]}"
            yield _Snapshot(Source(self.name, schema), conn, present)
        except psycopg.Error as e:
            raise ArchiveRefused(f"cannot read {self.where}: {_first_line(e)}") from None
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
            conn.close()

    # --- load ------------------------------------------------------------------------
    def load(self, source: Snapshot, *, aside: Path) -> Loaded:
        tables = list(source.tables())
        self._apply_schema(facts=any(t.group == HOLOGRAPHIC for t in tables))
        if self.contents().holds_data:
            with self.snapshot() as before:
                dump(before, aside / "postgresql")
        conn = self._connect(autocommit=False)
        try:
            present = _present(conn)
            emptied = [t for t in (*STATE_TABLES, *FACT_TABLES) if (_schema_of(t), t.name) in present]
            conn.execute(
                sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                    sql.SQL(", ").join([*(_ident(t) for t in emptied), sql.Identifier("curated_memory")])
                )
            )
            counts = {t.label: self._copy(conn, t, source.rows(t), present) for t in tables}
            for t in tables:
                _advance_identities(conn, t)
            curated = 0
            for rel, text in source.curated():
                owner = curated_path(rel)
                conn.execute(
                    "INSERT INTO curated_memory (target, owner, content, version) VALUES (%s, %s, %s, 1)",
                    ("memory" if owner is None else "user", "" if owner is None else str(owner), _text(text)),
                )
                curated += 1
            conn.commit()
        except psycopg.Error as e:
            conn.rollback()
            raise ArchiveRefused(
                f"the archive's rows do not load into {self.where}: {_first_line(e)}"
            ) from None
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()
        return Loaded(counts, curated)

    def _copy(
        self,
        conn: psycopg.Connection[Any],
        table: Table,
        rows: Iterator[Row],
        present: dict[tuple[str, str], set[str]],
    ) -> int:
        """``COPY`` the rows in, ids included (COPY writes identity columns as given).
        Rows naming different columns (an archive of an older mnemo has fewer) go in
        runs of the same columns."""
        have = present.get((_schema_of(table), table.name), set())
        n = 0
        with conn.cursor() as cursor:
            for keys, run in groupby(rows, key=lambda r: tuple(k for k in r if _db_column(table, k) in have)):
                statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    _ident(table), sql.SQL(", ").join(sql.Identifier(_db_column(table, k)) for k in keys)
                )
                with cursor.copy(statement) as copy:
                    for row in run:
                        copy.write_row([_text(row[k]) for k in keys])
                        n += 1
        return n

    def _apply_schema(self, *, facts: bool) -> None:
        """This mnemo's schema (``PG_MIGRATIONS``, through the async ``PgDatabase`` in a
        thread of its own) and, for an archive with facts, the holographic schema."""
        from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
        from mnemo.memory.pg.db import PgDatabase

        async def migrate() -> None:
            db = PgDatabase(self.url, migrations=PG_MIGRATIONS, max_size=1, connect_timeout_s=self.timeout)
            await db.open()
            await db.close()

        try:
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(asyncio.run, migrate()).result()
            if facts:
                from mnemo.providers.holographic.pg_store import connect

                connect(self.url, self.timeout).close()
        except StoreError as e:
            raise ArchiveRefused(str(e)) from None


def _scalar(row: Any) -> Any:
    if row is None:
        raise ArchiveRefused("PostgreSQL returned no row for a count")
    return row[0]


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: stored as U+FFFD, as the stores do."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _advance_identities(conn: psycopg.Connection[Any], table: Table) -> None:
    """Move each identity sequence of ``table`` past the loaded ids, so the next row a
    bot inserts gets a new one."""
    schema = _schema_of(table)
    columns = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
        " AND is_identity = 'YES'",
        (schema, table.name),
    ).fetchall()
    qualified = f'"{schema}"."{table.name}"'
    for (column,) in columns:
        conn.execute(
            sql.SQL(
                "SELECT setval(pg_get_serial_sequence(%s, %s),"
                " coalesce((SELECT max({col}) FROM {table}), 0) + 1, false)"
            ).format(col=sql.Identifier(column), table=_ident(table)),
            (qualified, column),
        )
