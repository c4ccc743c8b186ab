"""The SQLite backend (``Backend`` of ``gateway/storage.py``): ``$MNEMO_HOME/state.db``
with the repositories beside their sub-systems, the curated memory as files under
``memories/``, the rate limit kept in the process. One process serves a profile (the
profile lock, ``mnemo/profile_lock.py``), so nothing here is shared between processes.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mnemo.gateway.archive.ports import ArchiveStore
from mnemo.gateway.budgets.ledger import Clock, SqliteBudgets, utc_now
from mnemo.gateway.config import Settings
from mnemo.gateway.storage import STATE_MIGRATIONS, Probe, ProbeState, Serving, StorageBackend, state_database
from mnemo.memory.errors import StoreError
from mnemo.memory.identity import Identities
from mnemo.memory.ports import SearchRepository

if TYPE_CHECKING:
    from mnemo.memory.search import SessionSearch

QUICK_CHECK_SHOWN = 3


def quick_check(path: Path, limit: int = 20) -> list[str]:
    """SQLite's ``PRAGMA quick_check`` on a read-only connection: its first ``limit``
    error lines, ``[]`` when the file is sound. Raises ``sqlite3.Error`` for a file that
    is not a database at all."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(f"PRAGMA quick_check({int(limit)})").fetchall()
    finally:
        conn.close()
    lines = [line.strip() for r in rows if r[0] != "ok" for line in str(r[0]).splitlines()]
    # "*** in database main ***" heads the list: which file, not what is wrong.
    return [line for line in lines if line and not line.startswith("***")]


class SqliteBackend:
    name = "sqlite"
    replicated = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def open(self, *, serve: bool = False, clock: Clock = utc_now) -> StorageBackend:
        from mnemo.gateway.cron.store import CronStore
        from mnemo.gateway.delivery.inbox import Inbox
        from mnemo.gateway.delivery.outbox import Outbox
        from mnemo.gateway.delivery.streams import StreamRecords
        from mnemo.gateway.inbound.access import PairingStore, RateLimiter
        from mnemo.gateway.jobs.store import JobStore
        from mnemo.gateway.mcp.store import McpStore
        from mnemo.gateway.people.directory import StateDirectory
        from mnemo.gateway.people.erasure_state import StateData
        from mnemo.gateway.people.links import IdentityLinks
        from mnemo.gateway.people.media_usage import SqliteMediaUsage
        from mnemo.memory.curated import MemoryFiles
        from mnemo.memory.journal_sqlite import SqliteJournal
        from mnemo.memory.policy import SqlitePolicies
        from mnemo.memory.sessions import SessionStore

        settings = self.settings
        db = state_database(settings.state_db)
        await db.open()

        built: list[SessionSearch] = []  # the configured search, once built

        def search() -> SearchRepository:
            from mnemo.memory.search import SessionSearch

            if not built and settings.search.semantic:
                from mnemo.memory.semantic import configured_retriever  # numpy: only when on

                built.append(SessionSearch(db, retriever=configured_retriever(True)))
            elif not built:
                built.append(SessionSearch(db))
            return built[0]

        def lexical_search() -> SearchRepository:
            from mnemo.memory.search import VECTORS_MODEL, SessionSearch

            return SessionSearch(db, vectors_model=VECTORS_MODEL if settings.search.semantic else None)

        mem = settings.memory
        identities = Identities()
        journal = SqliteJournal(db)  # in state.db; the files stage their entries (memory/journal.py)
        files = MemoryFiles(
            settings.memories_dir,
            mem.memory_char_limit,
            mem.user_char_limit,
            identities=identities,
            journal=journal,
        )
        budgets = SqliteBudgets(db, timezone=settings.gateway.timezone, clock=clock)
        sessions = SessionStore(db)
        sessions.record_usage_in(budgets.record_within)  # spend in the same write as the usage
        rate = RateLimiter()
        outbox = Outbox(db)
        backend = StorageBackend(
            name=self.name,
            db=db,
            sessions=sessions,
            make_search=search,
            make_lexical_search=lexical_search,
            inbox=Inbox(db),
            outbox=outbox,
            jobs=JobStore(db),
            cron=CronStore(db, outbox),
            pairings=PairingStore(db),
            budgets=budgets,
            directory=StateDirectory(db, settings.memories_dir),
            identities=identities,
            files=files,
            links=IdentityLinks(db, files, identities),
            personal_data=StateData(db, settings, budgets, rate=rate),
            rate_limits=rate,
            media_usage=SqliteMediaUsage(db, timezone=settings.gateway.timezone),
            journal=journal,
            proposals=journal,
            documents=journal,
            policies=SqlitePolicies(db),
            mcp=McpStore(db),
            streams=StreamRecords(db),
        )
        try:
            await journal.settle()  # entries a killed writer left staged: kept or dropped
            await backend.links.refresh()
            if serve:
                # Re-indexing of rows older than the contextual index and semantic
                # embedding, in the background; searches answer meanwhile (memory/reindex.py).
                from mnemo.memory.reindex import SearchMaintenance

                search()
                maintenance = SearchMaintenance(db, built[0].retriever)
                maintenance.start()
                backend.background.append(maintenance)
        except BaseException:
            await backend.close()
            raise
        return backend

    async def probe(self, timeout_s: float) -> Probe:
        settings = self.settings
        path = settings.state_db
        if not settings.home.is_dir():
            return Probe("state.db", ProbeState.SKIP, "no home folder yet")
        if path.is_file():
            # Before open (which migrates, i.e. writes): a damaged page opens fine and fails later.
            try:
                problems = await asyncio.to_thread(quick_check, path)
            except sqlite3.Error as e:
                return Probe(
                    "state.db",
                    ProbeState.FAIL,
                    f"{path} is damaged ({e}) — restore a backup (`mnemo import`), or move it aside to start afresh",
                )
            if problems:
                shown = "; ".join(problems[:QUICK_CHECK_SHOWN])
                more = (
                    f" (+{len(problems) - QUICK_CHECK_SHOWN} more)"
                    if len(problems) > QUICK_CHECK_SHOWN
                    else ""
                )
                return Probe(
                    "state.db",
                    ProbeState.FAIL,
                    f"{path} is damaged: {shown}{more} — restore a "
                    "backup (`mnemo import`), or stop mnemo and try: sqlite3 state.db .recover",
                )
        db = state_database(path)
        try:
            await db.open()
            return Probe(
                "state.db",
                ProbeState.PASS,
                f"{path} opens, passes quick_check, schema version {db.schema_version}",
            )
        except (StoreError, sqlite3.Error, OSError) as e:
            return Probe("state.db", ProbeState.FAIL, f"{path}: {e}")
        finally:
            await db.close()

    async def probe_search(self) -> Probe:
        from mnemo.memory.search import VECTORS_MODEL, SessionSearch

        db = state_database(self.settings.state_db)
        try:
            await db.open()
            search = SessionSearch(db, vectors_model=VECTORS_MODEL if self.settings.search.semantic else None)
            status = await search.index_status()
        except (StoreError, sqlite3.Error, OSError) as e:
            return Probe("search index", ProbeState.FAIL, f"{self.settings.state_db}: {e}")
        finally:
            await db.close()
        return Probe("search index", ProbeState.PASS, status.describe())

    def probe_memories(self) -> Probe:
        root = self.settings.memories_dir
        if not root.exists():
            return Probe(
                "memories", ProbeState.PASS, f"{root} not created yet (made on the first memory write)"
            )
        shared = root / "MEMORY.md"
        profiles = sorted((root / "users").glob("*/*/USER.md"))
        chars = 0
        for path in ([shared] if shared.exists() else []) + profiles:
            try:
                text = path.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as e:
                return Probe("memories", ProbeState.FAIL, f"cannot read {path}: {e}")
            if path == shared:
                chars = len(text)
        return Probe(
            "memories",
            ProbeState.PASS,
            f"{root} readable (MEMORY.md {chars:,} chars, {len(profiles)} user profiles)",
        )

    def archive(self) -> ArchiveStore:
        from mnemo.gateway.archive.sqlite import SqliteArchive
        from mnemo.memory.provider_config import provider_dir

        home = self.settings.home
        facts = provider_dir(home, "holographic") / "facts.db"
        return SqliteArchive(self.settings.state_db, facts, self.settings.memories_dir, STATE_MIGRATIONS)

    async def serving(self, lock_holder: Callable[[], int | None]) -> Serving:
        pid = lock_holder()
        if pid is None:
            return Serving(self.name, False, [], [], ["not running"])
        me = {"replica_id": f"{socket.gethostname()}:{pid}", "pid": pid}
        return Serving(self.name, True, [me], [], [f"running: PID {pid} (SQLite: one process per profile)"])
