"""RetainDB provider: the real aiohttp client against a fake RetainDB API on 127.0.0.1,
and end to end through the gateway (loopback adapter, Anthropic emulator, job queue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import MirrorWrite, PreCompress, SessionEnd, SyncTurn
from mnemo.providers.retaindb import RetainDBProvider
from tests.fakes.retaindb_api import FakeRetainDB
from tests.providers.writes import stored
from tests.support.loopback import LoopbackAdapter

KEY = "rdb-test"
T = asyncio.to_thread


@pytest.fixture
async def fake() -> AsyncIterator[FakeRetainDB]:
    f = FakeRetainDB(KEY)
    await f.start()
    yield f
    await f.stop()


def ctx(home: Path, user: str | None = "telegram:1", session: str = "s1") -> ProviderContext:
    return ProviderContext(
        session_id=session,
        chat_key="telegram:group:9",
        platform="telegram",
        user=UserRef.parse(user) if user else None,
        agent_context=AgentContext.PRIMARY,
        home=home,
    )


def provider(home: Path, fake: FakeRetainDB, **extra: object) -> RetainDBProvider:
    p = RetainDBProvider()
    config = {"api_key": KEY, "base_url": fake.base_url, "project": "proj", "top_k": 5, "timeout_s": 5.0}
    config.update(extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


def test_needs_an_api_key_and_reads_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RETAINDB_API_KEY", raising=False)
    assert not RetainDBProvider().is_available(home, {}).ok
    monkeypatch.setenv("RETAINDB_API_KEY", "from-env")
    monkeypatch.setenv("RETAINDB_BASE_URL", "http://127.0.0.1:9/")
    p = RetainDBProvider()
    assert p.is_available(home, {}).ok
    p.initialize(home, {})
    assert (
        p._client is not None
        and p._client.api_key == "from-env"
        and p._client.base_url == "http://127.0.0.1:9"
    )
    assert {f.key for f in p.get_config_schema()} >= {"api_key", "base_url", "project"}


async def test_writes_and_recall_carry_the_speakers_scope_only(home: Path, fake: FakeRetainDB) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
        payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
        assert payload is not None
        await T(p.apply_write, stored(payload))  # what the job queue stores
    recall_a = await T(p.prefetch, "what do I love?", ctx(home, "telegram:1"))
    recall_b = await T(p.prefetch, "what do I keep?", ctx(home, "telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    writes = fake.writes()
    assert [(r.path, r.body["project"], r.body["user_id"], r.body["session_id"]) for r in writes] == [
        ("/v1/memory/ingest/session", "proj", "telegram:1", "s1"),
        ("/v1/memory/ingest/session", "proj", "telegram:2", "s1"),
    ]
    assert "bees" not in json.dumps(writes[0].body) and "sailing" not in json.dumps(writes[1].body)
    searches = [r for r in fake.requests if r.path == "/v1/memory/search"]
    assert [r.body["user_id"] for r in searches] == ["telegram:1", "telegram:2"]
    assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in fake.requests)
    assert (
        writes[0].body["metadata"]["mnemo_key"]
        == p.prepare_write(SyncTurn("I love sailing", "noted"), ctx(home, "telegram:1")).key
    )


async def test_no_speaker_means_no_scope_no_request(home: Path, fake: FakeRetainDB) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    assert json.loads(await T(p.handle_tool_call, "retaindb_profile", {}, ctx(home, None)))["ok"] is False
    assert fake.requests == []


async def test_memory_mirror_session_end_and_pre_compress(home: Path, fake: FakeRetainDB) -> None:
    from types import SimpleNamespace

    p = provider(home, fake)
    mine = SimpleNamespace(content="prefers green tea", owner=UserRef.parse("telegram:1"))
    theirs = SimpleNamespace(content="secret of user 2", owner=UserRef.parse("telegram:2"))
    removal = SimpleNamespace(content=None, owner=None)
    assert MirrorWrite.of(theirs, ctx(home)) is None
    assert MirrorWrite.of(removal, ctx(home)) is None
    await T(p.apply_write, stored(p.prepare_write(MirrorWrite.of(mine, ctx(home)), ctx(home))))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "I moved to Oslo"}]},
        {"role": "assistant", "content": "nice"},
        {"role": "tool", "content": "ignored"},
    ]
    for op in (SessionEnd.of(messages), PreCompress.of(messages)):
        await T(p.apply_write, stored(p.prepare_write(op, ctx(home))))
    assert SessionEnd.of([{"role": "user", "content": " "}]) is None
    w = fake.writes()
    assert (
        w[0].path == "/v1/memory"
        and w[0].body["content"] == "prefers green tea"
        and w[0].body["user_id"] == "telegram:1"
    )
    assert [r.body["metadata"]["mnemo_op"] for r in w[1:]] == ["session_end", "pre_compress"]
    assert w[1].body["messages"] == [
        {"role": "user", "content": "I moved to Oslo"},
        {"role": "assistant", "content": "nice"},
    ]


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeRetainDB) -> None:
    p = provider(home, fake)
    assert {t.name for t in p.get_tool_schemas()} == {
        "retaindb_profile",
        "retaindb_search",
        "retaindb_remember",
    }
    assert json.loads(
        await T(p.handle_tool_call, "retaindb_remember", {"content": "prefers tea"}, ctx(home, "telegram:1"))
    )["ok"]
    assert json.loads(
        await T(p.handle_tool_call, "retaindb_search", {"query": "tea"}, ctx(home, "telegram:2"))
    ) == {"ok": True, "results": []}
    assert json.loads(
        await T(p.handle_tool_call, "retaindb_search", {"query": "tea"}, ctx(home, "telegram:1"))
    )["results"] == ["prefers tea"]
    assert json.loads(await T(p.handle_tool_call, "retaindb_profile", {}, ctx(home, "telegram:1")))[
        "memories"
    ] == ["prefers tea"]
    assert (
        json.loads(await T(p.handle_tool_call, "retaindb_profile", {}, ctx(home, "telegram:2")))["memories"]
        == []
    )
    profiles = [r for r in fake.requests if r.path.startswith("/v1/memory/profile/")]
    assert [(r.path, r.query["project"]) for r in profiles] == [
        ("/v1/memory/profile/telegram:1", "proj"),
        ("/v1/memory/profile/telegram:2", "proj"),
    ]
    assert (
        json.loads(await T(p.handle_tool_call, "retaindb_search", {"query": " "}, ctx(home)))["ok"] is False
    )


async def test_rate_limit_errors_and_malformed_answers(home: Path, fake: FakeRetainDB) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False
    fake.fail_with(502)
    with pytest.raises(ProviderError, match="502"):
        await T(p.apply_write, payload)
    fake.malformed = True
    with pytest.raises(ProviderError, match="not JSON"):
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    await T(p.apply_write, payload)
    assert p.health.reachable is True
    assert len([r for r in fake.writes() if r.body]) == 3
    assert len(fake.memories[("proj", "telegram:1")]) == 1  # one write stored, the failed ones not
    assert json.loads((home / "providers" / "retaindb" / "status.json").read_text())["reachable"] is True


async def test_wrong_shape_and_slow_answers_are_errors(home: Path, fake: FakeRetainDB) -> None:
    p = provider(home, fake, timeout_s=0.3)
    fake.wrong_shape = True
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.prefetch, "anything", ctx(home))
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.handle_tool_call, "retaindb_profile", {}, ctx(home))
    fake.wrong_shape = False
    fake.hold()
    with pytest.raises(ProviderError, match="timed out"):
        await T(p.prefetch, "anything", ctx(home))
    fake.release()
    assert p.health.reachable is False and "timed out" in p.health.last_error


async def _say_and_wait(adapter: LoopbackAdapter, texts: list[tuple[str, str]]) -> None:
    for i, (user, text) in enumerate(texts, 1):
        await adapter.say(text, user=user)
        await adapter.wait_sent(i)


async def test_e2e_two_users_provider_down_writes_arrive_once_later(
    app_factory, home: Path, fake: FakeRetainDB, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    RetainDBProvider().save_config(
        {"api_key": KEY, "base_url": fake.base_url, "project": "proj", "timeout_s": 2.0}, home
    )
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    async with app_factory(adapter, **{"memory.provider": "retaindb"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while RetainDB is down
        assert (await app.gateway.health())["provider"] == "degraded"
        await app.providers.pending()
        await app.jobs.wait_idle()
        jobs = list(await app.jobs.jobs(kind="provider_write"))
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert not fake.memories  # nothing stored while down
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        delivered = [
            r
            for r in fake.writes()
            if r.body and "messages" in r.body and "unavailable" not in json.dumps(r.body)
        ]
        assert sorted(len(v) for v in fake.memories.values()) == [1, 2]
        assert [m["content"] for m in fake.memories[("proj", "loop:bob")]] == ["bob collects old maps"]
        assert all("bob" not in m["content"] for m in fake.memories[("proj", "loop:alice")])
        for r in delivered:
            other = "bob" if r.body["user_id"] == "loop:alice" else "alice"
            assert f"{other} " not in json.dumps(r.body["messages"])
        await app.jobs.wait_idle()
        assert sum(len(v) for v in fake.memories.values()) == 3  # a second drain sends nothing again
        for r in fake.requests:
            if r.path == "/v1/memory/search":
                assert r.body["user_id"] in ("loop:alice", "loop:bob")
        assert (await app.gateway.health())["provider"] == "ok"
