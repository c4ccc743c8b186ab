"""What the PostgreSQL backend adds for several replicas on one database (beyond the
shared contract suite): claims that never double, leases a dead replica's work is taken
over by, start-up recovery that leaves a live replica's work alone, migrations applied
once when replicas start together, and search using its GIN index with the chat scope."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from mnemo.gateway.cron.schedules import Schedule, ScheduleKind
from mnemo.gateway.cron.store import CronJob, JobSource, JobState, JobTarget
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.jobs.store import JobState as Q
from mnemo.gateway.storage_pg.cron import PgCronStore
from mnemo.gateway.storage_pg.jobs import PgJobStore
from mnemo.gateway.storage_pg.outbox import PgOutbox
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.errors import StoreError
from mnemo.memory.fts_query import parse
from mnemo.memory.pg.db import PgDatabase, PgMigration
from mnemo.memory.pg.search import candidates
from tests.support.pgcluster import Cluster

NOW = 1_740_000_000.0


@pytest.fixture
async def two_replicas(pg_cluster: Cluster) -> AsyncIterator[tuple[PgDatabase, PgDatabase]]:
    """Two processes' pools on one fresh database."""
    url = pg_cluster.fresh_database()
    a, b = PgDatabase(url, migrations=PG_MIGRATIONS), PgDatabase(url, migrations=PG_MIGRATIONS)
    await asyncio.gather(a.open(), b.open())  # starting together: each step applied once
    yield a, b
    await a.close()
    await b.close()


async def test_replicas_starting_together_apply_each_migration_once(two_replicas) -> None:
    a, _ = two_replicas
    rows = await a.read(lambda c: _all(c, "SELECT version, name FROM schema_migrations ORDER BY version"))
    assert [(r["version"], r["name"]) for r in rows] == [(i + 1, m.name) for i, m in enumerate(PG_MIGRATIONS)]


async def test_a_reordered_migration_list_is_refused(two_replicas) -> None:
    a, _ = two_replicas
    swapped = (PG_MIGRATIONS[1], PG_MIGRATIONS[0], *PG_MIGRATIONS[2:], PgMigration("0099_new", "SELECT 1"))
    db = PgDatabase(a.url, migrations=swapped)
    with pytest.raises(StoreError, match="reordered"):
        await db.open()
    assert not db.is_open


async def test_concurrent_claims_never_double_and_one_job_runs_per_session(two_replicas) -> None:
    a, b = two_replicas
    ja, jb = PgJobStore(a, owner="a"), PgJobStore(b, owner="b")
    for n in range(10):
        for kind in ("compress", "review"):
            await ja.add(kind, f"s{n}", {}, cooldown_s=0, now=NOW)
    claims = await asyncio.gather(*(store.claim(["compress", "review"], NOW) for store in (ja, jb) * 10))
    got = [j for j in claims if j is not None]
    assert len(got) == 10, "one job per session while its first runs"
    assert len({j.id for j in got}) == 10 and len({j.session_id for j in got}) == 10
    assert await ja.claim(["compress", "review"], NOW) is None


async def test_a_dead_replicas_job_is_left_alone_until_its_lease_expires(two_replicas) -> None:
    a, b = two_replicas
    ja, jb = PgJobStore(a, owner="a", lease_s=60), PgJobStore(b, owner="b", lease_s=60)
    job, _ = await ja.add("compress", "s1", {}, cooldown_s=0, now=NOW)
    assert (await ja.claim(["compress"], NOW)) is not None
    # b restarts meanwhile: its recovery does not take a's running job...
    assert await jb.recover(NOW + 1, max_attempts=5, retention_s=3600) == (0, 0)
    assert await jb.claim(["compress"], NOW + 1) is None
    # ...a checkpoint renews a's lease...
    await ja.save_checkpoint(job.id, {"step": 1}, NOW + 50)
    assert await jb.claim(["compress"], NOW + 100) is None
    # ...and once a has gone quiet past its lease, b takes the job over, checkpoint and all.
    taken = await jb.claim(["compress"], NOW + 111)
    assert (
        taken is not None and taken.id == job.id and taken.attempts == 2 and taken.checkpoint == {"step": 1}
    )
    stored = await jb.get(job.id)
    assert stored is not None and stored.state is Q.RUNNING


async def test_two_senders_never_send_the_same_row_and_recovery_spares_a_live_send(two_replicas) -> None:
    a, b = two_replicas
    clock = [NOW]
    oa = PgOutbox(a, owner="a", clock=lambda: clock[0], lease_s=300)
    ob = PgOutbox(b, owner="b", clock=lambda: clock[0], lease_s=300)
    # One chat per row: rows of one chat are claimed in order (``test_pg_heartbeats.py``).
    ids = [
        await oa.enqueue(OutboundMessage(chat=ChatRef("telegram", str(n)), text=str(n))) for n in range(20)
    ]
    wins = await asyncio.gather(*(store.claim(i) for i in ids for store in (oa, ob)))
    assert sum(wins) == 20 and all(wins[k] != wins[k + 1] for k in range(0, 40, 2))
    # b restarts: a's sends in flight are not relabelled; a's own restart takes them back.
    a_rows = [i for k, i in enumerate(ids) if wins[2 * k]]
    b_rows = [i for i in ids if i not in a_rows]
    assert await ob.recover_in_flight() == len(b_rows)
    assert {r.id for r in await oa.due({"telegram"}, limit=50)} == set(b_rows)
    clock[0] += 301  # a died: its claims are older than the lease
    assert await ob.recover_in_flight() == len(a_rows)
    assert all(r.possible_duplicate for r in await ob.due({"telegram"}, limit=50))


async def test_a_cron_slot_is_claimed_once_by_racing_schedulers(two_replicas) -> None:
    a, b = two_replicas
    ca, cb = PgCronStore(a, PgOutbox(a)), PgCronStore(b, PgOutbox(b))
    now = datetime(2025, 3, 1, 12, tzinfo=UTC)
    slot = now + timedelta(hours=1)
    await ca.insert(
        CronJob(
            id="j1",
            target=JobTarget("telegram", "1"),
            user_id="1",
            source=JobSource.TOOL,
            created_by="t:1",
            prompt="p",
            schedule=Schedule(ScheduleKind.EVERY, "3600", "UTC", now),
            state=JobState.ACTIVE,
            next_run_at=slot,
            last_run_at=None,
            last_result=None,
            rev=1,
            created_at=now,
        )
    )
    results = await asyncio.gather(
        *(
            store.claim_scheduled("j1", 1, slot, slot + timedelta(hours=1), now, pid=n)
            for n, store in enumerate((ca, cb) * 5)
        )
    )
    assert sum(r is not None for r in results) == 1
    assert len(await ca.runs("j1")) == 1


async def test_search_uses_the_gin_index_with_the_chat_scope_in_its_condition(two_replicas) -> None:
    a, _ = two_replicas
    with psycopg.connect(a.url, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        for chats in ([1], [1, 2]):
            found = candidates(parse("adopting a beagle"), chats, 20)
            assert found is not None
            sql, args = found
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql}", args).fetchall())
            conds = [line for line in plan.splitlines() if "Index Cond" in line]
            assert "messages_fts" in plan and len(conds) == len(chats), plan
            assert all("chat_no =" in c and "tsv @@" in c for c in conds), plan


async def _all(c, sql):
    return await (await c.execute(sql)).fetchall()


async def _waiting_for_advisory_lock(db: PgDatabase) -> int:
    rows = await db.read(
        lambda c: _all(c, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    )
    return len(rows)


async def test_a_sessions_turns_never_overlap_across_replicas(two_replicas, settings) -> None:
    from mnemo.gateway.turns.sessions import SessionResolver
    from mnemo.memory.curated import MemoryFiles

    a, b = two_replicas
    files = MemoryFiles(settings.memories_dir, 100, 100)
    replicas = [SessionResolver(settings, None, files, shared_lock=db.advisory_lock) for db in (a, b)]  # type: ignore[arg-type]  # no store: only the lock is used
    inside: list[str] = []
    trace: list[tuple[str, str]] = []

    async def turn(resolver: SessionResolver, name: str) -> None:
        async with resolver.lock("loop:dm:u1"):
            inside.append(name)
            assert len(inside) == 1, f"two turns of one session at once: {inside}"
            trace.append(("in", name))
            await asyncio.sleep(0)
            trace.append(("out", name))
            inside.remove(name)

    # Replica a holds the session; b's turn waits on the server until a's ends.
    async with replicas[0].lock("loop:dm:u1"):
        waiting = asyncio.create_task(turn(replicas[1], "b"))
        while await _waiting_for_advisory_lock(a) == 0:
            await asyncio.sleep(0.01)
        assert not waiting.done()
    await waiting
    await asyncio.gather(*(turn(replicas[n % 2], f"t{n}") for n in range(10)))
    assert len(trace) == 22 and all(trace[k][1] == trace[k + 1][1] for k in range(0, 22, 2))
    # Other sessions are not held up by it.
    async with replicas[0].lock("loop:dm:u1"), replicas[1].lock("loop:dm:u2"):
        pass


async def test_a_dead_replicas_session_lock_is_released_by_the_server(two_replicas) -> None:
    a, b = two_replicas
    async with a.advisory_lock("session:k"):
        holder = await a.read(
            lambda c: _all(c, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")
        )
        waiting = asyncio.create_task(_hold(b, "session:k"))
        while await _waiting_for_advisory_lock(b) == 0:
            await asyncio.sleep(0.01)
        # The replica "dies": its lock connection is gone (as after kill -9).
        with psycopg.connect(a.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (holder[0]["pid"],))
        assert await waiting == "got it"
    # a's own exit found its connection gone and raised nothing: the lock went with it.
    async with a.advisory_lock("session:k"):
        pass


async def _hold(db: PgDatabase, key: str) -> str:
    async with db.advisory_lock(key):
        return "got it"
