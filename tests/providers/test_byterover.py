"""ByteRover provider: the real aiohttp client against a fake ByteRover memory service
on 127.0.0.1, and end to end through the gateway (loopback adapter, Anthropic emulator,
job queue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from mnemo.memory.durable import RetryLater, forget_user
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import MirrorWrite, PreCompress, SessionEnd, SyncTurn
from mnemo.providers.byterover import ByteRoverProvider
from tests.fakes.byterover_api import FakeByteRover
from tests.providers.writes import stored
from tests.support.loopback import LoopbackAdapter

KEY = "brv-test"
T = asyncio.to_thread


@pytest.fixture
async def fake() -> AsyncIterator[FakeByteRover]:
    f = FakeByteRover(KEY, team="team-1", space="space-1")
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


def settings(fake: FakeByteRover, **extra: object) -> dict[str, object]:
    config: dict[str, object] = {
        "api_key": KEY,
        "base_url": fake.base_url,
        "team_id": "team-1",
        "space_id": "space-1",
        "timeout_s": 5.0,
    }
    config.update(extra)
    return config


def provider(home: Path, fake: FakeByteRover, **extra: object) -> ByteRoverProvider:
    p = ByteRoverProvider()
    config = settings(fake, **extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


def test_needs_a_key_and_a_space_and_reads_the_environment(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BYTEROVER_API_KEY", raising=False)
    assert (
        "BYTEROVER_API_KEY"
        in ByteRoverProvider().is_available(home, {"team_id": "t", "space_id": "s"}).reason
    )
    monkeypatch.setenv("BYTEROVER_API_KEY", "from-env")
    monkeypatch.setenv("BYTEROVER_BASE_URL", "http://127.0.0.1:9/api/v1/")
    p = ByteRoverProvider()
    assert "space_id" in p.is_available(home, {"team_id": "t"}).reason
    assert p.is_available(home, {"team_id": "t", "space_id": "s"}).ok
    p.initialize(home, {"team_id": "t", "space_id": "s"})
    assert (
        p._client is not None
        and p._client.api_key == "from-env"
        and p._client.base_url == "http://127.0.0.1:9/api/v1"
    )
    assert {f.key for f in p.get_config_schema()} >= {"api_key", "base_url", "team_id", "space_id"}


async def test_writes_and_recall_carry_the_speakers_scope_only(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "I keep bees")):
        payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
        assert payload is not None
        await T(p.apply_write, stored(payload))  # what the job queue stores
    recall_a = await T(p.prefetch, "what do I love?", ctx(home, "telegram:1"))
    recall_b = await T(p.prefetch, "what do I keep?", ctx(home, "telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text and recall_a.count == 1
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    assert set(fake.user_files("telegram:1")) == {
        f"mnemo/users/telegram:1/turns/{payload_key(p, home, 'telegram:1', 'I love sailing')}.md"
    }
    commits = fake.writes()
    for r in commits:  # every change of a commit lies in its speaker's folder only
        owners = {m["path"].split("/")[2] for m in r.body["memories"]}
        assert len(owners) == 1
        assert ("bees" in json.dumps(r.body)) == (owners == {"telegram:2"})
    retrieves = [r for r in fake.requests if r.path.endswith("/retrieve")]
    assert [(r.query["node_keys"], r.query["project_id"]) for r in retrieves] == [
        ("mnemo/users/telegram:1", "space-1"),
        ("mnemo/users/telegram:2", "space-1"),
    ]
    assert all(
        r.headers["Authorization"] == f"Bearer {KEY}" and r.headers["x-byterover-session-id"] == "s1"
        for r in fake.requests
    )


def payload_key(p: ByteRoverProvider, home: Path, user: str, text: str) -> str:
    payload = p.prepare_write(SyncTurn(text, "noted"), ctx(home, user))
    assert payload is not None
    return str(payload.key)


async def test_a_write_sent_again_lands_on_the_same_file_and_a_stale_sha_is_retried(
    home: Path, fake: FakeByteRover
) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    await T(p.apply_write, payload)
    fake.head = "moved-by-someone-else"
    await T(p.apply_write, payload)  # the queue retried after a lost answer
    assert len(fake.user_files("telegram:1")) == 1
    shas = [r.body["current_sha"] for r in fake.requests if r.path.endswith("/commits")]
    assert shas == ["sha_placeholder", "sha0", "sha1", "moved-by-someone-else"]
    assert [r.body["current_sha"] for r in fake.writes()] == [
        "sha0",
        "moved-by-someone-else",
    ]  # the accepted ones


async def test_answers_from_another_folder_are_dropped(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    for user, text in (("telegram:1", "I love sailing"), ("telegram:2", "my secret pin is 4321")):
        await T(p.apply_write, p.prepare_write(SyncTurn(text, "ok"), ctx(home, user)))
    fake.leak = True
    recall = await T(p.prefetch, "sailing", ctx(home, "telegram:1"))
    assert "sailing" in recall.text and "4321" not in recall.text and "without a path" not in recall.text
    out = json.loads(
        await T(p.handle_tool_call, "byterover_search", {"query": "pin"}, ctx(home, "telegram:1"))
    )
    assert all("4321" not in r for r in out["results"])


async def test_no_speaker_means_no_scope_no_request(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    for tool in ("byterover_profile", "byterover_search", "byterover_remember"):
        assert (
            json.loads(await T(p.handle_tool_call, tool, {"query": "x", "content": "y"}, ctx(home, None)))[
                "ok"
            ]
            is False
        )
    assert fake.requests == []


async def test_memory_mirror_session_end_and_pre_compress(home: Path, fake: FakeByteRover) -> None:
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
    files = fake.user_files("telegram:1")
    facts = [f for path, f in files.items() if "/facts/" in path]
    sessions = sorted((f["title"], f["content"]) for path, f in files.items() if "/sessions/" in path)
    assert [f["content"] for f in facts] == ["prefers green tea"]
    assert sessions == [
        ("Pre-compression context (s1)", "user: I moved to Oslo\nassistant: nice"),
        ("Session summary (s1)", "user: I moved to Oslo\nassistant: nice"),
    ]
    assert not fake.user_files("telegram:2")


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    assert {t.name for t in p.get_tool_schemas()} == {
        "byterover_profile",
        "byterover_search",
        "byterover_remember",
    }
    assert json.loads(
        await T(p.handle_tool_call, "byterover_remember", {"content": "prefers tea"}, ctx(home, "telegram:1"))
    )["ok"]
    assert json.loads(
        await T(p.handle_tool_call, "byterover_search", {"query": "tea"}, ctx(home, "telegram:2"))
    ) == {"ok": True, "results": []}
    assert json.loads(
        await T(p.handle_tool_call, "byterover_search", {"query": "tea"}, ctx(home, "telegram:1"))
    )["results"] == ["prefers tea"]
    assert json.loads(await T(p.handle_tool_call, "byterover_profile", {}, ctx(home, "telegram:1")))[
        "facts"
    ] == ["prefers tea"]
    assert (
        json.loads(await T(p.handle_tool_call, "byterover_profile", {}, ctx(home, "telegram:2")))["facts"]
        == []
    )
    profiles = [r.query["node_keys"] for r in fake.requests if r.path.endswith("/retrieve")][-2:]
    assert profiles == ["mnemo/users/telegram:1/facts", "mnemo/users/telegram:2/facts"]
    assert (
        json.loads(await T(p.handle_tool_call, "byterover_search", {"query": " "}, ctx(home)))["ok"] is False
    )
    sub = ctx(home, "telegram:1", agent=AgentContext.SUBAGENT)
    assert json.loads(await T(p.handle_tool_call, "byterover_remember", {"content": "x"}, sub))["ok"] is False


async def test_forget_user_deletes_that_users_files_only(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    for user in ("telegram:1", "telegram:2"):
        for text in ("likes tea", "lives in Oslo", "plays chess"):
            await T(
                p.apply_write,
                p.prepare_write(SyncTurn(f"{user} {text}", "ok"), ctx(home, user)),
            )
    assert len(fake.user_files("telegram:1")) == 3
    # the erasure's payload: op forget_user and the scope's user_id (also through the queue's JSON)
    await T(
        p.apply_write,
        stored({"op": "forget_user", "key": "forget-1", "scope": {"user_id": "telegram:1"}}),
    )
    assert fake.user_files("telegram:1") == {}
    assert len(fake.user_files("telegram:2")) == 3
    deletes = [m for r in fake.writes() for m in r.body["memories"] if m["operation"] == "delete"]
    assert deletes and all(m["path"].startswith("mnemo/users/telegram:1/") for m in deletes)
    with pytest.raises(ValueError, match="no user_id"):
        await T(p.apply_write, stored({"op": "forget_user", "key": "k", "scope": {}}))
    await T(p.apply_write, stored(forget_user("telegram:2")))  # the payload erasure builds
    assert fake.user_files("telegram:2") == {}


async def test_rate_limit_errors_and_malformed_answers(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False
    fake.fail_with(503)
    with pytest.raises(RetryLater):
        await T(p.apply_write, payload)
    fake.fail_with(502)
    with pytest.raises(ProviderError, match="502"):
        await T(p.apply_write, payload)
    fake.malformed = True
    with pytest.raises(ProviderError, match="not JSON"):
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    await T(p.apply_write, payload)
    assert p.health.reachable is True
    assert len(fake.user_files("telegram:1")) == 1  # stored once, the failed attempts not
    assert json.loads((home / "providers" / "byterover" / "status.json").read_text())["reachable"] is True


async def test_wrong_shape_and_slow_answers_are_errors(home: Path, fake: FakeByteRover) -> None:
    p = provider(home, fake, timeout_s=0.3)
    fake.wrong_shape = True
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.prefetch, "anything", ctx(home))
    with pytest.raises(ProviderError, match="unexpected body"):
        await T(p.handle_tool_call, "byterover_profile", {}, ctx(home))
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
    app_factory, home: Path, fake: FakeByteRover, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    ByteRoverProvider().save_config(settings(fake, timeout_s=2.0), home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    async with app_factory(adapter, **{"memory.provider": "byterover"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while ByteRover is down
        assert (await app.gateway.health())["provider"] == "degraded"
        await app.providers.pending()
        await app.jobs.wait_idle()
        jobs = list(await app.jobs.jobs(kind="provider_write"))
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert not fake.files  # nothing stored while down
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        alice, bob = fake.user_files("loop:alice"), fake.user_files("loop:bob")
        assert (len(alice), len(bob)) == (2, 1)
        assert "bob collects old maps" in next(iter(bob.values()))["content"]
        assert all("bob" not in f["content"] for f in alice.values())
        await app.jobs.wait_idle()
        assert len(fake.files) == 3  # a second drain sends nothing again
        for r in fake.requests:
            if r.path.endswith("/retrieve"):
                assert r.query["node_keys"] in ("mnemo/users/loop:alice", "mnemo/users/loop:bob")
            elif r.body and "memories" in r.body:
                owners = {m["path"].split("/")[2] for m in r.body["memories"]}
                assert len(owners) == 1
                other = "bob" if owners == {"loop:alice"} else "alice"
                assert f"{other} " not in json.dumps(r.body["memories"])
        assert (await app.gateway.health())["provider"] == "ok"
