"""The storage contract: every repository port, run against every backend.

A test here talks to a repository through its Protocol only (no SQL, no backend
detail), so adding a backend is one more ``params`` entry and one more branch in
``_open``: the whole suite then runs against it too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.gateway.cron.store import CronRepository, CronStore
from mnemo.gateway.delivery.inbox import Inbox, InboxRepository
from mnemo.gateway.delivery.outbox import Outbox, OutboxRepository
from mnemo.gateway.inbound.access import PairingRepository, PairingStore
from mnemo.gateway.jobs.store import JobStorage, JobStore
from mnemo.gateway.storage import state_database
from mnemo.memory.ports import SearchRepository, SessionRepository
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import SessionStore
from tests.support.pgcluster import Cluster

BACKENDS = ["sqlite", "postgresql"]


@dataclass
class Clock:
    """One hand-advanced time for every repository of a backend."""

    now: datetime = field(default_factory=lambda: datetime(2025, 3, 1, 12, 0, tzinfo=UTC))

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def dt(self) -> datetime:
        return self.now

    def ts(self) -> float:
        return self.now.timestamp()


@dataclass(frozen=True)
class Backend:
    name: str
    clock: Clock
    inbox: InboxRepository
    outbox: OutboxRepository
    jobs: JobStorage
    cron: CronRepository
    pairings: PairingRepository
    sessions: SessionRepository
    search: SearchRepository


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    clock = Clock()
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        outbox = Outbox(db, clock=clock.ts)
        yield Backend(
            name="sqlite",
            clock=clock,
            inbox=Inbox(db, clock=clock.dt),
            outbox=outbox,
            jobs=JobStore(db),
            cron=CronStore(db, outbox),
            pairings=PairingStore(db, clock=clock.ts),
            sessions=SessionStore(db, clock=clock.dt),
            search=SessionSearch(db),
        )
        await db.close()
    elif request.param == "postgresql":
        pg, close = await _open_postgresql(request.getfixturevalue("pg_cluster"), clock)
        yield pg
        await close()
    else:  # pragma: no cover - a param without a branch is a mistake in this file
        raise AssertionError(f"no backend {request.param!r}")


async def _open_postgresql(cluster: Cluster, clock: Clock) -> tuple[Backend, Callable[[], Awaitable[None]]]:
    """The PostgreSQL repositories on a fresh database of the session's cluster."""
    from mnemo.gateway.storage_pg.cron import PgCronStore
    from mnemo.gateway.storage_pg.inbox import PgInbox
    from mnemo.gateway.storage_pg.jobs import PgJobStore
    from mnemo.gateway.storage_pg.outbox import PgOutbox
    from mnemo.gateway.storage_pg.pairings import PgPairingStore
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.search import PgSessionSearch
    from mnemo.memory.pg.sessions import PgSessionStore

    db = PgDatabase(cluster.fresh_database(), migrations=PG_MIGRATIONS, max_size=4)
    await db.open()
    outbox = PgOutbox(db, clock=clock.ts)
    backend = Backend(
        name="postgresql",
        clock=clock,
        inbox=PgInbox(db, clock=clock.dt),
        outbox=outbox,
        jobs=PgJobStore(db),
        cron=PgCronStore(db, outbox),
        pairings=PgPairingStore(db, clock=clock.ts),
        sessions=PgSessionStore(db, clock=clock.dt),
        search=PgSessionSearch(db),
    )
    return backend, db.close
