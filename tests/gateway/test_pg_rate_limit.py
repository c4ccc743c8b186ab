"""The per-user rate limit on PostgreSQL is one window for every replica: two
``AccessControl`` instances, each on its own connection pool to the same database (two
replicas), count a user's messages together, and the "slow down" notice goes out once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.events import InboundMessage
from mnemo.gateway.inbound.access import AccessControl, RateLimiter, Verdict
from mnemo.gateway.storage import open_backend
from mnemo.gateway.storage_pg.pairings import PgPairingStore
from mnemo.gateway.storage_pg.rate_limits import PgRateLimits
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.pg.db import PgDatabase
from tests.support.pgcluster import Cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


def _settings(home: Path, limit: int, url: str | None = None) -> Settings:
    env = {"MNEMO_DATABASE_URL": url} if url else {}
    return load_settings(
        home,
        environ=env,
        overrides={"access.rate_limit_per_minute": limit, "access.allowed": ("telegram:*",)},
    )


def _msg(user: str, n: int) -> InboundMessage:
    return InboundMessage("telegram", user, user, str(n), f"message {n}")


@pytest.fixture
async def replicas(pg_cluster: Cluster) -> AsyncIterator[tuple[str, list[PgDatabase]]]:
    url = pg_cluster.fresh_database()
    dbs = [PgDatabase(url, migrations=PG_MIGRATIONS, max_size=10) for _ in range(2)]
    for db in dbs:
        await db.open()
    yield url, dbs
    for db in dbs:
        await db.close()


def _access(settings: Settings, db: PgDatabase, clock: Clock | None = None) -> AccessControl:
    return AccessControl(settings, PgPairingStore(db), rate=PgRateLimits(db, clock=clock))


async def test_two_replicas_share_one_window_and_one_notice(replicas, home: Path) -> None:
    _, dbs = replicas
    clock = Clock()
    settings = _settings(home, 3)
    a, b = (_access(settings, db, clock) for db in dbs)
    verdicts = []
    for n, replica in enumerate([a, b, a, b, a, b]):  # a round-robin webhook
        verdicts.append(await replica.check(_msg("42", n)))
        clock.now += 1
    assert [v.verdict for v in verdicts] == [Verdict.ALLOW] * 3 + [Verdict.REFUSE, Verdict.DROP, Verdict.DROP]
    assert "faster than I can answer" in (verdicts[3].reply or "")
    assert "wait 58 s" in (verdicts[3].reply or "")  # refused at t=3: the hit of t=0 frees at t=60
    # Another user has a window of their own.
    assert (await b.check(_msg("7", 100))).verdict is Verdict.ALLOW

    clock.now = 60.0 + 1_750_000_000.0  # the first hit (t=0) has left the window; t=1 and t=2 have not
    assert (await b.check(_msg("42", 6))).verdict is Verdict.ALLOW
    over = await a.check(_msg("42", 7))
    assert over.verdict is Verdict.REFUSE, "an allowed message resets the notice, on every replica"
    assert (await b.check(_msg("42", 8))).verdict is Verdict.DROP

    clock.now += 61  # everything has left the window
    assert [(await r.check(_msg("42", 9 + i))).verdict for i, r in enumerate([a, b, a])] == [
        Verdict.ALLOW
    ] * 3


async def test_fifty_concurrent_hits_on_two_replicas_allow_exactly_the_limit(replicas, home: Path) -> None:
    url, dbs = replicas
    settings = _settings(home, 10)
    a, b = (_access(settings, db) for db in dbs)  # the server's clock
    verdicts = await asyncio.gather(*((a if n % 2 else b).check(_msg("42", n)) for n in range(50)))
    kinds = [v.verdict for v in verdicts]
    assert kinds.count(Verdict.ALLOW) == 10
    assert kinds.count(Verdict.REFUSE) == 1, "one notice across replicas"
    assert kinds.count(Verdict.DROP) == 39
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM rate_limit_hits WHERE key = 'telegram:42'").fetchone() == (
            10,
        )


async def test_old_rows_are_swept_and_a_disabled_limit_never_touches_the_table(replicas, home: Path) -> None:
    url, (db, _) = replicas
    clock = Clock()
    limits = PgRateLimits(db, clock=clock)
    for user in ("1", "2", "3"):
        assert (await limits.hit(f"telegram:{user}", 5)).allowed
    clock.now += 61
    limits._next_sweep = 0.0  # the next hit sweeps (every SWEEP_INTERVAL_S otherwise)
    assert (await limits.hit("telegram:4", 5)).allowed
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT key FROM rate_limit_hits").fetchall() == [("telegram:4",)]
        assert conn.execute("SELECT key FROM rate_limit_users ORDER BY key").fetchall() == [("telegram:4",)]
    assert (await limits.hit("telegram:5", 0)).allowed
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM rate_limit_users WHERE key = 'telegram:5'").fetchone() == (
            0,
        )


async def test_the_backend_shares_the_window_on_postgresql_only(pg_cluster: Cluster, home: Path) -> None:
    backend = await open_backend(_settings(home, 2, pg_cluster.fresh_database()))
    try:
        assert isinstance(backend.rate_limits, PgRateLimits)
    finally:
        await backend.close()
    local = await open_backend(_settings(home, 2))
    try:
        assert isinstance(local.rate_limits, RateLimiter)  # SQLite: the window stays in the process
    finally:
        await local.close()


async def test_two_running_apps_on_one_database_answer_the_limit_once(
    pg_cluster: Cluster, tmp_path: Path, emulator
) -> None:
    """Two ``open_app`` replicas behind a round-robin "webhook": a user gets ``limit``
    answers and one notice in all, not ``limit`` and a notice from each."""
    from contextlib import AsyncExitStack

    from mnemo.app import open_app
    from mnemo.gateway.emulator import Reply
    from tests.gateway.conftest import make_settings
    from tests.support.loopback import LoopbackAdapter

    emulator.default = lambda req: Reply(text="ok")
    url = pg_cluster.fresh_database()
    adapters = [LoopbackAdapter(), LoopbackAdapter()]
    async with AsyncExitStack() as stack:
        for n, adapter in enumerate(adapters):
            home = tmp_path / f"replica{n}"
            home.mkdir()
            settings = make_settings(
                home,
                **{"database.url": url, "database.replica_id": f"r{n}", "access.rate_limit_per_minute": 3},
            )
            await stack.enter_async_context(
                open_app(
                    settings,
                    adapters=[adapter],
                    llm_base_url=emulator.base_url,
                    api_key="test-key",
                    trial=False,
                )
            )
        for i in range(8):
            await adapters[i % 2].say(f"m{i}", user="fast")

        async def answered() -> None:
            while sum(len(a.texts("fast")) for a in adapters) < 4:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(answered(), 30)
        await asyncio.sleep(0.3)  # nothing more comes
    texts = [t for a in adapters for t in a.texts("fast")]
    assert texts.count("ok") == 3, texts
    assert len([t for t in texts if "faster than I can answer" in t]) == 1, texts
    assert len(texts) == 4
    assert len(emulator.requests) == 3
