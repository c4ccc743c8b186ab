"""Mem0 provider: the real ``mem0ai`` SDK against a fake Mem0 API on 127.0.0.1, and
end to end through the gateway (loopback adapter, Anthropic emulator, job queue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.memory.durable import RetryLater
from mnemo.memory.manager import MemoryManager
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import SyncTurn
from mnemo.providers.mem0 import Mem0Provider
from tests.fakes.mem0_api import FakeMem0
from tests.providers.writes import stored
from tests.support.cli import run_mnemo
from tests.support.loopback import LoopbackAdapter

KEY = "m0-test"
T = asyncio.to_thread


@pytest.fixture
async def fake() -> AsyncIterator[FakeMem0]:
    f = FakeMem0(KEY)
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


def provider(home: Path, fake: FakeMem0, **extra: object) -> Mem0Provider:
    p = Mem0Provider()
    config = {
        "api_key": KEY,
        "base_url": fake.base_url,
        "api": "platform",
        "agent_id": "mnemo",
        "top_k": 5,
        "timeout_s": 5.0,
    }
    config.update(extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


async def test_writes_and_recall_carry_the_speakers_scope_only(home: Path, fake: FakeMem0) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up: the client is built on first use
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
        payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
        assert payload is not None
        await T(p.apply_write, stored(payload))  # what the job queue stores
    recall_a = await T(p.prefetch, "what do I like?", ctx(home, "telegram:1"))
    recall_b = await T(p.prefetch, "what do I like?", ctx(home, "telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    assert fake.requests[0].path == "/v1/ping/"
    adds = fake.writes()
    assert [(r.body["user_id"], r.body["agent_id"], r.body["run_id"]) for r in adds] == [
        ("telegram:1", "mnemo", "s1"),
        ("telegram:2", "mnemo", "s1"),
    ]
    assert all(r.headers["Authorization"] == f"Token {KEY}" for r in fake.requests)
    searches = [r for r in fake.requests if r.path == "/v3/memories/search/"]
    assert [r.body["filters"] for r in searches] == [{"user_id": "telegram:1"}, {"user_id": "telegram:2"}]
    assert all("user_id" not in r.body for r in searches)
    assert (
        adds[0].body["metadata"]["mnemo_key"]
        == p.prepare_write(SyncTurn("I love sailing", "noted"), ctx(home, "telegram:1")).key
    )


async def test_no_speaker_means_no_scope_no_request(home: Path, fake: FakeMem0) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    assert fake.requests == []


async def test_rate_limit_becomes_retry_later_with_the_servers_delay(home: Path, fake: FakeMem0) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    await T(p.prefetch, "warm up", ctx(home))
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False and "rate" in p.health.last_error.lower()
    fake.fail_with(502)
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
        await T(p.apply_write, payload)
    fake.malformed = True
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    await T(p.apply_write, payload)
    assert p.health.reachable is True
    assert json.loads((home / "providers" / "mem0" / "status.json").read_text())["reachable"] is True


async def test_self_hosted_server_has_no_v1_prefix(home: Path, fake: FakeMem0) -> None:
    p = provider(home, fake, api="server")
    await T(p.apply_write, p.prepare_write(SyncTurn("I run marathons", "wow"), ctx(home)))
    assert "marathons" in (await T(p.prefetch, "sport?", ctx(home))).text
    out = json.loads(await T(p.handle_tool_call, "mem0_profile", {}, ctx(home)))
    assert out == {"ok": True, "memories": ["I run marathons", "wow"]}
    assert [r.path for r in fake.requests] == ["/memories", "/search", "/memories"]
    assert fake.requests[1].body["filters"] == {"user_id": "telegram:1"}


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeMem0) -> None:
    p = provider(home, fake)
    assert json.loads(
        await T(p.handle_tool_call, "mem0_conclude", {"conclusion": "prefers tea"}, ctx(home, "telegram:1"))
    )["ok"]
    assert json.loads(
        await T(p.handle_tool_call, "mem0_search", {"query": "tea"}, ctx(home, "telegram:2"))
    ) == {"ok": True, "results": []}
    assert json.loads(await T(p.handle_tool_call, "mem0_profile", {}, ctx(home, "telegram:1")))[
        "memories"
    ] == ["prefers tea"]


async def test_manager_skips_a_failing_provider_and_reports_degraded(home: Path, fake: FakeMem0) -> None:
    p = Mem0Provider()
    manager = MemoryManager(home)
    manager.add_provider(p, {"api_key": KEY, "base_url": fake.base_url, "timeout_s": 5.0})
    await manager.start()
    fake.down = True
    assert await manager.prefetch("what do I like to do on weekends?", ctx(home)) is None
    assert manager.health() == "degraded"
    fake.down = False
    await manager.shutdown()


async def _say_and_wait(adapter: LoopbackAdapter, texts: list[tuple[str, str]]) -> None:
    for i, (user, text) in enumerate(texts, 1):
        await adapter.say(text, user=user)
        await adapter.wait_sent(i)


async def test_e2e_two_users_provider_down_writes_arrive_once_later(
    app_factory, home: Path, fake: FakeMem0, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    Mem0Provider().save_config({"api_key": KEY, "base_url": fake.base_url, "timeout_s": 2.0}, home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    async with app_factory(adapter, **{"memory.provider": "mem0"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while Mem0 is down
        health = await app.gateway.health()
        assert health["provider"] == "degraded"
        await app.providers.pending()  # the writes of the last turn are enqueued
        await app.jobs.wait_idle()  # each write tried once, then parked for the backoff
        jobs = [j for j in await app.jobs.jobs(kind="provider_write")]
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert "3 queued" in await app.jobs.status_line()
        assert not [r for r in fake.writes()]  # nothing stored while down
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        writes = fake.writes()
        assert sorted(r.body["user_id"] for r in writes) == ["loop:alice", "loop:alice", "loop:bob"]
        for r in writes:
            text = json.dumps(r.body["messages"])
            other = "bob" if r.body["user_id"] == "loop:alice" else "alice"
            assert f"{other} " not in text
        # a second drain sends nothing again
        await app.jobs.wait_idle()
        assert len(fake.writes()) == 3
        # recall for bob never carries alice's memories
        for r in fake.requests:
            if r.path == "/v3/memories/search/":
                assert r.body["filters"]["user_id"] in ("loop:alice", "loop:bob")
        assert (await app.gateway.health())["provider"] == "ok"


def _cli(home: Path, *args: str) -> tuple[int, str]:
    p = run_mnemo(home, *args)  # in process, without the host's MEM0_ variables
    return p.returncode, p.stdout


async def test_cli_setup_list_and_status(home: Path, fake: FakeMem0) -> None:
    rc, _ = await T(
        _cli,
        home,
        "providers",
        "setup",
        "mem0",
        "--set",
        f"api_key={KEY}",
        "--set",
        f"base_url={fake.base_url}",
    )
    assert rc == 0
    secrets = home / "providers" / "mem0" / "secrets.json"
    assert secrets.stat().st_mode & 0o777 == 0o600 and KEY in secrets.read_text()
    assert KEY not in (home / "providers" / "mem0" / "config.json").read_text()
    rc, out = await T(_cli, home, "providers", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)["providers"]}
    assert set(rows) >= {
        "holographic",
        "honcho",
        "mem0",
        "hindsight",
        "supermemory",
        "retaindb",
        "byterover",
        "openviking",
    }
    assert rows["mem0"]["installed"] and rows["mem0"]["configured"] and rows["mem0"]["available"]
    assert all(
        rows[n]["installed"]
        for n in ("honcho", "mem0", "hindsight", "supermemory", "retaindb", "byterover", "openviking")
    )
    assert (
        not rows["byterover"]["configured"] and not rows["byterover"]["available"]
    )  # installed, not set up here
    (home / "config.yaml").write_text("memory:\n  provider: mem0\n")
    p = provider(home, fake)
    fake.down = True
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; health says why
        await T(p.prefetch, "hello world", ctx(home))
    rc, out = await T(_cli, home, "providers", "status", "--json")
    body = json.loads(out)
    assert rc == 0 and body["provider"] == "mem0" and body["reachable"] is False
    assert "unavailable" in body["last_error"] and body["queued_writes"] == 0 and body["failed_writes"] == 0


async def test_e2e_a_hanging_provider_is_skipped_within_providers_timeout(
    app_factory, home: Path, fake: FakeMem0
) -> None:
    # The HTTP timeout (120 s) is far beyond the wait for the reply (10 s): only the
    # providers.timeout_s bound lets the reply through.
    Mem0Provider().save_config({"api_key": KEY, "base_url": fake.base_url, "timeout_s": 120.0}, home)
    fake.hold()
    adapter = LoopbackAdapter()
    try:
        async with app_factory(adapter, **{"memory.provider": "mem0", "providers.timeout_s": 0.2}) as app:
            await adapter.say("what did I tell you about my boat?", user="alice")
            sent = await adapter.wait_sent(1)
            assert sent and "Traceback" not in adapter.texts()[0]
            assert app.providers.limits.prefetch_timeout_s == 0.2
            fake.release()
            await app.providers.pending()
    finally:
        fake.release()
