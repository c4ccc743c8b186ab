"""``state.db`` as a whole: the one ordered migration list, and how a process opens it.

Each sub-system owns its tables and keeps their migrations beside its code; this is
the one place that knows their order (``memory/`` must not import the gateway, so it
cannot assemble the list itself). ``user_version`` counts the steps applied, so the
order below is part of every existing database: append, never insert, reorder or
rename (``tests/memory/test_db_migrations.py`` pins the historical names)::

    0001_sessions_and_messages   memory/migrations.py
    0002_inbox                   gateway/delivery/schema.py
    0003_cjk_view                memory/migrations.py
    0004_outbox                  gateway/delivery/schema.py
    0005_pairings                gateway/inbound/schema.py
    0006_jobs                    gateway/jobs/schema.py
    0007_cron_jobs               gateway/cron/schema.py
    0008_contextual_index        memory/migrations.py
    0009_message_vectors         memory/migrations.py
    0010_budgets                 gateway/budgets/schema.py
    0011_identity_links          gateway/people/schema.py
    0012_streams                 gateway/delivery/schema.py
    0013_jobs_dedupe_key         gateway/jobs/schema.py

Every process that opens ``state.db`` (the gateway, each CLI command, a benchmark)
goes through ``state_database``.

``Transaction`` is the handle a backend's ``write`` gives the function it runs: for
SQLite the writer connection inside ``BEGIN IMMEDIATE``. A repository that must change
its rows in another repository's transaction (cron finishing a run together with its
outbox delivery) receives it from that repository's ``write`` and passes it to a
``…_within(tx, …)`` method; a PostgreSQL backend hands its own connection the same way.

``open_backend(settings)`` is how the application opens its storage: ``database.url``
unset gives the repositories above on ``state.db``; ``postgresql://…`` gives their
PostgreSQL twins (``gateway/storage_pg/``, ``memory/pg/``; list ``PG_MIGRATIONS``, the
same step names where the tables correspond) plus a lock shared by every replica.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from mnemo.gateway.budgets.schema import BUDGETS
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.schema import CRON_JOBS
from mnemo.gateway.delivery.schema import INBOX, OUTBOX, STREAMS
from mnemo.gateway.errors import StartupError
from mnemo.gateway.inbound.schema import PAIRINGS
from mnemo.gateway.jobs.schema import JOBS, JOBS_DEDUPE_KEY
from mnemo.gateway.people.schema import IDENTITY_LINKS
from mnemo.memory.db import Database
from mnemo.memory.migrations import (
    CJK_VIEW,
    CONTEXTUAL_INDEX,
    MESSAGE_VECTORS,
    SESSIONS_AND_MESSAGES,
    Migration,
)

Transaction: TypeAlias = sqlite3.Connection

STATE_MIGRATIONS: tuple[Migration, ...] = (
    SESSIONS_AND_MESSAGES,
    INBOX,
    CJK_VIEW,
    OUTBOX,
    PAIRINGS,
    JOBS,
    CRON_JOBS,
    CONTEXTUAL_INDEX,
    MESSAGE_VECTORS,
    BUDGETS,
    IDENTITY_LINKS,
    STREAMS,
    JOBS_DEDUPE_KEY,
)


def state_database(path: Path | str, **options: Any) -> Database:
    """A (not yet opened) ``Database`` for ``state.db`` with the whole migration list;
    ``options`` are ``Database``'s tuning keywords (readers, busy timeout, …)."""
    return Database(path, migrations=STATE_MIGRATIONS, **options)


@dataclass
class StorageBackend:
    """Every repository of one backend, on one open database: what ``open_app`` builds
    the agent and the pipeline on, so neither knows which backend it runs on.

    ``name`` is ``"sqlite"`` (``db`` a ``Database``) or ``"postgresql"`` (``db`` a
    ``PgDatabase``); ``close`` closes the database."""

    name: str
    db: Any
    sessions: Any  # SessionStore | PgSessionStore (SessionRepository + usage/rollover)
    # SessionSearch | PgSessionSearch (SearchRepository), built on first use of
    # ``search``: the SQLite retrievers import numpy, which ``mnemo pair`` never needs.
    make_search: Callable[[], Any]
    inbox: Any  # InboxRepository
    outbox: Any  # OutboxRepository
    jobs: Any  # JobStorage
    cron: Any  # CronRepository
    pairings: Any  # PairingRepository
    # A lock on a key held across every process of the database (PostgreSQL's advisory
    # locks); None when one process owns the store (SQLite).
    shared_lock: Callable[[str], AbstractAsyncContextManager[None]] | None = None
    # StreamLedger (gateway/delivery/streams.py): the messages showing replies while
    # they are generated; None: this backend does not stream replies.
    streams: Any = None
    # The curated memory (CuratedRepository, ``memory/ports.py``) for a map of linked
    # identities: ``MemoryFiles`` on SQLite, ``PgCuratedFiles`` (rows) on PostgreSQL.
    curated: Callable[[Any], Any] | None = None
    # Called by ``close`` before the database closes (the curated rows' own pool).
    closers: list[Callable[[], Any]] = field(default_factory=list)
    # This process among replicas (``PgReplica``, ``storage_pg/heartbeats.py``: liveness,
    # heartbeats, leader locks); None on SQLite, where one process owns the store.
    replica: Any = None
    # The per-user rate limit's window shared by every replica (``PgRateLimits``,
    # ``storage_pg/rate_limits.py``); None on SQLite, where it lives in the process.
    rate_limits: Any = None
    _search: Any = field(default=None, init=False, repr=False)

    @property
    def search(self) -> Any:
        if self._search is None:
            self._search = self.make_search()
        return self._search

    async def close(self) -> None:
        for close in self.closers:
            await asyncio.to_thread(close)
        try:
            if self.replica is not None:
                await self.replica.stop()
        finally:
            await self.db.close()


async def open_backend(settings: Settings, *, serve: bool = False) -> StorageBackend:
    """Open the configured backend: ``database.url`` unset = ``$MNEMO_HOME/state.db``,
    ``postgresql://…`` = that server. Raises ``StartupError`` (one line, exit 2) when the
    ``postgres`` extra is missing, the server is unreachable or its schema is newer than
    this mnemo. ``serve``: this process serves the bot (``open_app``); on PostgreSQL it
    joins the replicas (``StorageBackend.replica``), a CLI command does not."""
    if not settings.database.is_postgresql:
        from mnemo.gateway.cron.store import CronStore
        from mnemo.gateway.delivery.inbox import Inbox
        from mnemo.gateway.delivery.outbox import Outbox
        from mnemo.gateway.delivery.streams import StreamRecords
        from mnemo.gateway.inbound.access import PairingStore
        from mnemo.gateway.jobs.store import JobStore
        from mnemo.memory.sessions import SessionStore

        def sqlite_search() -> Any:
            from mnemo.memory.search import SessionSearch
            from mnemo.memory.semantic import configured_retriever

            return SessionSearch(db, retriever=configured_retriever(settings.search.semantic))

        def memory_files(identities: Any = None) -> Any:
            from mnemo.memory.curated import MemoryFiles

            mem = settings.memory
            return MemoryFiles(
                settings.memories_dir, mem.memory_char_limit, mem.user_char_limit, identities=identities
            )

        db = state_database(settings.state_db)
        await db.open()
        outbox = Outbox(db)
        return StorageBackend(
            "sqlite",
            db,
            SessionStore(db),
            sqlite_search,
            Inbox(db),
            outbox,
            JobStore(db),
            CronStore(db, outbox),
            PairingStore(db),
            streams=StreamRecords(db),
            curated=memory_files,
        )
    return await _open_postgresql(settings, serve=serve)


async def _open_postgresql(settings: Settings, *, serve: bool) -> StorageBackend:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        raise StartupError(
            f"database.url is a PostgreSQL URL but {e.name or 'psycopg'} is not installed: "
            "pip install 'mnemo[postgres]' (or unset MNEMO_DATABASE_URL for SQLite)"
        ) from None
    from mnemo.gateway.storage_pg.cron import PgCronStore
    from mnemo.gateway.storage_pg.inbox import PgInbox
    from mnemo.gateway.storage_pg.jobs import PgJobStore
    from mnemo.gateway.storage_pg.outbox import PgOutbox
    from mnemo.gateway.storage_pg.pairings import PgPairingStore
    from mnemo.gateway.storage_pg.rate_limits import PgRateLimits
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.gateway.storage_pg.streams import PgStreamRecords
    from mnemo.memory.errors import StoreError
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.search import PgSessionSearch
    from mnemo.memory.pg.sessions import PgSessionStore

    cfg = settings.database
    assert cfg.url is not None
    db = PgDatabase(
        cfg.url.get_secret_value(),
        migrations=PG_MIGRATIONS,
        max_size=cfg.pool_size,
        connect_timeout_s=cfg.connect_timeout_s,
    )
    try:
        await db.open()
    except StoreError as e:  # unreachable, schema too new, reordered migrations
        raise StartupError(str(e)) from e
    from mnemo.gateway.storage_pg.heartbeats import PgReplica, default_replica_id

    replica = None
    if serve:
        replica = PgReplica(db, cfg.replica_id)
        try:
            await replica.start()  # the liveness lock: from here on other replicas see this one alive
        except StoreError as e:  # a configured replica id held by a running replica
            await db.close()
            raise StartupError(str(e)) from e
    owner = replica.id if replica is not None else cfg.replica_id or default_replica_id()
    outbox = PgOutbox(db, owner=owner)
    closers: list[Callable[[], Any]] = []

    def curated_rows(identities: Any = None) -> Any:
        from mnemo.memory.pg.curated import PgCuratedFiles

        mem = settings.memory
        rows = PgCuratedFiles(
            db.url,
            mem.memory_char_limit,
            mem.user_char_limit,
            identities=identities,
            connect_timeout_s=cfg.connect_timeout_s,
        )
        closers.append(rows.close)
        return rows

    return StorageBackend(
        "postgresql",
        db,
        PgSessionStore(db),
        lambda: PgSessionSearch(db),
        PgInbox(db, owner=owner),
        outbox,
        PgJobStore(db, owner=owner),
        PgCronStore(db, outbox),
        PgPairingStore(db),
        shared_lock=db.advisory_lock,
        streams=PgStreamRecords(db),
        curated=curated_rows,
        closers=closers,
        replica=replica,
        rate_limits=PgRateLimits(db),
    )
