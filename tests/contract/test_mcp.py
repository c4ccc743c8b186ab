"""``McpRepository`` on every backend: tokens, tool catalogs, reload requests and the
person's DM chats (``gateway/mcp/store.py``, ``gateway/storage_pg/mcp.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemo.gateway.mcp.store import McpRepository, McpStore
from mnemo.gateway.storage import state_database
from mnemo.memory.ports import SessionRepository
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import SessionStore

ANN, BEN = UserRef("telegram", "1"), UserRef("discord", "2")


@pytest.fixture(params=["sqlite", "postgresql"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[McpRepository, SessionRepository]]:
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield McpStore(db), SessionStore(db)
        await db.close()
        return
    from mnemo.gateway.storage_pg.mcp import PgMcpStore
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.sessions import PgSessionStore

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=2
    )
    await pg.open()
    yield PgMcpStore(pg), PgSessionStore(pg)
    await pg.close()


async def test_tokens_are_found_by_hash_listed_touched_and_revoked_once(stores) -> None:
    repo, _ = stores
    await repo.add_token("aa", "h1", ANN, read_only=False, at=100.0, expires_at=None)
    await repo.add_token("bb", "h2", BEN, read_only=True, at=200.0, expires_at=300.0)
    found = await repo.token_by_hash("h1")
    assert found is not None and (found.id, found.user, found.read_only) == ("aa", ANN, False)
    assert await repo.token_by_hash("nope") is None
    assert [t.id for t in await repo.tokens()] == ["aa", "bb"]
    await repo.touch_token("aa", 150.0)
    assert (await repo.token_by_hash("h1")).last_used_at == 150.0
    ben = await repo.token_by_hash("h2")
    assert (ben.state(250.0), ben.state(300.0)) == ("active", "expired")
    assert await repo.revoke_token("aa", 160.0) is True
    assert await repo.revoke_token("aa", 170.0) is False, "revoked once"
    assert await repo.revoke_token("zz", 170.0) is False
    ann = await repo.token_by_hash("h1")
    assert ann.revoked_at == 160.0 and ann.state(161.0) == "revoked"


async def test_catalogs_are_stored_once_per_change_and_found_by_time(stores) -> None:
    repo, _ = stores
    assert await repo.catalog_at(1e12) is None
    one = await repo.add_catalog("d1", "[1]", 100.0)
    same = await repo.add_catalog("d1", "[1]", 150.0)
    two = await repo.add_catalog("d2", "[2]", 200.0)
    back = await repo.add_catalog("d1", "[1]", 300.0)
    assert same == one, "the newest catalog had the same digest: nothing stored"
    assert len({one.version, two.version, back.version}) == 3, "d1 again after d2 is a new catalog"
    assert await repo.catalog_at(99.0) is None
    assert (await repo.catalog_at(100.0)).version == one.version
    assert (await repo.catalog_at(250.0)).tools == "[2]"
    assert (await repo.catalog_at(1e9)).version == back.version


async def test_reload_requests_and_the_first_report(stores) -> None:
    repo, _ = stores
    assert await repo.last_reload() == 0
    first = await repo.request_reload(10.0)
    second = await repo.request_reload(11.0)
    assert second > first and await repo.last_reload() == second
    await repo.finish_reload(second, 12.0, "host:1", '{"servers": []}')
    await repo.finish_reload(second, 13.0, "host:2", '{"later": true}')
    state = await repo.reload_state(second)
    assert state is not None and (state.done_at, state.done_by, state.report) == (
        12.0,
        "host:1",
        '{"servers": []}',
    )
    pending = await repo.reload_state(first)
    assert pending is not None and pending.report is None
    assert await repo.reload_state(999) is None


async def test_dm_keys_are_the_accounts_direct_chats_only(stores) -> None:
    repo, sessions = stores

    async def session(key: str, platform: str, user: str, source: str = "chat") -> None:
        await sessions.create_session(
            chat_key=key,
            platform=platform,
            chat_id=key.split(":")[2],
            thread_id=None,
            user_id=user,
            agent_context="primary",
            source=source,
            model="m",
            system_prompt="s",
            started_at=datetime(2025, 1, 1, tzinfo=UTC),
        )

    await session("telegram:dm:1", "telegram", "1")
    await session("telegram:group:-5:1", "telegram", "1")
    await session("telegram:dm:1", "telegram", "1", source="cron")
    await session("discord:dm:777", "discord", "2")
    await session("telegram:dm:3", "telegram", "3")
    assert await repo.dm_keys([ANN]) == ("telegram:dm:1",)
    assert await repo.dm_keys([ANN, BEN]) == ("telegram:dm:1", "discord:dm:777")
    assert await repo.dm_keys([UserRef("telegram", "9")]) == ()
