"""OpenViking provider: the real ``openviking-sdk`` HTTP SDK against a fake OpenViking
server on 127.0.0.1, and end to end through the gateway (loopback adapter, Anthropic
emulator, job queue)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnemo.memory.durable import RetryLater, forget_user
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import ProviderContext
from mnemo.memory.provider_scope import ProviderScope
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import MirrorWrite, PreCompress, SessionEnd, SyncTurn
from mnemo.providers.openviking import OpenVikingProvider
from mnemo.providers.openviking.client import tenant_user
from tests.fakes.openviking_api import FakeOpenViking
from tests.providers.writes import stored
from tests.support.loopback import LoopbackAdapter

KEY = "ov-root"
T = asyncio.to_thread
U1, U2 = "telegram_1", "telegram_2"  # telegram:1 and telegram:2 as OpenViking users


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenViking]:
    f = FakeOpenViking(KEY)
    await f.start()
    yield f
    await f.stop()


def ctx(
    home: Path,
    user: str | None = "telegram:1",
    session: str = "s1",
    agent: AgentContext = AgentContext.PRIMARY,
) -> ProviderContext:
    return ProviderContext(
        session_id=session,
        chat_key="telegram:group:9",
        platform="telegram",
        user=UserRef.parse(user) if user else None,
        agent_context=agent,
        home=home,
    )


def settings(fake: FakeOpenViking, **extra: object) -> dict[str, object]:
    config: dict[str, object] = {
        "api_key": KEY,
        "base_url": fake.base_url,
        "account": "acct",
        "agent_id": "bot",
        "timeout_s": 5.0,
    }
    config.update(extra)
    return config


def provider(home: Path, fake: FakeOpenViking, **extra: object) -> OpenVikingProvider:
    p = OpenVikingProvider()
    config = settings(fake, **extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


def tenants(fake: FakeOpenViking, path_end: str = "") -> list[tuple[str, str, str]]:
    return [
        (
            r.headers["X-OpenViking-Account"],
            r.headers["X-OpenViking-User"],
            r.headers["X-OpenViking-Actor-Peer"],
        )
        for r in fake.requests
        if r.path.endswith(path_end)
    ]


def test_tenant_users_are_uri_safe_and_distinct() -> None:
    def of(user: str) -> str:
        return tenant_user(ProviderScope(user, "s", "a"))

    assert of("telegram:42") == "telegram_42"
    assert of("web:a_b") == "web_a_5fb" and of("web:a:b") == "web_a_3ab" and of("web:a-b") == "web_a-b"
    ids = ("web:a_b", "web:a:b", "web:a_5fb", "web:a-b", "web_a:b", "weba:b", "web:5fa:3ab", "x-web:1", "web")
    assert len({of(u) for u in ids}) == len(ids)
    assert of("web_a:b").startswith("x-")


USER_IDS = st.one_of(
    st.builds(
        lambda p, i: f"{p}:{i}",
        st.sampled_from(["telegram", "discord", "web", "loop", "x"]),
        st.text(min_size=1, max_size=20),
    ),
    st.text(min_size=1, max_size=30),
    st.text(alphabet=":_-a", min_size=40, max_size=128),  # long once escaped
)


@given(st.lists(USER_IDS, min_size=2, max_size=6, unique=True))
def test_tenant_users_never_collide_and_are_uri_safe(user_ids: list[str]) -> None:
    tenants = [tenant_user(ProviderScope(u, "s", "a")) for u in user_ids]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", t) for t in tenants)
    assert all(len(t) <= 128 for t in tenants)
    assert len(set(tenants)) == len(user_ids)


def test_needs_a_key_and_reads_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENVIKING_API_KEY", raising=False)
    assert "OPENVIKING_API_KEY" in OpenVikingProvider().is_available(home, {}).reason
    monkeypatch.setenv("OPENVIKING_API_KEY", "from-env")
    monkeypatch.setenv("OPENVIKING_BASE_URL", "http://127.0.0.1:9/")
    p = OpenVikingProvider()
    assert p.is_available(home, {}).ok
    p.initialize(home, {})
    assert (
        p._client.api_key == "from-env"
        and p._client.base_url == "http://127.0.0.1:9"
        and p._client.account == "mnemo"
    )
    assert {f.key for f in p.get_config_schema()} >= {"api_key", "base_url", "account", "agent_id"}


async def test_writes_and_recall_carry_the_speakers_scope_only(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
        payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
        assert payload is not None
        await T(p.apply_write, stored(payload))  # what the job queue stores
        end = p.prepare_write(SessionEnd.of([{"role": "user", "content": text}]), ctx(home, user))
        await T(p.apply_write, stored(end))
    recall_a = await T(p.prefetch, "what do I love?", ctx(home, "telegram:1"))
    recall_b = await T(p.prefetch, "what do I keep?", ctx(home, "telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text and recall_a.count == 1
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    assert list(fake.memories("acct", U1).values()) == ["I love sailing"]
    assert list(fake.memories("acct", U2).values()) == ["I keep bees"]
    batches = [r for r in fake.requests if r.path.endswith("/messages/batch")]
    assert [(r.path, r.headers["X-OpenViking-User"]) for r in batches] == [
        ("/api/v1/sessions/s1/messages/batch", U1),
        ("/api/v1/sessions/s1/messages/batch", U2),
    ]
    assert batches[0].body["messages"][0] == {
        "role": "user",
        "content": "I love sailing",
        "turn_id": payload_key(p, home),
    }
    assert "bees" not in json.dumps(batches[0].body) and "sailing" not in json.dumps(batches[1].body)
    finds = [r for r in fake.requests if r.path == "/api/v1/search/find"]
    assert [(r.headers["X-OpenViking-User"], r.body["target_uri"]) for r in finds] == [
        (U1, "viking://user/memories"),
        (U2, "viking://user/memories"),
    ]
    assert {t[0] for t in tenants(fake)} == {"acct"} and {t[2] for t in tenants(fake)} == {"bot"}
    assert all(r.headers["X-API-Key"] == KEY for r in fake.requests)


def payload_key(p: OpenVikingProvider, home: Path) -> str:
    payload = p.prepare_write(SyncTurn("I love sailing", "noted"), ctx(home, "telegram:1"))
    assert payload is not None
    return str(payload.key)


async def test_memories_outside_the_speakers_space_are_dropped(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    await T(p.handle_tool_call, "openviking_remember", {"content": "I love sailing"}, ctx(home, "telegram:1"))
    await T(
        p.handle_tool_call,
        "openviking_remember",
        {"content": "my secret pin is 4321"},
        ctx(home, "telegram:2"),
    )
    fake.leak = True
    recall = await T(p.prefetch, "sailing", ctx(home, "telegram:1"))
    assert (
        "sailing" in recall.text
        and "4321" not in recall.text
        and "resource" not in recall.text
        and "without" not in recall.text
    )
    out = json.loads(
        await T(p.handle_tool_call, "openviking_search", {"query": "pin"}, ctx(home, "telegram:1"))
    )
    assert out["results"] == ["I love sailing"]


async def test_no_speaker_means_no_scope_no_request(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    for tool in ("openviking_profile", "openviking_search", "openviking_remember"):
        assert (
            json.loads(await T(p.handle_tool_call, tool, {"query": "x", "content": "y"}, ctx(home, None)))[
                "ok"
            ]
            is False
        )
    assert fake.requests == []


async def test_memory_mirror_session_end_and_pre_compress(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    mine = SimpleNamespace(content="prefers green tea", owner=UserRef.parse("telegram:1"))
    theirs = SimpleNamespace(content="secret of user 2", owner=UserRef.parse("telegram:2"))
    removal = SimpleNamespace(content=None, owner=None)
    assert MirrorWrite.of(theirs, ctx(home)) is None
    assert MirrorWrite.of(removal, ctx(home)) is None
    mirror = stored(p.prepare_write(MirrorWrite.of(mine, ctx(home)), ctx(home)))
    await T(p.apply_write, mirror)
    await T(p.apply_write, mirror)  # sent again (an answer lost): the same file, once
    assert fake.memories("acct", U1) == {f"viking://user/memories/mnemo/{mirror.key}.md": "prefers green tea"}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "I moved to Oslo"}]},
        {"role": "assistant", "content": "nice"},
        {"role": "tool", "content": "ignored"},
    ]
    await T(p.apply_write, p.prepare_write(SyncTurn("I moved to Oslo", "nice"), ctx(home)))
    await T(p.apply_write, stored(p.prepare_write(PreCompress.of(messages), ctx(home))))
    assert (
        "I moved to Oslo" in fake.memories("acct", U1).values()
    )  # extracted by the commit before compression
    await T(p.apply_write, p.prepare_write(SyncTurn("I work as a nurse", "ok"), ctx(home)))
    await T(p.apply_write, stored(p.prepare_write(SessionEnd.of(messages), ctx(home))))
    assert "I work as a nurse" in fake.memories("acct", U1).values()
    assert SessionEnd.of([{"role": "user", "content": " "}]) is None
    commits = [r for r in fake.requests if r.path.endswith("/commit")]
    assert [(r.path, r.headers["X-OpenViking-User"]) for r in commits] == [
        ("/api/v1/sessions/s1/commit", U1)
    ] * 2
    assert fake.memories("acct", U2) == {}


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    assert {t.name for t in p.get_tool_schemas()} == {
        "openviking_profile",
        "openviking_search",
        "openviking_remember",
    }
    assert json.loads(
        await T(
            p.handle_tool_call, "openviking_remember", {"content": "prefers tea"}, ctx(home, "telegram:1")
        )
    )["ok"]
    assert json.loads(
        await T(p.handle_tool_call, "openviking_search", {"query": "tea"}, ctx(home, "telegram:2"))
    ) == {"ok": True, "results": []}
    assert json.loads(
        await T(p.handle_tool_call, "openviking_search", {"query": "tea"}, ctx(home, "telegram:1"))
    )["results"] == ["prefers tea"]
    fake.files[("acct", U1)]["viking://user/memories/profile.md"] = "Sailor from Oslo."
    assert (
        json.loads(await T(p.handle_tool_call, "openviking_profile", {}, ctx(home, "telegram:1")))["profile"]
        == "Sailor from Oslo."
    )
    assert (
        json.loads(await T(p.handle_tool_call, "openviking_profile", {}, ctx(home, "telegram:2")))["profile"]
        == ""
    )
    reads = [
        (r.query["uri"], r.headers["X-OpenViking-User"])
        for r in fake.requests
        if r.path == "/api/v1/content/read"
    ]
    assert reads == [("viking://user/memories/profile.md", U1), ("viking://user/memories/profile.md", U2)]
    assert (
        json.loads(await T(p.handle_tool_call, "openviking_search", {"query": " "}, ctx(home)))["ok"] is False
    )
    sub = ctx(home, "telegram:1", agent=AgentContext.SUBAGENT)
    assert (
        json.loads(await T(p.handle_tool_call, "openviking_remember", {"content": "x"}, sub))["ok"] is False
    )


async def test_forget_user_deletes_that_users_memories_and_sessions_only(
    home: Path, fake: FakeOpenViking
) -> None:
    p = provider(home, fake)
    for user in ("telegram:1", "telegram:2"):
        await T(p.handle_tool_call, "openviking_remember", {"content": f"{user} likes tea"}, ctx(home, user))
        await T(
            p.apply_write,
            p.prepare_write(SyncTurn("hello", "hi"), ctx(home, user, session="s7")),
        )
    # the erasure's payload: op forget_user and the scope's user_id (also through the queue's JSON)
    await T(
        p.apply_write,
        stored({"op": "forget_user", "key": "forget-1", "scope": {"user_id": "telegram:1"}}),
    )
    assert fake.memories("acct", U1) == {} and fake.sessions[("acct", U1)] == {}
    assert len(fake.memories("acct", U2)) == 1 and "s7" in fake.sessions[("acct", U2)]
    await T(
        p.apply_write, stored(forget_user("telegram:1"))
    )  # the payload erasure builds, again: nothing left, no error
    with pytest.raises(ValueError, match="no user_id"):
        await T(p.apply_write, stored({"op": "forget_user", "key": "k", "scope": {}}))
    forget_requests = [r for r in fake.requests if r.method == "DELETE"]
    assert {r.headers["X-OpenViking-User"] for r in forget_requests} == {U1}


async def test_rate_limit_errors_and_malformed_answers(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False
    fake.fail_with(503, retry_after="2")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 2.0
    fake.fail_with(502)
    with pytest.raises(ProviderError, match="502"):
        await T(p.apply_write, payload)
    fake.malformed = True
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    await T(p.apply_write, payload)
    assert p.health.reachable is True
    assert len(fake.sessions[("acct", U1)]["s1"]["messages"]) == 2  # stored once, the failed attempts not
    assert json.loads((home / "providers" / "openviking" / "status.json").read_text())["reachable"] is True


async def test_wrong_shape_slow_and_refused_answers_are_errors(home: Path, fake: FakeOpenViking) -> None:
    p = provider(home, fake, timeout_s=0.3)
    fake.wrong_shape = True
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.prefetch, "anything", ctx(home))
    fake.wrong_shape = False
    fake.hold()
    with pytest.raises(ProviderError, match="timed out"):
        await T(p.prefetch, "anything", ctx(home))
    fake.release()
    assert p.health.reachable is False and "timed out" in p.health.last_error
    bad = provider(home, fake, api_key="wrong")
    with pytest.raises(ProviderError, match="UNAUTHENTICATED"):
        await T(bad.prefetch, "anything", ctx(home))


async def _say_and_wait(adapter: LoopbackAdapter, texts: list[tuple[str, str]]) -> None:
    for i, (user, text) in enumerate(texts, 1):
        await adapter.say(text, user=user)
        await adapter.wait_sent(i)


async def test_e2e_two_users_provider_down_writes_arrive_once_later(
    app_factory, home: Path, fake: FakeOpenViking, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    OpenVikingProvider().save_config(settings(fake, timeout_s=2.0), home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    alice, bob = "loop_alice", "loop_bob"
    async with app_factory(adapter, **{"memory.provider": "openviking"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while OpenViking is down
        assert (await app.gateway.health())["provider"] == "degraded"
        await app.providers.pending()
        await app.jobs.wait_idle()
        jobs = list(await app.jobs.jobs(kind="provider_write"))
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert not fake.sessions  # nothing stored while down
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()

        def said(user: str) -> list[str]:
            return [
                m["content"]
                for s in fake.sessions.get(("acct", user), {}).values()
                for m in s["messages"]
                if m["role"] == "user"
            ]

        assert said(bob) == ["bob collects old maps"]
        assert sorted(said(alice)) == ["alice asks about weekend plans", "alice likes kayaking on rivers"]
        await app.jobs.wait_idle()
        assert len(said(alice)) + len(said(bob)) == 3  # a second drain sends nothing again
        for r in fake.requests:
            user = r.headers.get("X-OpenViking-User")
            assert user in (alice, bob)
            if r.body and "messages" in r.body:
                other = "bob" if user == alice else "alice"
                assert f"{other} " not in json.dumps(r.body["messages"])
        assert (await app.gateway.health())["provider"] == "ok"
