"""``database.url = postgresql://…`` end to end: the same pipeline (loopback adapter ->
gateway -> agent -> real anthropic SDK -> emulator -> outbox) on a throw-away PostgreSQL
cluster, and the start-up errors of the PostgreSQL backend (one line, exit 2)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import psycopg
import pytest

from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.errors import ConfigError, StartupError
from mnemo.gateway.storage import open_backend
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.pg.sessions import PgSessionStore
from tests.gateway.conftest import AppFactory
from tests.gateway.test_cli_errors import mnemo, one_clear_line
from tests.support.loopback import LoopbackAdapter
from tests.support.pgcluster import Cluster


def tool_result_text(emulator: Emulator) -> str:
    blocks = emulator.requests[-1].body["messages"][-1]["content"]
    return " ".join(str(b.get("content")) for b in blocks if b.get("type") == "tool_result")


async def test_a_conversation_is_served_and_survives_a_restart_on_postgresql(
    app_factory: AppFactory, emulator: Emulator, pg_cluster: Cluster, home: Path
) -> None:
    url = pg_cluster.fresh_database()
    emulator.script(
        Reply(text="Rex is a fine name."),
        Reply(tool_uses=[ToolUse("session_search", {"query": "what is my dog called?"})]),
        Reply(text="Your dog is Rex."),
        Reply(text="only once"),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"database.url": url}) as app:
        assert isinstance(app.store, PgSessionStore)
        await adapter.say("my dog is called Rex", user="u1")
        await adapter.wait_sent(1)
        await adapter.say("/reset", user="u1")
        await adapter.wait_sent(2)
        await adapter.say("remind me about my dog", user="u1")
        sent = await adapter.wait_sent(3)
        assert sent[-1].text == "Your dog is Rex."
        # session_search ran on PostgreSQL full-text search and found the earlier session.
        assert "my dog is called Rex" in tool_result_text(emulator)
        session = await app.store.active_session("loop:dm:u1")
        assert session is not None
        rows = await app.store.load_messages(session.id)
        assert [r.role for r in rows] == ["user", "assistant", "tool", "assistant"]
        stored = await app.store.get_session(session.id)
        assert stored is not None and stored.system_prompt == emulator.requests[-1].body["system"][0]["text"]
    assert not (home / "state.db").exists(), "nothing durable went to SQLite"

    # A second process on the same database: the stored conversation is there, and a
    # redelivered platform message (same id) is answered once.
    again = LoopbackAdapter()
    async with app_factory(again, **{"database.url": url}) as app:
        assert (await app.store.active_session("loop:dm:u1")) is not None
        msg = again.message("hello", user="u2", message_id="same")
        assert again.sink is not None
        await again.sink(msg)
        await again.sink(msg)
        await again.wait_sent(1)
        await asyncio.sleep(0.2)
        assert again.texts() == ["only once"]
    with psycopg.connect(url) as conn:
        versions = conn.execute("SELECT name FROM schema_migrations ORDER BY version").fetchall()
        assert [v[0] for v in versions] == [m.name for m in PG_MIGRATIONS]
        assert conn.execute("SELECT count(*) FROM inbox WHERE state = 'done'").fetchone() == (4,)
        assert conn.execute("SELECT count(*) FROM outbox WHERE state = 'sent'").fetchone() == (4,)


def test_database_url_comes_from_the_environment_and_must_be_postgresql(home: Path) -> None:
    url = "postgresql://mnemo:pw@db.example/mnemo"
    settings = load_settings(home, environ={"MNEMO_DATABASE_URL": url})
    assert settings.database.is_postgresql and url in settings.secret_values()
    assert not load_settings(home, environ={}).database.is_postgresql
    with pytest.raises(ConfigError, match="database.url"):
        load_settings(home, environ={"MNEMO_DATABASE_URL": "mysql://x/y"})


async def test_start_up_errors_are_one_clear_line(
    home: Path, pg_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server is unreachable: no server listens on this socket folder.
    nowhere = f"postgresql://mnemo@/mnemo?host={tmp_path}"
    settings = load_settings(
        home, environ={}, overrides={"database.url": nowhere, "database.connect_timeout_s": 1}
    )
    with pytest.raises(StartupError, match="cannot connect to PostgreSQL") as err:
        await open_backend(settings)
    assert "\n" not in str(err.value)

    # The server is up but says why it refuses: libpq's reason is in the line.
    missing = load_settings(home, environ={}, overrides={"database.url": pg_cluster.url("no_such_db")})
    with pytest.raises(StartupError, match='database "no_such_db" does not exist'):
        await open_backend(missing)

    # The schema is newer than this mnemo.
    url = pg_cluster.fresh_database()
    settings = load_settings(home, environ={}, overrides={"database.url": url})
    backend = await open_backend(settings)
    await backend.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schema_migrations(version, name) VALUES (%s, '0099_future')",
            (len(PG_MIGRATIONS) + 1,),
        )
    with pytest.raises(StartupError, match="newer mnemo"):
        await open_backend(settings)

    # The extra is not installed.
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(StartupError, match=r"pip install 'mnemo\[postgres\]'"):
        await open_backend(settings)


def test_mnemo_run_on_an_unreachable_server_exits_2_with_one_line(home: Path, tmp_path: Path) -> None:
    out = mnemo(
        home, "run", MNEMO_DATABASE_URL=f"postgresql://mnemo@/mnemo?host={tmp_path}&connect_timeout=1"
    )
    one_clear_line(out, 2, "cannot connect to PostgreSQL")


async def test_mnemo_pair_approves_a_code_in_postgresql(home: Path, pg_cluster: Cluster) -> None:
    from mnemo.memory.scope import UserRef

    url = pg_cluster.fresh_database()
    backend = await open_backend(load_settings(home, environ={}, overrides={"database.url": url}))
    try:
        code = await backend.pairings.request(UserRef("telegram", "42"), "Alice")
        listed = await asyncio.to_thread(mnemo, home, "pair", "list", MNEMO_DATABASE_URL=url)
        assert listed.returncode == 0 and code in listed.stdout, listed.stderr
        approved = await asyncio.to_thread(mnemo, home, "pair", "approve", code, MNEMO_DATABASE_URL=url)
        assert approved.returncode == 0, approved.stderr
        assert await backend.pairings.is_paired(UserRef("telegram", "42"))
    finally:
        await backend.close()
    assert not (home / "state.db").exists()


async def test_two_replicas_answer_one_session_in_order_and_once(
    app_factory: AppFactory, emulator: Emulator, pg_cluster: Cluster
) -> None:
    url = pg_cluster.fresh_database()
    emulator.script(*(Reply(text=f"answer {n}") for n in range(6)))
    first, second = LoopbackAdapter(), LoopbackAdapter()
    async with app_factory(first, **{"database.url": url}) as a, app_factory(second, **{"database.url": url}):
        # One chat's messages reach both replicas (a load balancer in front of a webhook).
        for n in range(6):
            await (first if n % 2 == 0 else second).say(f"question {n}", user="u1")

        async def all_sent() -> None:
            while len(first.sent) + len(second.sent) < 6:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(all_sent(), 30)
        await asyncio.sleep(0.2)
        texts = [m.text for m in first.sent + second.sent]
        assert sorted(texts) == [f"answer {n}" for n in range(6)], "each reply sent once, by one replica"
        session = await a.store.active_session("loop:dm:u1")
        assert session is not None
        roles = [m.role for m in await a.store.load_messages(session.id)]
        # Turns of the session never ran concurrently: each user message is followed by
        # its answer before the next turn starts.
        assert roles == ["user", "assistant"] * 6


async def test_forget_me_on_postgresql_asks_for_a_code_and_removes_nothing_until_then(
    app_factory: AppFactory, emulator: Emulator, pg_cluster: Cluster
) -> None:
    """ "/forget me" offers erasure on PostgreSQL as on SQLite (a code first) and never
    falls through to "/forget TEXT", removing the profile entry that contains "me"."""
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"database.url": pg_cluster.fresh_database()}) as app:
        profile = app.files.user(adapter.message("x", user="u1").speaker)
        assert (await asyncio.to_thread(profile.add, "Call me Ishmael")).success
        await adapter.say("/forget me", user="u1")
        reply = (await adapter.wait_sent(1))[-1].text
        assert "This will erase everything" in reply and "/forget me " in reply
        assert [e for e in (await asyncio.to_thread(profile.load)).entries] == ["Call me Ishmael"]
