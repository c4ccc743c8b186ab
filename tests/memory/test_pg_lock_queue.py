"""Turns take a session's advisory lock on a connection of PgDatabase's lock pool. When
more chats are busy than the pool has connections, the rest wait their turn, however
long: a slow turn ahead must not fail the ones behind it (found by the three-replica e2e
test on a loaded machine: turns failed with psycopg_pool's PoolTimeout after 30 s)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from psycopg_pool import AsyncConnectionPool

from mnemo.memory.pg.db import PgDatabase
from tests.support.pgcluster import Cluster

# How long psycopg_pool lets a request wait for a connection unless told otherwise.
POOL_WAIT_S = float(inspect.signature(AsyncConnectionPool).parameters["timeout"].default)


@pytest.mark.slow
async def test_a_locker_waits_for_a_lock_connection_longer_than_the_pools_own_wait_limit(
    pg_cluster: Cluster,
) -> None:
    db = PgDatabase(pg_cluster.fresh_database(), migrations=(), lock_pool_size=1)
    await db.open()
    got: list[str] = []
    inside = asyncio.Event()

    async def hold(key: str, seconds: float) -> None:
        async with db.advisory_lock(key):
            got.append(key)
            inside.set()
            await asyncio.sleep(seconds)

    try:
        first = asyncio.create_task(hold("chat-a", POOL_WAIT_S + 1))
        await inside.wait()
        await hold("chat-b", 0)  # another key: only the pool's one connection is in the way
        await first
    finally:
        await db.close()
    assert got == ["chat-a", "chat-b"]
