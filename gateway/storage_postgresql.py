"""The PostgreSQL backend (``Backend`` of ``gateway/storage.py``): ``database.url``'s
server, shared by every replica — the repositories of this package and ``memory/pg/``,
the curated memory as rows, the rate limit's window and the links in shared tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import psycopg

from mnemo.gateway.archive.ports import ArchiveStore
from mnemo.gateway.budgets.ledger import Clock, utc_now
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.storage import Probe, ProbeState, Serving, StorageBackend
from mnemo.memory.errors import StoreError
from mnemo.memory.pg.db import MIN_SERVER_VERSION, PgDatabase, redact

if TYPE_CHECKING:
    from mnemo.memory.pg.semantic import PgVectors


def semantic_vectors(wanted: bool) -> PgVectors | None:
    """The vector ranking for ``search.semantic`` when the extra loads; None otherwise
    (with the same log line as on SQLite)."""
    if not wanted:
        return None
    from mnemo.memory.pg.semantic import PgVectors
    from mnemo.memory.semantic import SemanticUnavailable, load_embedder

    try:
        return PgVectors(load_embedder())
    except SemanticUnavailable as e:
        import structlog

        structlog.get_logger(__name__).warning("search.semantic_unavailable", error=str(e), using="lexical")
        return None


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class PgBackend:
    name = "postgresql"
    replicated = True

    def __init__(self, settings: Settings) -> None:
        assert settings.database.url is not None  # backend_for chose this backend for it
        self.settings = settings
        self.url = settings.database.url.get_secret_value()

    async def open(self, *, serve: bool = False, clock: Clock = utc_now) -> StorageBackend:
        from mnemo.gateway.storage_pg.budgets import PgBudgets
        from mnemo.gateway.storage_pg.cron import PgCronStore
        from mnemo.gateway.storage_pg.erasure import PgPersonalData
        from mnemo.gateway.storage_pg.heartbeats import PgReplica, default_replica_id
        from mnemo.gateway.storage_pg.inbox import PgInbox
        from mnemo.gateway.storage_pg.jobs import PgJobStore
        from mnemo.gateway.storage_pg.links import PgIdentityLinks
        from mnemo.gateway.storage_pg.mcp import PgMcpStore
        from mnemo.gateway.storage_pg.media_usage import PgMediaUsage
        from mnemo.gateway.storage_pg.outbox import PgOutbox
        from mnemo.gateway.storage_pg.pairings import PgPairingStore
        from mnemo.gateway.storage_pg.people import PgDirectory
        from mnemo.gateway.storage_pg.rate_limits import PgRateLimits
        from mnemo.gateway.storage_pg.streams import PgStreamRecords
        from mnemo.memory.identity import Identities
        from mnemo.memory.pg.curated import PgCuratedFiles
        from mnemo.memory.pg.journal import PgDocumentJournal, PgJournal
        from mnemo.memory.pg.policy import PgPolicies
        from mnemo.memory.pg.search import PgSessionSearch
        from mnemo.memory.pg.sessions import PgSessionStore
        from mnemo.memory.search import VECTORS_MODEL

        settings, cfg = self.settings, self.settings.database
        db = await self._database()
        replica = None
        if serve:
            replica = PgReplica(db, cfg.replica_id)
            try:
                await replica.start()  # the liveness lock: from here on other replicas see this one alive
            except StoreError as e:  # a configured replica id held by a running replica
                await db.close()
                raise StartupError(str(e)) from e
        owner = replica.id if replica is not None else cfg.replica_id or default_replica_id()
        mem = settings.memory
        identities = Identities()
        files = PgCuratedFiles(
            db.url,
            mem.memory_char_limit,
            mem.user_char_limit,
            identities=identities,
            connect_timeout_s=cfg.connect_timeout_s,
        )
        # Rows journal their writes in their own transaction; skills (files) stage theirs.
        documents = PgDocumentJournal(files.connection)
        journal = PgJournal(db, documents=documents)
        budgets = PgBudgets(db, timezone=settings.gateway.timezone, clock=clock)
        sessions = PgSessionStore(db)
        sessions.record_usage_in(budgets.record_within)  # in the same transaction as the usage
        outbox = PgOutbox(db, owner=owner)
        vectors_model = VECTORS_MODEL if settings.search.semantic else None
        built: list[PgSessionSearch] = []  # the configured search, once built

        def search() -> PgSessionSearch:
            if not built:
                built.append(PgSessionSearch(db, vectors=semantic_vectors(settings.search.semantic)))
            return built[0]

        backend = StorageBackend(
            name=self.name,
            db=db,
            sessions=sessions,
            make_search=search,
            make_lexical_search=lambda: PgSessionSearch(db, vectors_model=vectors_model),
            inbox=PgInbox(db, owner=owner),
            outbox=outbox,
            jobs=PgJobStore(db, owner=owner),
            cron=PgCronStore(db, outbox),
            pairings=PgPairingStore(db),
            budgets=budgets,
            directory=PgDirectory(db),
            identities=identities,
            files=files,
            links=PgIdentityLinks(db, files, identities),
            personal_data=PgPersonalData(db, settings, budgets),
            rate_limits=PgRateLimits(db),
            media_usage=PgMediaUsage(db, timezone=settings.gateway.timezone),
            journal=journal,
            proposals=journal,
            documents=documents,
            policies=PgPolicies(db),
            mcp=PgMcpStore(db),
            shared_lock=db.advisory_lock,
            streams=PgStreamRecords(db),
            replica=replica,
            closers=[files.close],
        )
        try:
            await journal.settle()
            await backend.links.refresh()
            vectors = search().vectors if serve else None  # a CLI command loads no model
            if vectors is not None:
                # Embedding new messages in the background (one replica at a time).
                from mnemo.memory.pg.semantic import PgSearchMaintenance

                maintenance = PgSearchMaintenance(db, vectors.embedder)
                maintenance.start()
                backend.background.append(maintenance)
        except BaseException:
            await backend.close()
            raise
        return backend

    async def _database(self) -> PgDatabase:
        """The open database, its schema migrated."""
        from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS

        cfg = self.settings.database
        db = PgDatabase(
            self.url,
            migrations=PG_MIGRATIONS,
            max_size=cfg.pool_size,
            connect_timeout_s=cfg.connect_timeout_s,
        )
        try:
            await db.open()
        except StoreError as e:  # unreachable, schema too new, reordered migrations
            raise StartupError(str(e)) from e
        return db

    async def probe(self, timeout_s: float) -> Probe:
        """Reachable, version 15 or later, and how far its schema is against this mnemo's
        steps. Read-only: pending steps are left to the next start (which applies them),
        as is a database that has none yet."""
        from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS

        where = redact(self.url)
        try:
            async with asyncio.timeout(timeout_s):
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                try:
                    version = conn.info.server_version
                    cur = await conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL")
                    row = await cur.fetchone()
                    steps: list[tuple[int, str]] = []
                    if row is not None and row[0]:
                        cur = await conn.execute(
                            "SELECT version, name FROM schema_migrations ORDER BY version"
                        )
                        steps = [(int(v), str(n)) for v, n in await cur.fetchall()]
                finally:
                    await conn.close()
        except TimeoutError:
            return Probe(
                "postgresql", ProbeState.FAIL, f"{where} unreachable: no answer within {timeout_s:g} s"
            )
        except psycopg.ProgrammingError as e:
            return Probe(
                "postgresql", ProbeState.FAIL, f"database.url is not a valid PostgreSQL URL: {_line(e)}"
            )
        except (psycopg.Error, OSError) as e:
            return Probe("postgresql", ProbeState.FAIL, f"{where} unreachable: {_line(e)}")
        shown = f"PostgreSQL {version // 10000}.{version % 10000}"
        if version < MIN_SERVER_VERSION:
            return Probe(
                "postgresql",
                ProbeState.FAIL,
                f"{where} runs {shown}; mnemo needs {MIN_SERVER_VERSION // 10000} or later",
            )
        known = len(PG_MIGRATIONS)
        if not steps:
            return Probe(
                "postgresql",
                ProbeState.PASS,
                f"{where} reachable, {shown}; no mnemo schema yet ({known} steps are applied at the first start)",
            )
        at, name = steps[-1]
        if at > known:
            return Probe(
                "postgresql",
                ProbeState.FAIL,
                f"{where}: schema step {at} ({name}) is newer than this mnemo "
                f"(it knows {known}): upgrade mnemo on this host",
            )
        mine = [(i + 1, m.name) for i, m in enumerate(PG_MIGRATIONS[:at])]
        if steps != mine:
            return Probe(
                "postgresql",
                ProbeState.FAIL,
                f"{where}: the applied schema steps differ from this mnemo's "
                "(another build wrote them): use the mnemo that created this database",
            )
        pending = f"; {known - at} step(s) pending, applied at the next start" if at < known else ""
        return Probe(
            "postgresql",
            ProbeState.PASS,
            f"{where} reachable, {shown}, schema step {at} of {known} ({name}){pending}",
        )

    async def probe_search(self) -> Probe:
        """Read-only, like ``probe``: the vectors waiting to be embedded are counted on a
        plain connection, without migrating."""
        from mnemo.memory.pg.semantic import pending_vectors_readonly
        from mnemo.memory.search import VECTORS_MODEL, IndexStatus

        try:
            async with asyncio.timeout(10):
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                try:
                    pending = (
                        await pending_vectors_readonly(conn, VECTORS_MODEL)
                        if self.settings.search.semantic
                        else None
                    )
                finally:
                    await conn.close()
        except (TimeoutError, psycopg.Error, OSError) as e:
            return Probe("search index", ProbeState.FAIL, f"{redact(self.url)}: {_line(e)}")
        status = IndexStatus(semantic=pending is not None, vectors_pending=pending or 0)
        return Probe("search index", ProbeState.PASS, status.describe())

    def probe_memories(self) -> Probe:
        return Probe(
            "memories",
            ProbeState.SKIP,
            "MEMORY.md and USER.md are rows on PostgreSQL (curated_memory), not files here",
        )

    def archive(self) -> ArchiveStore:
        from mnemo.gateway.storage_pg.archive import PgArchive

        return PgArchive(
            self.url, self.settings.home, connect_timeout_s=self.settings.database.connect_timeout_s
        )

    async def serving(self, lock_holder: Callable[[], int | None]) -> Serving:
        """Every replica that beats (the profile lock is not used: replicas share the home)."""
        from mnemo.gateway.storage_pg.heartbeats import is_live, list_replicas

        db = await self._database()
        try:
            rows = await list_replicas(db)
        finally:
            await db.close()
        live = [r.as_json() for r in rows if is_live(r)]
        dead = [r.as_json() for r in rows if not is_live(r)]
        lines = [f"{len(live)} live replica{'s' if len(live) != 1 else ''} on PostgreSQL"]
        for r in live:
            adapters = (
                ", ".join(f"{n}{'' if ok else ' (down)'}" for n, ok in sorted(r["adapters"].items())) or "-"
            )
            lines.append(
                f"  {r['replica_id']}  v{r['version']}  since {_when(r['started_at'])}  "
                f"beat {r['last_seen_s_ago']:g} s ago  adapters: {adapters}  roles: {', '.join(r['roles']) or '-'}"
            )
        if dead:
            lines.append("recently stopped or dead:")
            for r in dead:
                how = (
                    f"stopped {_when(r['stopped_at'])}"
                    if r["stopped_at"] is not None
                    else f"last beat {_when(r['last_seen'])}"
                )
                lines.append(f"  {r['replica_id']}  v{r['version']}  {how}")
        return Serving(self.name, bool(live), live, dead, lines)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
