"""Replicas on one PostgreSQL database (``storage_pg/heartbeats.py``): alive exactly while
the replica connection lives, one leader per name with takeover when it dies, the sweeps
that take a dead replica's work and never a live one's, per-chat order across replicas,
and ``mnemo status`` on both backends. A replica's death is its backend being terminated
by the server — what a ``kill -9`` of the process amounts to for PostgreSQL (the real
``kill -9`` runs in ``test_pg_replicas_e2e.py``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.storage_pg.heartbeats import PgReplica, ReplicaIdInUse, is_live, list_replicas
from mnemo.gateway.storage_pg.inbox import PgInbox
from mnemo.gateway.storage_pg.jobs import PgJobStore
from mnemo.gateway.storage_pg.outbox import PgOutbox
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.pg.db import PgDatabase
from mnemo.profile_lock import hold
from tests.gateway.test_cli_errors import mnemo
from tests.support.pgcluster import Cluster

NOW = 1_740_000_000.0


@pytest.fixture
async def db(pg_cluster: Cluster) -> AsyncIterator[PgDatabase]:
    database = PgDatabase(pg_cluster.fresh_database(), migrations=PG_MIGRATIONS)
    await database.open()
    yield database
    await database.close()


@pytest.fixture
async def replicas(db: PgDatabase) -> AsyncIterator[list[PgReplica]]:
    started: list[PgReplica] = []
    for _ in range(2):
        r = PgReplica(db, None)
        await r.start()
        started.append(r)
    yield started
    for r in started:
        await r.stop()


def die(db: PgDatabase, replica: PgReplica) -> None:
    """The server ends the replica connection's backend, as when its process is killed."""
    assert replica._conn is not None
    pid = replica._conn.info.backend_pid
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def alive(db: PgDatabase) -> dict[str, bool]:
    return {r.id: r.alive for r in await list_replicas(db)}


async def test_a_replica_is_alive_exactly_while_its_connection_lives(db: PgDatabase, replicas) -> None:
    a, b = replicas
    assert a.id != b.id and a.id.endswith(f":{os.getpid()}")  # host:pid; a second app in one process: :1
    assert await alive(db) == {a.id: True, b.id: True}
    await a.beat({"telegram": True})
    [row] = [r for r in await list_replicas(db) if r.id == a.id]
    assert row.adapters == {"telegram": True} and row.roles == [] and is_live(row)
    die(db, a)
    await asyncio.sleep(0.2)  # the backend exits
    assert await alive(db) == {a.id: False, b.id: True}
    await a.beat({"telegram": True})  # the next beat finds the connection gone and opens a new one
    assert await alive(db) == {a.id: True, b.id: True}


async def test_a_configured_replica_id_in_use_is_refused(db: PgDatabase) -> None:
    first = PgReplica(db, "replica-1")
    await first.start()
    try:
        with pytest.raises(ReplicaIdInUse, match="'replica-1' is in use"):
            await PgReplica(db, "replica-1").start()
    finally:
        await first.stop()
    again = PgReplica(db, "replica-1")  # stopped: the id is free again
    await again.start()
    await again.stop()


async def test_one_leader_per_name_and_another_takes_over_when_it_dies(db: PgDatabase, replicas) -> None:
    a, b = replicas
    lease = await a.acquire("telegram-polling")
    assert await b.try_acquire("telegram-polling") is None
    assert await b.try_acquire("other") is not None  # names are independent
    await a.beat({})
    assert [r.roles for r in await list_replicas(db) if r.id == a.id] == [["leader:telegram-polling"]]
    die(db, a)
    taken = await asyncio.wait_for(b.acquire("telegram-polling"), 10)
    assert taken.name == "telegram-polling"
    assert lease.held  # a has not noticed yet...
    await a.beat({})
    await asyncio.wait_for(lease.lost(), 1)  # ...its next beat does: it stops leading
    assert await a.try_acquire("telegram-polling") is None
    await taken.release()
    assert await a.try_acquire("telegram-polling") is not None


async def test_the_sweeps_take_a_dead_replicas_work_and_never_a_live_ones(db: PgDatabase, replicas) -> None:
    a, b = replicas
    ia, ib = PgInbox(db, owner=a.id), PgInbox(db, owner=b.id)
    oa, ob = PgOutbox(db, owner=a.id), PgOutbox(db, owner=b.id)
    ja, jb = PgJobStore(db, owner=a.id, lease_s=60), PgJobStore(db, owner=b.id, lease_s=60)
    rows = [await ia.accept("telegram", "1", str(n), {"n": n}) for n in range(2)]
    await ib.accept("telegram", "2", "x", {"n": 9})
    send = await oa.enqueue(OutboundMessage(chat=ChatRef("telegram", "1"), text="hi"))
    assert await oa.claim(send)
    job, _ = await ja.add("compress", "s1", {}, cooldown_s=0, now=NOW)
    assert await ja.claim(["compress"], NOW) is not None
    assert await ja.renew_leases(NOW + 500) == 1
    stored = await ja.get(job.id)
    assert stored is not None and await jb.claim(["compress"], NOW + 100) is None  # a's job stays a's

    # a is alive: nothing of it is taken.
    assert await ib.orphaned() == []
    assert await ob.requeue_orphans() == 0
    assert await jb.requeue_orphans(NOW + 1, max_attempts=5) == (0, 0)

    die(db, a)
    await asyncio.sleep(0.2)
    adopted = await ib.orphaned()
    assert [r.id for r in adopted] == [r.id for r in rows if r is not None]
    assert await ib.orphaned() == [], "adopted once"
    assert await ob.requeue_orphans() == 1
    [row] = await ob.due({"telegram"})
    assert row.id == send and row.possible_duplicate
    assert await jb.requeue_orphans(NOW + 1, max_attempts=5) == (1, 0)
    taken = await jb.claim(["compress"], NOW + 2)
    assert taken is not None and taken.id == job.id


async def test_one_chats_rows_are_claimed_in_order_across_senders(db: PgDatabase) -> None:
    oa, ob = PgOutbox(db, owner="a"), PgOutbox(db, owner="b")
    chat = ChatRef("telegram", "7")
    first, second, third = [await oa.enqueue(OutboundMessage(chat=chat, text=str(n))) for n in range(3)]
    other = await oa.enqueue(OutboundMessage(chat=ChatRef("telegram", "8"), text="x"))
    assert await oa.claim(first)
    assert not await ob.claim(second), "a is still sending the chat's earlier reply"
    assert await ob.claim(other), "other chats are not held up"
    assert await oa.claim(second), "a sends its chat's rows one after another"
    await oa.mark_sent(first, ["1"])
    await oa.mark_sent(second, ["2"])
    assert await ob.claim(third)


async def test_a_turn_waits_for_an_older_message_of_its_chat_elsewhere_and_gives_way_to_one_behind_it(
    db: PgDatabase, replicas
) -> None:
    a, b = replicas
    ia, ib = PgInbox(db, owner=a.id), PgInbox(db, owner=b.id)
    older = await ia.accept("telegram", "1", "1", {})
    newer = await ib.accept("telegram", "1", "2", {})
    unrelated = await ib.accept("telegram", "9", "1", {})
    assert older is not None and newer is not None and unrelated is not None
    assert await ib.earlier_unfinished(newer.id, [newer.id]) == "other"
    assert await ib.earlier_unfinished(unrelated.id, [unrelated.id]) is None
    assert await ib.earlier_unfinished(newer.id, [older.id, newer.id]) is None  # the same turn
    die(db, a)
    await asyncio.sleep(0.2)
    assert [r.id for r in await ib.orphaned()] == [older.id]
    assert await ib.earlier_unfinished(newer.id, [newer.id]) == "own"
    await ib.mark_done(older.id)
    assert await ib.earlier_unfinished(newer.id, [newer.id]) is None


async def test_mnemo_status_lists_live_and_dead_replicas_on_postgresql(
    db: PgDatabase, replicas, home: Path
) -> None:
    a, b = replicas
    lease = await b.acquire("telegram-polling")
    await b.beat({"telegram": True})
    die(db, a)
    await asyncio.sleep(0.2)
    out = await asyncio.to_thread(mnemo, home, "status", "--json", MNEMO_DATABASE_URL=db.url)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["backend"] == "postgresql" and report["running"] is True
    assert [(r["replica_id"], r["roles"], r["adapters"]) for r in report["replicas"]] == [
        (b.id, ["leader:telegram-polling"], {"telegram": True})
    ]
    assert [(r["replica_id"], r["alive"]) for r in report["dead"]] == [(a.id, False)]
    text = await asyncio.to_thread(mnemo, home, "status", MNEMO_DATABASE_URL=db.url)
    assert text.returncode == 0 and "1 live replica on PostgreSQL" in text.stdout and a.id in text.stdout
    await lease.release()
    await b.stop()
    replicas.remove(b)
    gone = await asyncio.to_thread(mnemo, home, "status", "--json", MNEMO_DATABASE_URL=db.url)
    assert gone.returncode == 1 and json.loads(gone.stdout)["replicas"] == []
    [stopped] = [r for r in json.loads(gone.stdout)["dead"] if r["replica_id"] == b.id]
    assert stopped["stopped_at"] is not None


async def test_mnemo_status_on_sqlite_names_the_profile_locks_holder(home: Path) -> None:
    idle = await asyncio.to_thread(mnemo, home, "status")
    assert idle.returncode == 1 and idle.stdout.strip() == "not running", idle.stderr
    with hold(home):
        busy = await asyncio.to_thread(mnemo, home, "status", "--json")
        again = await asyncio.to_thread(mnemo, home, "run")  # the one-process rule still holds
    assert busy.returncode == 0, busy.stderr
    report = json.loads(busy.stdout)
    assert report["backend"] == "sqlite" and report["replicas"][0]["pid"] == os.getpid()
    assert again.returncode == 1 and f"in use by PID {os.getpid()}" in again.stderr
