"""Honcho provider: the real ``honcho-ai`` SDK transport against a fake Honcho v3 API on
127.0.0.1, and end to end through the gateway (loopback adapter, Anthropic emulator,
job queue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.memory.durable import RetryLater
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import MirrorWrite, PreCompress, SessionEnd, SyncTurn
from mnemo.providers.honcho import HonchoProvider
from tests.fakes.honcho_api import FakeHoncho
from tests.providers.writes import stored
from tests.support.loopback import LoopbackAdapter

KEY = "hc-test"
T = asyncio.to_thread


@pytest.fixture
async def fake() -> AsyncIterator[FakeHoncho]:
    f = FakeHoncho(KEY)
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


def provider(home: Path, fake: FakeHoncho, **extra: object) -> HonchoProvider:
    p = HonchoProvider()
    config = {
        "api_key": KEY,
        "base_url": fake.base_url,
        "workspace_id": "ws1",
        "agent_id": "mnemo",
        "timeout_s": 5.0,
    }
    config.update(extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


def _user_paths(fake: FakeHoncho) -> list[str]:
    return [r.path for r in fake.requests if "/peers/" in r.path]


async def test_writes_and_recall_carry_the_speakers_scope_only(home: Path, fake: FakeHoncho) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up: the client is built on first use
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
        payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user, session=f"s-{user}"))
        assert payload is not None
        await T(p.apply_write, stored(payload))  # what the job queue stores
    recall_a = await T(p.prefetch, "what do I like?", ctx(home, "telegram:1", session="s-telegram:1"))
    recall_b = await T(p.prefetch, "what do I like?", ctx(home, "telegram:2", session="s-telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    posts = fake.message_posts()
    assert [r.path for r in posts] == [
        "/v3/workspaces/ws1/sessions/s-telegram:1/messages",
        "/v3/workspaces/ws1/sessions/s-telegram:2/messages",
    ]
    assert [[m["peer_id"] for m in r.body["messages"]] for r in posts] == [
        ["telegram:1", "mnemo"],
        ["telegram:2", "mnemo"],
    ]
    sessions = [r.body for r in fake.requests if r.path == "/v3/workspaces/ws1/sessions"]
    assert [sorted(s["peers"]) for s in sessions] == [["mnemo", "telegram:1"], ["mnemo", "telegram:2"]]
    contexts = [r for r in fake.requests if r.path.endswith("/context")]
    assert [r.path for r in contexts] == [
        "/v3/workspaces/ws1/peers/telegram:1/context",
        "/v3/workspaces/ws1/peers/telegram:2/context",
    ]
    assert all(r.query["search_query"] == "what do I like?" for r in contexts)
    assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in fake.requests)
    assert all(r.path.startswith("/v3/workspaces") for r in fake.requests)
    key = p.prepare_write(
        SyncTurn("I love sailing", "noted"),
        ctx(home, "telegram:1", session="s-telegram:1"),
    ).key
    assert posts[0].body["messages"][0]["metadata"]["mnemo_key"] == key


async def test_workspace_defaults_to_one_per_profile(home: Path, fake: FakeHoncho) -> None:
    p = provider(home, fake, workspace_id="")
    await T(p.prefetch, "hello", ctx(home))
    assert fake.requests[0].path == "/v3/workspaces" and fake.requests[0].body == {"id": f"mnemo-{home.name}"}


async def test_no_speaker_means_no_scope_no_request(home: Path, fake: FakeHoncho) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    assert json.loads(await T(p.handle_tool_call, "honcho_profile", {}, ctx(home, None)))["ok"] is False
    assert fake.requests == []


async def test_rate_limit_server_error_and_malformed_answers(home: Path, fake: FakeHoncho) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    await T(p.prefetch, "warm up", ctx(home))  # workspace, peers, session exist now
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False and "rate" in p.health.last_error.lower()
    fake.fail_with(502)
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
        await T(p.apply_write, payload)
    assert "502" in p.health.last_error or "Server" in p.health.last_error
    fake.malformed = True
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    assert fake.messages == []  # none of the failed attempts stored anything
    await T(p.apply_write, payload)
    assert [m["content"] for m in fake.messages] == ["hello there", "hi"]
    assert p.health.reachable is True
    assert json.loads((home / "providers" / "honcho" / "status.json").read_text())["reachable"] is True


async def test_self_hosted_without_auth(home: Path, monkeypatch) -> None:
    fake = FakeHoncho(api_key=None)
    await fake.start()
    try:
        monkeypatch.delenv("HONCHO_API_KEY", raising=False)
        monkeypatch.setenv("HONCHO_BASE_URL", fake.base_url)
        p = HonchoProvider()
        assert p.is_available(home, {}).ok
        p.initialize(home, {"workspace_id": "self"})
        await T(p.apply_write, p.prepare_write(SyncTurn("I run marathons", "wow"), ctx(home)))
        assert "marathons" in (await T(p.prefetch, "sport?", ctx(home))).text
        assert all("Authorization" not in r.headers for r in fake.requests)
    finally:
        await fake.stop()


async def test_unconfigured_is_unavailable(home: Path, monkeypatch) -> None:
    monkeypatch.delenv("HONCHO_API_KEY", raising=False)
    monkeypatch.delenv("HONCHO_BASE_URL", raising=False)
    a = HonchoProvider().is_available(home, {})
    assert not a.ok and "HONCHO_API_KEY" in a.reason


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeHoncho) -> None:
    p = provider(home, fake)
    names = [t.name for t in p.get_tool_schemas()]
    assert names == ["honcho_profile", "honcho_search", "honcho_context", "honcho_conclude"]
    assert json.loads(
        await T(p.handle_tool_call, "honcho_conclude", {"conclusion": "prefers tea"}, ctx(home, "telegram:1"))
    )["ok"]
    await T(
        p.apply_write,
        p.prepare_write(SyncTurn("tea in the morning", "ok"), ctx(home, "telegram:1")),
    )
    concl = [r.body["conclusions"][0] for r in fake.requests if r.path == "/v3/workspaces/ws1/conclusions"]
    assert [(c["observer_id"], c["observed_id"]) for c in concl] == [("mnemo", "telegram:1")]
    b = ctx(home, "telegram:2")
    assert json.loads(await T(p.handle_tool_call, "honcho_search", {"query": "tea"}, b)) == {
        "ok": True,
        "results": [],
    }
    assert json.loads(await T(p.handle_tool_call, "honcho_profile", {}, b)) == {"ok": True, "card": []}
    assert json.loads(await T(p.handle_tool_call, "honcho_context", {"query": "tea"}, b)) == {
        "ok": True,
        "representation": "",
        "card": [],
    }
    a = ctx(home, "telegram:1")
    assert json.loads(await T(p.handle_tool_call, "honcho_profile", {}, a))["card"] == ["prefers tea"]
    assert json.loads(await T(p.handle_tool_call, "honcho_search", {"query": "tea"}, a))["results"] == [
        "tea in the morning"
    ]
    out = json.loads(await T(p.handle_tool_call, "honcho_context", {}, a))
    assert out["card"] == ["prefers tea"] and "tea in the morning" in out["representation"]
    reads = [r.path for r in fake.requests if r.method == "GET" or r.path.endswith("/search")]
    assert all("/peers/telegram:2/" in x for x in reads[:3]) and all(
        "/peers/telegram:1/" in x for x in reads[3:]
    )


async def test_memory_mirror_session_end_and_pre_compress(home: Path, fake: FakeHoncho) -> None:
    from types import SimpleNamespace

    p = provider(home, fake)
    a = ctx(home, "telegram:1")
    mine = SimpleNamespace(content="likes jazz", owner=UserRef.parse("telegram:1"))
    other = SimpleNamespace(content="secret of user 2", owner=UserRef.parse("telegram:2"))
    removal = SimpleNamespace(content=None, owner=None)
    assert MirrorWrite.of(other, a) is None
    assert MirrorWrite.of(removal, a) is None
    await T(p.apply_write, stored(p.prepare_write(MirrorWrite.of(mine, a), a)))
    assert [(c["observed_id"], c["content"]) for c in fake.conclusions] == [("telegram:1", "likes jazz")]
    msgs = [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "see you"}]
    assert SessionEnd.of([]) is None
    for op in (SessionEnd.of(msgs), PreCompress.of(msgs)):
        await T(p.apply_write, stored(p.prepare_write(op, a)))
    assert [(d["observer"], d["observed"], d["session_id"]) for d in fake.dreams] == [
        ("telegram:1", "telegram:1", "s1")
    ] * 2
    assert p.backup_paths(home) == ()
    fields = {f.key for f in p.get_config_schema()}
    assert {"api_key", "base_url", "workspace_id", "agent_id"} <= fields


async def _say_and_wait(adapter: LoopbackAdapter, texts: list[tuple[str, str]]) -> None:
    for i, (user, text) in enumerate(texts, 1):
        await adapter.say(text, user=user)
        await adapter.wait_sent(i)


async def test_e2e_two_users_provider_down_writes_arrive_once_later(
    app_factory, home: Path, fake: FakeHoncho, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    HonchoProvider().save_config({"api_key": KEY, "base_url": fake.base_url, "timeout_s": 2.0}, home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    async with app_factory(adapter, **{"memory.provider": "honcho"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while Honcho is down
        assert (await app.gateway.health())["provider"] == "degraded"
        await app.providers.pending()
        await app.jobs.wait_idle()  # each write tried once, then parked for the backoff
        jobs = list(await app.jobs.jobs(kind="provider_write"))
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert fake.messages == []  # nothing stored while down
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        users = [m for m in fake.messages if m["peer_id"] != "mnemo"]
        assert sorted(m["peer_id"] for m in users) == ["loop:alice", "loop:alice", "loop:bob"]
        for m in users:
            other = "bob" if m["peer_id"] == "loop:alice" else "alice"
            assert f"{other} " not in m["content"]
        assert len({m["metadata"]["mnemo_key"] for m in users}) == 3
        await app.jobs.wait_idle()  # a second drain sends nothing again
        assert len(fake.message_posts()) == 3
        for r in fake.requests:
            if r.path.endswith("/context"):
                assert r.path.split("/")[5] in ("loop:alice", "loop:bob")
        assert (await app.gateway.health())["provider"] == "ok"
