"""Hindsight provider: the real ``hindsight-client`` SDK against a fake Hindsight API on
127.0.0.1, and end to end through the gateway (loopback adapter, Anthropic emulator)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.memory.durable import RetryLater
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import SyncTurn
from mnemo.providers.hindsight import HindsightProvider
from tests.fakes.hindsight_api import FakeHindsight
from tests.providers.writes import stored
from tests.support.loopback import LoopbackAdapter

KEY = "hs-test"
T = asyncio.to_thread


@pytest.fixture
async def fake() -> AsyncIterator[FakeHindsight]:
    f = FakeHindsight(KEY)
    await f.start()
    yield f
    await f.stop()


def ctx(home: Path, user: str | None = "telegram:1", session: str = "s1") -> ProviderContext:
    return ProviderContext(
        session,
        "telegram:group:9",
        "telegram",
        UserRef.parse(user) if user else None,
        AgentContext.PRIMARY,
        home,
    )


def provider(home: Path, fake: FakeHindsight) -> HindsightProvider:
    p = HindsightProvider()
    config = {"api_key": KEY, "base_url": fake.base_url, "bank_prefix": "mnemo", "timeout_s": 5.0}
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


async def test_one_bank_per_user_and_reflect(home: Path, fake: FakeHindsight) -> None:
    p = provider(home, fake)
    try:
        for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
            payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
            await T(p.apply_write, stored(payload))
            await T(p.apply_write, payload)  # a re-sent write replaces itself
        a = await T(p.prefetch, "hobbies?", ctx(home, "telegram:1"))
        b = await T(p.prefetch, "hobbies?", ctx(home, "telegram:2"))
        assert a.count == 1 and "sailing" in a.text and "bees" not in a.text
        assert b.count == 1 and "bees" in b.text and "sailing" not in b.text
        answer = json.loads(
            await T(
                p.handle_tool_call,
                "hindsight_reflect",
                {"query": "what does he like?"},
                ctx(home, "telegram:2"),
            )
        )
        assert "bees" in answer["answer"] and "sailing" not in answer["answer"]
        assert {r.bank for r in fake.requests} == {"mnemo-telegram-1", "mnemo-telegram-2"}
        assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in fake.requests)
        item = fake.retains()[0].body["items"][0]
        first = p.prepare_write(SyncTurn("I love sailing", "noted"), ctx(home, "telegram:1"))
        assert item["document_id"] == first.key and len(fake.banks["mnemo-telegram-1"]) == 1
        assert item["metadata"]["session_id"] == "s1" and item["update_mode"] == "replace"
    finally:
        await T(p.shutdown)


async def test_rate_limit_and_errors(home: Path, fake: FakeHindsight) -> None:
    p = provider(home, fake)
    try:
        payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
        fake.fail_with(429, retry_after="9")
        with pytest.raises(RetryLater) as e:
            await T(p.apply_write, payload)
        assert e.value.retry_after_s == 9.0 and p.health.reachable is False
        fake.fail_with(500)
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
            await T(p.apply_write, payload)
        fake.malformed = True
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
            await T(p.prefetch, "anything at all", ctx(home))
        fake.malformed = False
        await T(p.apply_write, payload)
        assert p.health.reachable is True
        assert p.prepare_write(SyncTurn("x", "y"), ctx(home, None)) is None
    finally:
        await T(p.shutdown)


async def test_e2e_two_users_provider_down_then_back(
    app_factory, home: Path, fake: FakeHindsight, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))
    HindsightProvider().save_config({"api_key": KEY, "base_url": fake.base_url, "timeout_s": 2.0}, home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [("alice", "alice likes kayaking on rivers"), ("bob", "bob collects old maps")]
    async with app_factory(adapter, **{"memory.provider": "hindsight"}) as app:
        for i, (user, text) in enumerate(turns, 1):
            await adapter.say(text, user=user)
            await adapter.wait_sent(i)
        await app.providers.pending()  # the writes of the last turn are enqueued
        await app.jobs.wait_idle()
        assert (await app.gateway.health())["provider"] == "degraded"
        assert [j.state for j in await app.jobs.jobs(kind="provider_write")] == ["queued", "queued"]
        fake.requests.clear()  # the attempts answered 503
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        retains = fake.retains()
        assert sorted(r.bank for r in retains) == ["mnemo-loop-alice", "mnemo-loop-bob"]
        for r in retains:
            other = "bob" if r.bank.endswith("alice") else "alice"
            assert f"{other} " not in json.dumps(r.body)
        assert {r.bank for r in fake.requests} <= {"mnemo-loop-alice", "mnemo-loop-bob"}
        for r in fake.requests:
            if r.path.endswith("/recall"):
                assert r.bank == "mnemo-loop-" + ("alice" if "alice" in r.body["query"] else "bob")
