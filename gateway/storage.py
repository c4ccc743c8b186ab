"""The storage seam: ``state.db``'s ordered migration list, and the one typed object a
process gets its storage from (``StorageBackend``), whichever database it runs on.

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
    0014_media_usage             gateway/people/media_usage.py
    0015_memory_journal          memory/journal_sqlite.py
    0016_memory_policies         memory/policy.py
    0017_mcp                     gateway/mcp/schema.py
    0018_upkeep_requests         gateway/budgets/schema.py

Every process that opens ``state.db`` (the gateway, each CLI command, a benchmark)
goes through ``state_database``.

``Transaction`` is the handle a backend's ``write`` gives the function it runs: for
SQLite the writer connection inside ``BEGIN IMMEDIATE``. A repository that must change
its rows in another repository's transaction (cron finishing a run together with its
outbox delivery) receives it from that repository's ``write`` and passes it to a
``…_within(tx, …)`` method; a PostgreSQL backend hands its own connection the same way.

**One seam, no questions.** Features never ask which database they run on: the backend
builds what differs. ``backend_for(settings)`` is the configured ``Backend`` — what a
backend is before it is opened: its name, whether replicas share it, the read-only
probe ``mnemo doctor`` shows, who serves it for ``mnemo status`` and its side of
archives (``archive()``: snapshot and restore for ``mnemo export`` and backups). ``open_backend``
(``Backend.open``) gives the ``StorageBackend``: every repository by its port, and the
per-backend objects for links, budgets, erasure, the people directory and the rate
limit. ``database.url`` unset is ``$MNEMO_HOME/state.db`` (``storage_sqlite.py``);
``postgresql://…`` that server (``storage_postgresql.py`` over ``storage_pg/`` and ``memory/pg/``; list
``PG_MIGRATIONS``, the same step names where the tables correspond). Only the storage
modules (this one, ``storage_sqlite.py``, ``storage_postgresql.py``, ``storage_pg/``, ``memory/pg/``,
``memory/db.py``) know which is which — ``tests/test_storage_seam.py`` counts the
branches elsewhere: none.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from mnemo.gateway.archive.ports import ArchiveStore
from mnemo.gateway.budgets.ledger import BudgetRepository, Clock, utc_now
from mnemo.gateway.budgets.schema import BUDGETS, UPKEEP
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.schema import CRON_JOBS
from mnemo.gateway.cron.store import CronRepository
from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.outbox import OutboxRepository
from mnemo.gateway.delivery.schema import INBOX, OUTBOX, STREAMS
from mnemo.gateway.delivery.streams import StreamLedger
from mnemo.gateway.errors import StartupError
from mnemo.gateway.inbound.access import PairingRepository, RateWindow
from mnemo.gateway.inbound.schema import PAIRINGS
from mnemo.gateway.jobs.schema import JOBS, JOBS_DEDUPE_KEY
from mnemo.gateway.jobs.store import JobStorage
from mnemo.gateway.mcp.schema import MCP
from mnemo.gateway.mcp.store import McpRepository
from mnemo.gateway.media_quota import MediaUsageRepository
from mnemo.gateway.people.directory import Directory
from mnemo.gateway.people.erasure import PersonalData
from mnemo.gateway.people.links import LinkRepository
from mnemo.gateway.people.media_usage import MEDIA_USAGE
from mnemo.gateway.people.schema import IDENTITY_LINKS
from mnemo.memory.db import Database
from mnemo.memory.extras import install_hint
from mnemo.memory.identity import Identities
from mnemo.memory.journal import DocumentJournal, JournalRepository, ProposalRepository
from mnemo.memory.journal_sqlite import MEMORY_JOURNAL
from mnemo.memory.migrations import (
    CJK_VIEW,
    CONTEXTUAL_INDEX,
    MESSAGE_VECTORS,
    SESSIONS_AND_MESSAGES,
    Migration,
)
from mnemo.memory.policy import MEMORY_POLICIES, PolicyRepository
from mnemo.memory.ports import CuratedRepository, SearchRepository, SessionStorage

if TYPE_CHECKING:
    from mnemo.gateway.storage_pg.heartbeats import PgReplica
    from mnemo.memory.pg.db import PgDatabase

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
    MEDIA_USAGE,
    MEMORY_JOURNAL,
    MEMORY_POLICIES,
    MCP,
    UPKEEP,
)


def state_database(path: Path | str, **options: Any) -> Database:
    """A (not yet opened) ``Database`` for ``state.db`` with the whole migration list;
    ``options`` are ``Database``'s tuning keywords (readers, busy timeout, …)."""
    return Database(path, migrations=STATE_MIGRATIONS, **options)


class Background(Protocol):
    """Upkeep a backend runs while this process serves the bot (SQLite: re-indexing and
    embedding older messages, ``memory/reindex.py``)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class StorageBackend:
    """Every repository of one backend on one open database, each by its port, and the
    per-backend objects features use instead of asking which backend this is: what
    ``open_app``, the CLI and the dashboard are built on. ``close`` closes it all."""

    name: str  # "sqlite" | "postgresql": shown to people (``mnemo status --json``), never branched on
    db: Database | PgDatabase  # the open database (tests and ``App.db`` read it directly)
    sessions: SessionStorage  # bound to ``budgets``: usage and spend commit together
    # The configured search (``search.semantic``), built on first use of ``search``: the
    # SQLite retrievers import numpy, which ``mnemo pair`` never needs.
    make_search: Callable[[], SearchRepository]
    # Search without an embedding model (a shell command must not load one).
    make_lexical_search: Callable[[], SearchRepository]
    inbox: InboxRepository
    outbox: OutboxRepository
    jobs: JobStorage
    cron: CronRepository
    pairings: PairingRepository
    budgets: BudgetRepository
    directory: Directory  # who mnemo knows (``mnemo users``, the dashboard)
    # This process's map of linked identities, which ``links`` keeps current and
    # ``files`` resolves a person's USER.md by.
    identities: Identities
    files: CuratedRepository  # MEMORY.md and USER.md: files on SQLite, rows on PostgreSQL
    links: LinkRepository
    personal_data: PersonalData  # what ``Erasure`` removes of a person
    rate_limits: RateWindow  # in the process (SQLite) or shared by every replica (PostgreSQL)
    media_usage: MediaUsageRepository  # what people store, for media.quota (gateway/media_quota.py)
    # The memory journal (``memory/journal.py``): history, undo, provider writes, trust.
    journal: JournalRepository
    proposals: ProposalRepository  # writes waiting for a person's confirmation (remember: ask)
    # How layers kept outside the database journal their writes (stage → write →
    # commit): the curated files on SQLite, skills, facts.db.
    documents: DocumentJournal
    policies: PolicyRepository  # memory policies per person and per chat
    mcp: McpRepository  # MCP's client tokens, tool catalogs and reload requests (gateway/mcp)
    # A lock on a key held across every process of the database (PostgreSQL's advisory
    # locks); None when one process owns the store (SQLite).
    shared_lock: Callable[[str], AbstractAsyncContextManager[None]] | None = None
    # The messages showing replies while they are generated; None: no streaming here.
    streams: StreamLedger | None = None
    # This process among replicas (``storage_pg/heartbeats.py``: liveness, heartbeats,
    # leader locks) when it serves the bot on PostgreSQL; None otherwise.
    replica: PgReplica | None = None
    background: list[Background] = field(default_factory=list)  # started by ``open(serve=True)``
    closers: list[Callable[[], None]] = field(default_factory=list)  # blocking; before the database
    _search: SearchRepository | None = field(default=None, init=False, repr=False)

    @property
    def search(self) -> SearchRepository:
        if self._search is None:
            self._search = self.make_search()
        return self._search

    async def close(self) -> None:
        try:
            for task in reversed(self.background):
                await task.stop()
            for close in self.closers:
                await asyncio.to_thread(close)
            if self.replica is not None:
                await self.replica.stop()
        finally:
            await self.db.close()


class ProbeState(Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # nothing to check (does not fail ``mnemo doctor``)


@dataclass(frozen=True, slots=True)
class Probe:
    """One line of ``mnemo doctor``: what was checked, how it went, in words."""

    name: str
    state: ProbeState
    detail: str


@dataclass(frozen=True, slots=True)
class Serving:
    """Who serves the bot (``mnemo status``): ``replicas`` are the live processes,
    ``dead`` those that stopped or died recently (each as ``mnemo status --json`` prints
    it); ``lines`` say it in words."""

    backend: str
    running: bool
    replicas: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    lines: list[str]


class Backend(Protocol):
    """A backend before it is opened (``backend_for``)."""

    name: str
    # Several processes may serve the bot on it at once (replicas): no profile lock.
    replicated: bool

    async def open(self, *, serve: bool = False, clock: Clock = utc_now) -> StorageBackend:
        """Connect, migrate and build every repository. ``serve``: this process serves
        the bot (``open_app``): it joins the replicas and starts the backend's upkeep;
        a CLI command does neither. ``clock``: the budgets' time (tests cross midnight).
        Raises ``StartupError`` (one line) when it cannot be opened."""
        ...

    async def probe(self, timeout_s: float) -> Probe:
        """``mnemo doctor``'s database line: reachable, sound, which schema step —
        without writing anything (no migration)."""
        ...

    def probe_memories(self) -> Probe:
        """``mnemo doctor``'s line on the curated memory as this backend keeps it."""
        ...

    async def probe_search(self) -> Probe:
        """``mnemo doctor``'s line on how complete session_search's index is (re-indexing
        of older rows, messages not embedded yet); writes nothing a probe would not."""
        ...

    async def serving(self, lock_holder: Callable[[], int | None]) -> Serving:
        """Who serves the bot now; ``lock_holder`` is the PID holding the profile lock
        (``mnemo/profile_lock.py``), which is who serves a store one process owns."""
        ...

    def archive(self) -> ArchiveStore:
        """This backend's side of archives (``gateway/archive/``): what it holds, a
        consistent snapshot of it, a restore into it. Blocking; opens nothing yet."""
        ...


def backend_for(settings: Settings) -> Backend:
    """The configured backend: ``database.url`` unset is ``$MNEMO_HOME/state.db``,
    ``postgresql://…`` that server. Raises ``StartupError`` when the ``postgres``
    extra is missing."""
    if not settings.database.is_postgresql:
        from mnemo.gateway.storage_sqlite import SqliteBackend

        return SqliteBackend(settings)
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        raise StartupError(
            f"database.url is a PostgreSQL URL but {e.name or 'psycopg'} is not installed: "
            f"{install_hint('postgres')} (or unset MNEMO_DATABASE_URL for SQLite)"
        ) from None
    from mnemo.gateway.storage_postgresql import PgBackend

    return PgBackend(settings)


async def open_backend(settings: Settings, *, serve: bool = False, clock: Clock = utc_now) -> StorageBackend:
    """``backend_for(settings).open(…)``: see ``Backend.open``."""
    return await backend_for(settings).open(serve=serve, clock=clock)
