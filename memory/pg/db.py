"""One PostgreSQL database for everything durable: an async psycopg 3 connection pool,
the transaction helpers every repository uses, and the versioned migration runner.

The rules, and why:

* **Async all the way** (``psycopg.AsyncConnection`` from ``psycopg_pool.AsyncConnectionPool``):
  a slow statement waits on the socket, never on a thread, so it stalls no other chat.
* **``write(fn)`` runs ``await fn(conn)`` in one transaction** (READ COMMITTED) and
  retries the whole function on a serialization failure or a deadlock (jittered, bounded,
  then ``StoreBusy``), so ``fn`` must only touch ``conn``. ``read(fn)`` runs it in one
  REPEATABLE READ, read-only transaction: every statement sees the same snapshot, like a
  SQLite read.
* **Migrations are versioned like ``state.db``'s**: a ``schema_migrations`` table holds
  one row per applied step (``version``, ``name``); the list is append-only and carries
  the same names as SQLite's where the tables correspond. Each step runs in its own
  transaction under a transaction-scoped advisory lock, so replicas starting together
  apply it once. A database whose highest version is beyond the list was written by a
  newer mnemo: ``SchemaTooNew``.
* **Start-up errors are one line**: ``DatabaseUnreachable`` when the pool cannot get a
  first connection within ``connect_timeout_s``.

Usage::

    db = PgDatabase("postgresql://mnemo@db/mnemo", migrations=PG_MIGRATIONS)
    await db.open()
    new_id = await db.write(lambda c: insert(c, ...))   # async def insert(c, ...)
    await db.close()
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mnemo.memory.errors import SchemaTooNew, StoreBusy, StoreError

T = TypeVar("T")
Connection: TypeAlias = psycopg.AsyncConnection[dict[str, Any]]

# pg_advisory_xact_lock key of the migration runner ("mnemo" in ASCII).
MIGRATION_LOCK = 0x6D6E656D6F
_RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


MIN_SERVER_VERSION = 150000  # PostgreSQL 15


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class DatabaseUnreachable(StoreError):
    """The PostgreSQL server did not accept a connection at start-up."""


@dataclass(frozen=True, slots=True)
class PgMigration:
    """One step of the PostgreSQL schema: plain SQL (several statements allowed)."""

    name: str
    sql: str


def redact(url: str) -> str:
    """``url`` without its password, for error messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable database.url>"
    host = info.get("host") or "localhost"
    return f"postgresql://{info.get('user', '')}@{host}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PgDatabase:
    """The shared PostgreSQL handle. Create one per process; ``open`` before use."""

    def __init__(
        self,
        url: str,
        *,
        migrations: Sequence[PgMigration],
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 10.0,
        max_retries: int = 20,
        lock_pool_size: int = 32,
    ) -> None:
        self.url = url
        self._migrations = tuple(migrations)
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout_s = connect_timeout_s
        self._max_retries = max_retries
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._lock_pool: AsyncConnectionPool[Connection] | None = None
        self._lock_pool_size = lock_pool_size
        # Lockers queue here for one of the lock pool's connections, however long the
        # queue: the pool's own queue gives up after 30 s, which would fail a turn only
        # because more chats than connections were busy.
        self._lock_slots: asyncio.Semaphore | None = None
        self.schema_version = 0
        self.retries = 0  # serialization/deadlock retries so far (benchmarks, tests)
        self.round_trips = 0  # transactions run, reads and writes (benchmarks, tests)

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        """Connect the pool and apply pending migrations. Idempotent."""
        if self._pool is not None:
            return
        await self._probe()
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self.url,
            min_size=self._min_size,
            max_size=self._max_size,
            open=False,
            kwargs={"autocommit": True, "row_factory": dict_row},
            timeout=self._connect_timeout_s,
            name="mnemo",
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout_s)
        except (PoolTimeout, psycopg.OperationalError) as e:
            await pool.close()
            raise DatabaseUnreachable(
                f"cannot connect to PostgreSQL at {redact(self.url)} within {self._connect_timeout_s:g} s: "
                "is the server running and is database.url right?"
            ) from e
        self._pool = pool
        try:
            self.schema_version = await migrate(pool, self._migrations, where=redact(self.url))
        except BaseException:
            self._pool = None
            await pool.close()
            raise

    async def _probe(self) -> None:
        """One direct connection first: the pool would only say "timed out", libpq says
        why (refused, no such database, password rejected), and the server's version."""
        where = redact(self.url)
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(self.url, autocommit=True), self._connect_timeout_s
            )
        except psycopg.ProgrammingError as e:
            raise StoreError(f"database.url is not a valid PostgreSQL URL: {_first_line(e)}") from e
        except (psycopg.OperationalError, TimeoutError, OSError) as e:
            raise DatabaseUnreachable(f"cannot connect to PostgreSQL at {where}: {_first_line(e)}") from e
        try:
            version = conn.info.server_version
        finally:
            await conn.close()
        if version < MIN_SERVER_VERSION:
            raise StoreError(
                f"{where} runs PostgreSQL {version // 10000}; mnemo needs {MIN_SERVER_VERSION // 10000} or later"
            )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        locks, self._lock_pool = self._lock_pool, None
        for p in (locks, pool):
            if p is not None:
                await p.close()

    @asynccontextmanager
    async def advisory_lock(self, key: str) -> AsyncIterator[None]:
        """Hold PostgreSQL's session-level advisory lock on ``key`` (any string) across
        every process on this database. The lock lives on a connection of a separate
        pool, held for the duration: if this process dies, the server drops the
        connection and with it the lock, so another replica takes over at once."""
        pool, slots = await self._locks()
        async with slots, pool.connection() as conn:
            await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            try:
                yield
            finally:
                try:
                    await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
                except psycopg.OperationalError:
                    pass  # the connection is gone, and the server dropped the lock with it

    async def _locks(self) -> tuple[AsyncConnectionPool[Connection], asyncio.Semaphore]:
        self._require()
        if self._lock_pool is None or self._lock_slots is None:
            self._lock_slots = asyncio.Semaphore(self._lock_pool_size)
            # Created on first use (min_size=0: no connection is held until a turn needs
            # one), and separate, so turns waiting for a lock never starve the queries.
            self._lock_pool = AsyncConnectionPool(
                self.url,
                min_size=0,
                max_size=self._lock_pool_size,
                open=False,
                kwargs={"autocommit": True, "row_factory": dict_row},
                name="mnemo-locks",
            )
        await self._lock_pool.open()  # a no-op once open
        return self._lock_pool, self._lock_slots

    def _require(self) -> AsyncConnectionPool[Connection]:
        if self._pool is None:
            raise StoreError(f"{redact(self.url)}: database is not open")
        return self._pool

    async def write(self, fn: Callable[[Connection], Awaitable[T]]) -> T:
        """``await fn(conn)`` in one transaction, retried on serialization failures."""
        pool = self._require()
        self.round_trips += 1
        for attempt in range(self._max_retries + 1):
            try:
                async with pool.connection() as conn, conn.transaction():
                    return await fn(conn)
            except _RETRYABLE as e:
                if attempt == self._max_retries:
                    raise StoreBusy(
                        f"{redact(self.url)}: still conflicting after {attempt + 1} attempts"
                    ) from e
                self.retries += 1
                await asyncio.sleep(random.uniform(0.005, 0.050))
        raise AssertionError("unreachable")

    async def read(self, fn: Callable[[Connection], Awaitable[T]]) -> T:
        """``await fn(conn)`` in one read-only snapshot."""
        pool = self._require()
        self.round_trips += 1
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return await fn(conn)

    async def vacuum(self, tables: Sequence[str]) -> None:
        """``VACUUM`` each of ``tables``: dead rows' space is reclaimed for reuse and their index entries removed
        now, not at autovacuum's leisure. Outside any transaction, as VACUUM must be."""
        pool = self._require()
        async with pool.connection() as conn:  # the pool's connections are autocommit
            for table in tables:
                await conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(table)))


async def migrate(
    pool: AsyncConnectionPool[Connection], migrations: Sequence[PgMigration], *, where: str
) -> int:
    """Apply the pending steps in order; return the resulting version."""
    async with pool.connection() as conn:
        while True:
            # One step per transaction, under a lock every replica takes: two replicas
            # starting together apply each step once (the second sees it applied).
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                    " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                rows = await (
                    await conn.execute("SELECT version, name FROM schema_migrations ORDER BY version")
                ).fetchall()
                _check(rows, migrations, where)
                if len(rows) >= len(migrations):
                    return len(rows)
                step = migrations[len(rows)]
                await conn.execute(step.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations(version, name) VALUES (%s, %s)", (len(rows) + 1, step.name)
                )


def _check(rows: Sequence[dict[str, Any]], migrations: Sequence[PgMigration], where: str) -> None:
    if rows and rows[-1]["version"] > len(migrations):
        raise SchemaTooNew(
            f"{where} has schema version {rows[-1]['version']} ({rows[-1]['name']}), but this mnemo only knows "
            f"versions up to {len(migrations)}: it was written by a newer mnemo. Upgrade mnemo."
        )
    for r in rows:
        expected = migrations[r["version"] - 1].name
        if r["name"] != expected:
            raise StoreError(
                f"{where}: schema version {r['version']} is {r['name']!r} in the database but {expected!r} in "
                "this mnemo's migration list; the list was reordered"
            )
