"""Replicas on one PostgreSQL database: who is alive, heartbeats, and leader locks.

Each ``mnemo run`` on PostgreSQL is one **replica** (``database.replica_id``, default
``host:pid``) and holds one dedicated connection, the *replica connection*, for as long
as it runs. On it, at start, it takes a session-level advisory lock on its own id:

* **alive** means exactly "that lock is held" (``mnemo_replica_alive(id)``, a SQL function
  over ``pg_locks``). A replica killed with ``kill -9`` closes its socket, the server ends
  its backend and drops the lock at once, so the other replicas know it is dead without
  waiting for a timeout; a host that vanishes is found by TCP keepalives (about 10 s,
  see ``KEEPALIVES``). A second process started with an id in use is refused.
* **leader locks** (``Leadership.acquire(name)``, ``gateway/ports.py``) are advisory
  locks taken with ``pg_try_advisory_lock`` on the same connection: they go away in the
  same instant as the liveness lock, so whoever takes over a dead leader's role finds the
  old leader dead already and can adopt its unfinished work first. A leader whose replica
  connection breaks loses every lease (``Lease.lost``) and stops leading.
* **heartbeats**: a row in ``replicas`` (started_at, last_seen, adapters, roles, version)
  written every ``interval_s``: what ``mnemo status`` lists. A row whose ``last_seen`` is
  older than ``STALE_AFTER_S`` is shown as dead; rows gone longer than ``FORGET_AFTER_S``
  are deleted by the next beat of any replica.

Times are the server's clock (``now()``), so replicas on hosts with skewed clocks agree.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from mnemo.gateway.logs import get_logger
from mnemo.memory.errors import StoreError
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration, redact

log = get_logger(__name__)

HEARTBEAT_S = 2.0
STALE_AFTER_S = 10.0  # mnemo status: a heartbeat older than this is a dead replica
FORGET_AFTER_S = 86_400.0
LEADER_RETRY_S = 1.0  # how often a follower tries a free leader lock
# libpq keepalives on the replica connection: a vanished host's locks free within ~11 s.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}

REPLICAS = PgMigration(
    "pg_replicas",
    """
CREATE TABLE replicas (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    started_at double precision NOT NULL,
    last_seen double precision NOT NULL,
    stopped_at double precision,
    adapters text NOT NULL DEFAULT '{}',
    roles text NOT NULL DEFAULT '[]'
);
ALTER TABLE inbox ADD COLUMN owner text;
CREATE FUNCTION mnemo_replica_alive(rid text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('mnemo-replica:' || rid, 0)
    )
$$;
""",
)


def default_replica_id(n: int = 0) -> str:
    base = f"{socket.gethostname()}:{os.getpid()}"
    return base if n == 0 else f"{base}:{n}"


def mnemo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mnemo")
    except PackageNotFoundError:
        return "unknown"


class ReplicaIdInUse(StoreError):
    """Another live process holds this ``database.replica_id``."""


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    id: str
    host: str
    pid: int
    version: str
    started_at: float
    last_seen: float
    stopped_at: float | None
    adapters: dict[str, bool]
    roles: list[str]
    alive: bool  # its liveness lock is held right now
    age_s: float  # seconds since last_seen, by the server's clock

    def as_json(self) -> dict[str, Any]:
        return {
            "replica_id": self.id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_at": self.started_at,
            "last_seen": self.last_seen,
            "stopped_at": self.stopped_at,
            "adapters": self.adapters,
            "roles": self.roles,
            "alive": self.alive,
            "last_seen_s_ago": round(self.age_s, 1),
        }


class Lease:
    """Leadership of one name, held on the replica connection until released or lost."""

    def __init__(self, replica: PgReplica, name: str) -> None:
        self.name = name
        self._replica = replica
        self._lost = asyncio.Event()

    @property
    def held(self) -> bool:
        return not self._lost.is_set()

    async def lost(self) -> None:
        """Returns when the lease is gone (the replica connection broke, or released)."""
        await self._lost.wait()

    def _lose(self) -> None:
        self._lost.set()

    async def release(self) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        await self._replica._release(self.name)


def _key(kind: str, name: str) -> str:
    return f"mnemo-{kind}:{name}"


class PgReplica:
    """This process as a replica: the replica connection, its heartbeat row and leases.
    ``Leadership`` (``gateway/ports.py``) on PostgreSQL."""

    def __init__(self, db: PgDatabase, replica_id: str | None, *, version: str | None = None) -> None:
        self.db = db
        self.configured_id = replica_id
        self.id = replica_id or default_replica_id()
        self.version = version or mnemo_version()
        self._conn: psycopg.AsyncConnection[dict[str, Any]] | None = None
        self._leases: dict[str, Lease] = {}
        self._lock = asyncio.Lock()  # one statement at a time on the replica connection

    @property
    def roles(self) -> list[str]:
        return sorted(f"leader:{name}" for name, lease in self._leases.items() if lease.held)

    async def start(self) -> None:
        """Connect, take the liveness lock on this replica's id, write the first beat.
        Raises ``ReplicaIdInUse`` when a configured id is held by a live process."""
        conn = await self._connect()
        n = 0
        while not await _try_lock(conn, _key("replica", self.id)):
            if self.configured_id is not None:
                await conn.close()
                raise ReplicaIdInUse(
                    f"database.replica_id {self.id!r} is in use by a running replica on {redact(self.db.url)}; "
                    "give each replica its own id (MNEMO_REPLICA_ID) or leave it unset"
                )
            n += 1  # several apps in one process (tests): host:pid:n
            self.id = default_replica_id(n)
        self._conn = conn
        await self.db.write(
            lambda c: c.execute(
                "INSERT INTO replicas (id, host, pid, version, started_at, last_seen)"
                " VALUES (%(id)s, %(host)s, %(pid)s, %(v)s, extract(epoch FROM now()), extract(epoch FROM now()))"
                " ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,"
                " started_at = EXCLUDED.started_at, last_seen = EXCLUDED.last_seen, stopped_at = NULL,"
                " adapters = '{}', roles = '[]'",
                {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "v": self.version},
            )
        )
        log.info("replica_started", replica=self.id)

    async def _connect(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        try:
            return await psycopg.AsyncConnection.connect(
                self.db.url, autocommit=True, row_factory=dict_row, **KEEPALIVES
            )
        except psycopg.OperationalError as e:
            raise StoreError(f"cannot open the replica connection to {redact(self.db.url)}: {e}") from e

    async def beat(self, adapters: Mapping[str, bool]) -> None:
        """One heartbeat: check the replica connection (re-open it, losing every lease,
        when it broke), then write last_seen, adapters and roles."""
        await self._check_connection()
        roles = self.roles
        await self.db.write(lambda c: _beat(c, self.id, dict(adapters), roles))

    async def _check_connection(self) -> None:
        async with self._lock:
            conn = self._conn
            try:
                if conn is None:
                    raise psycopg.OperationalError("not connected")
                await conn.execute("SELECT 1")
                return
            except psycopg.Error as e:
                log.warning(
                    "replica_connection_lost", replica=self.id, error=str(e).splitlines()[0] if str(e) else ""
                )
            for lease in self._leases.values():
                lease._lose()
            self._leases.clear()
            if conn is not None:
                await conn.close()
            self._conn = None
            conn = await self._connect()
            if not await _try_lock(conn, _key("replica", self.id)):
                await conn.close()
                raise ReplicaIdInUse(
                    f"replica id {self.id!r} was taken over while this replica's connection was down"
                )
            self._conn = conn

    async def acquire(self, name: str) -> Lease:
        """Wait until this replica leads ``name``; the lease ends when ``lost`` returns."""
        while True:
            lease = await self.try_acquire(name)
            if lease is not None:
                return lease
            await asyncio.sleep(LEADER_RETRY_S)

    async def try_acquire(self, name: str) -> Lease | None:
        async with self._lock:
            current = self._leases.get(name)
            if current is not None and current.held:
                return current
            if self._conn is None:
                return None
            try:
                got = await _try_lock(self._conn, _key("leader", name))
            except psycopg.Error as e:
                log.warning("leader_lock_failed", name=name, error=str(e).splitlines()[0] if str(e) else "")
                return None
            if not got:
                return None
            lease = self._leases[name] = Lease(self, name)
        log.info("leader_acquired", name=name, replica=self.id)
        return lease

    async def _release(self, name: str) -> None:
        async with self._lock:
            self._leases.pop(name, None)
            if self._conn is None:
                return
            try:
                await self._conn.execute(
                    "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (_key("leader", name),)
                )
            except psycopg.Error:
                pass  # the connection is gone: the server dropped the lock with it
        log.info("leader_released", name=name, replica=self.id)

    async def stop(self) -> None:
        """Give up every lease, mark the row stopped, close the replica connection."""
        for lease in list(self._leases.values()):
            await lease.release()
        conn, self._conn = self._conn, None
        try:
            await self.db.write(
                lambda c: c.execute(
                    "UPDATE replicas SET stopped_at = extract(epoch FROM now()), roles = '[]' WHERE id = %s",
                    (self.id,),
                )
            )
        finally:
            if conn is not None:
                await conn.close()


async def _try_lock(conn: psycopg.AsyncConnection[dict[str, Any]], key: str) -> bool:
    r = await (
        await conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS ok", (key,))
    ).fetchone()
    return bool(r and r["ok"])


async def _beat(c: Connection, replica_id: str, adapters: dict[str, bool], roles: list[str]) -> None:
    await c.execute(
        "UPDATE replicas SET last_seen = extract(epoch FROM now()), adapters = %s, roles = %s WHERE id = %s",
        (json.dumps(adapters), json.dumps(roles), replica_id),
    )
    await c.execute(
        "DELETE FROM replicas WHERE last_seen < extract(epoch FROM now()) - %s AND NOT mnemo_replica_alive(id)",
        (FORGET_AFTER_S,),
    )


async def list_replicas(db: PgDatabase) -> list[ReplicaRow]:
    """Every replica row, newest first, with whether it is alive right now."""

    async def q(c: Connection) -> list[ReplicaRow]:
        cur = await c.execute(
            "SELECT *, mnemo_replica_alive(id) AS alive, extract(epoch FROM now()) - last_seen AS age"
            " FROM replicas ORDER BY started_at DESC, id"
        )
        return [_replica(r) for r in await cur.fetchall()]

    return await db.read(q)


def _replica(r: Mapping[str, Any]) -> ReplicaRow:
    return ReplicaRow(
        id=r["id"],
        host=r["host"],
        pid=int(r["pid"]),
        version=r["version"],
        started_at=float(r["started_at"]),
        last_seen=float(r["last_seen"]),
        stopped_at=None if r["stopped_at"] is None else float(r["stopped_at"]),
        adapters=json.loads(r["adapters"]),
        roles=json.loads(r["roles"]),
        alive=bool(r["alive"]),
        age_s=float(r["age"]),
    )


def is_live(row: ReplicaRow) -> bool:
    """Live for ``mnemo status``: its liveness lock is held and it beat recently."""
    return row.alive and row.stopped_at is None and row.age_s <= STALE_AFTER_S


def dead_owner(column: str) -> str:
    """SQL: ``column`` names a replica that is not alive (or nobody)."""
    return f"({column} IS NULL OR NOT mnemo_replica_alive({column}))"
