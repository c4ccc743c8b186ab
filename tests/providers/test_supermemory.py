"""Supermemory provider: the real ``supermemory`` SDK against a fake Supermemory v5 API
on 127.0.0.1, and end to end through the gateway (loopback adapter in a shared room,
Anthropic emulator, job queue)."""

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

from mnemo.gateway.events import ChatType
from mnemo.memory.durable import RetryLater, forget_user
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import MirrorWrite, PreCompress, SessionEnd, SyncTurn
from mnemo.providers.supermemory import SupermemoryProvider
from mnemo.providers.supermemory.client import namespace_for
from tests.fakes.supermemory_api import NAMESPACE_RE, FakeSupermemory
from tests.providers.writes import stored
from tests.support.cli import run_mnemo
from tests.support.loopback import LoopbackAdapter

KEY = "sm-test"
T = asyncio.to_thread
NS1, NS2 = "mnemo:telegram:1", "mnemo:telegram:2"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSupermemory]:
    f = FakeSupermemory(KEY)
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


def provider(home: Path, fake: FakeSupermemory, **extra: object) -> SupermemoryProvider:
    p = SupermemoryProvider()
    config = {"api_key": KEY, "base_url": fake.base_url, "top_k": 5, "timeout_s": 5.0}
    config.update(extra)
    assert p.is_available(home, config).ok
    p.initialize(home, config)
    return p


async def turn(p: SupermemoryProvider, home: Path, user: str, text: str, reply: str = "noted") -> dict:
    payload = p.prepare_write(SyncTurn(text, reply), ctx(home, user))
    assert payload is not None
    write = stored(payload)  # what the job queue stores
    await T(p.apply_write, write)
    return write


# --- settings ------------------------------------------------------------------------
def test_needs_an_api_key_reads_the_environment_and_checks_the_prefix(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUPERMEMORY_API_KEY", raising=False)
    monkeypatch.delenv("SUPERMEMORY_BASE_URL", raising=False)
    assert "SUPERMEMORY_API_KEY" in SupermemoryProvider().is_available(home, {}).reason
    monkeypatch.setenv("SUPERMEMORY_API_KEY", "from-env")
    monkeypatch.setenv("SUPERMEMORY_BASE_URL", "http://127.0.0.1:9/")
    p = SupermemoryProvider()
    assert p.is_available(home, {}).ok
    p.initialize(home, {})
    assert p._client.base_url == "http://127.0.0.1:9"
    p.shutdown()
    bad = p.is_available(home, {"namespace_prefix": "my prefix"})
    assert not bad.ok and "namespace_prefix" in bad.reason
    with pytest.raises(ProviderError, match="namespace_prefix"):
        p.save_config({"namespace_prefix": "a/b"}, home)
    keys = {f.key for f in p.get_config_schema()}
    assert keys == {"api_key", "base_url", "namespace_prefix", "search_mode", "top_k", "timeout_s"}
    assert [f.key for f in p.get_config_schema() if f.secret] == ["api_key"]


@given(st.text(min_size=1, max_size=300), st.sampled_from(["", "mnemo", "team-a_1"]))
def test_namespace_is_always_valid_for_supermemory(user_id: str, prefix: str) -> None:
    ns = namespace_for(prefix, user_id)
    assert NAMESPACE_RE.fullmatch(ns), ns
    assert ns.startswith(f"{prefix}:" if prefix else "")


@given(st.lists(st.text(alphabet="ab.-_:@", min_size=1, max_size=8), min_size=2, max_size=30, unique=True))
def test_distinct_users_never_share_a_namespace(user_ids: list[str]) -> None:
    assert len({namespace_for("mnemo", u) for u in user_ids}) == len(user_ids)


def test_namespaces_read_as_the_user_id_where_supermemory_allows_it() -> None:
    assert namespace_for("mnemo", "telegram:42") == "mnemo:telegram:42"
    assert namespace_for("mnemo", "web:kill9-alice-0001") == "mnemo:web:kill9-alice-0001"
    assert namespace_for("", "discord:7") == "discord:7"
    dotted = namespace_for("mnemo", "web:a.b")
    assert dotted.startswith("mnemo:web:a_b--") and dotted != namespace_for("mnemo", "web:a_b")
    # an id cannot be picked to land in the namespace of an id that had to be hashed
    assert namespace_for("mnemo", dotted.removeprefix("mnemo:")) != dotted
    a, b = "web:" + "x" * 150 + "1", "web:" + "x" * 150 + "2"
    assert namespace_for("mnemo", a) != namespace_for("mnemo", b) and len(namespace_for("mnemo", a)) == 100


# --- scope -----------------------------------------------------------------------------
async def test_writes_and_recall_carry_the_speakers_namespace_only(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    assert fake.requests == []  # nothing at start-up
    first = await turn(p, home, "telegram:1", "I love sailing")
    await turn(p, home, "telegram:2", "I keep bees")
    recall_a = await T(p.prefetch, "what do I love?", ctx(home, "telegram:1"))
    recall_b = await T(p.prefetch, "what do I keep?", ctx(home, "telegram:2"))
    assert "sailing" in recall_a.text and "bees" not in recall_a.text and recall_a.count == 1
    assert "bees" in recall_b.text and "sailing" not in recall_b.text
    writes = fake.writes()
    assert [(r.path, r.body["id"]) for r in writes] == [
        (f"/ns/{NS1}/document", first.key),
        (f"/ns/{NS2}/document", writes[1].body["id"]),
    ]
    assert writes[0].body["content"] == "user: I love sailing\nassistant: noted"
    assert writes[0].body["metadata"] == {
        "mnemo_key": first.key,
        "mnemo_op": "turn",
        "mnemo_session": "s1",
        "mnemo_agent": "mnemo",
    }
    assert "bees" not in json.dumps(writes[0].body) and "sailing" not in json.dumps(writes[1].body)
    searches = [r for r in fake.requests if r.path.endswith("/search")]
    assert [r.namespace for r in searches] == [NS1, NS2]
    assert searches[0].body["searchMode"] == "hybrid" and searches[0].body["limit"] == 5
    assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in fake.requests)


async def test_a_retried_write_is_one_document_on_the_server(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    payload = await turn(p, home, "telegram:1", "I love sailing")
    await T(p.apply_write, payload)  # the answer was lost, the queue sends it again
    assert len(fake.writes()) == 2 and fake.writes()[0].body == fake.writes()[1].body
    assert list(fake.documents[NS1]) == [payload.key] and fake.texts(NS1) == ["I love sailing"]


async def test_no_speaker_means_no_namespace_no_request(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    assert (await T(p.prefetch, "anything", ctx(home, None))).text == ""
    assert p.prepare_write(SyncTurn("a", "b"), ctx(home, None)) is None
    for tool in ("supermemory_profile", "supermemory_search", "supermemory_remember"):
        assert (
            json.loads(await T(p.handle_tool_call, tool, {"query": "x", "content": "y"}, ctx(home, None)))[
                "ok"
            ]
            is False
        )
    assert fake.requests == []


async def test_memory_mirror_session_end_and_pre_compress(home: Path, fake: FakeSupermemory) -> None:
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
    assert [r.namespace for r in w] == [NS1, NS1, NS1]
    assert w[0].body["content"] == "prefers green tea" and w[0].body["metadata"]["mnemo_op"] == "memory"
    assert [r.body["metadata"]["mnemo_op"] for r in w[1:]] == ["session_end", "pre_compress"]
    assert w[1].body["content"] == "user: I moved to Oslo\nassistant: nice"
    # the two transcripts are the same text but separate writes: distinct keys, distinct documents
    assert w[1].body["id"] != w[2].body["id"] and len(fake.documents[NS1]) == 3


async def test_tools_are_scoped_to_the_speaker(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    assert [t.name for t in p.get_tool_schemas()] == [
        "supermemory_profile",
        "supermemory_search",
        "supermemory_remember",
    ]
    assert json.loads(
        await T(
            p.handle_tool_call, "supermemory_remember", {"content": "prefers tea"}, ctx(home, "telegram:1")
        )
    ) == {"ok": True}
    assert json.loads(
        await T(p.handle_tool_call, "supermemory_search", {"query": "tea"}, ctx(home, "telegram:2"))
    ) == {"ok": True, "results": []}
    assert json.loads(
        await T(
            p.handle_tool_call, "supermemory_search", {"query": "tea", "limit": 3}, ctx(home, "telegram:1")
        )
    )["results"] == ["prefers tea"]
    mine = json.loads(await T(p.handle_tool_call, "supermemory_profile", {}, ctx(home, "telegram:1")))
    assert mine == {"ok": True, "static": ["prefers tea"], "dynamic": [], "buckets": {}}
    assert (
        json.loads(await T(p.handle_tool_call, "supermemory_profile", {}, ctx(home, "telegram:2")))["static"]
        == []
    )
    assert [(r.method, r.path) for r in fake.requests] == [
        ("POST", f"/ns/{NS1}/document"),
        ("POST", f"/ns/{NS2}/search"),
        ("POST", f"/ns/{NS1}/search"),
        ("POST", f"/ns/{NS1}/profile"),
        ("POST", f"/ns/{NS2}/profile"),
    ]
    assert fake.requests[2].body["limit"] == 3
    assert (
        json.loads(await T(p.handle_tool_call, "supermemory_search", {"query": " "}, ctx(home)))["ok"]
        is False
    )
    assert (
        json.loads(await T(p.handle_tool_call, "supermemory_remember", {"content": ""}, ctx(home)))["ok"]
        is False
    )
    read_only = ctx(home, agent=AgentContext.SUBAGENT)
    assert (
        json.loads(await T(p.handle_tool_call, "supermemory_remember", {"content": "x"}, read_only))["ok"]
        is False
    )
    assert json.loads(await T(p.handle_tool_call, "nope", {}, ctx(home)))["ok"] is False
    assert len(fake.requests) == 5  # refused calls reach no server


async def test_forget_user_deletes_only_that_users_namespace(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    await turn(p, home, "telegram:1", "I love sailing")
    await turn(p, home, "telegram:2", "I keep bees")
    payload = stored(forget_user("telegram:1"))  # the erasure's write, as the queue stores it
    assert payload.scope.user_id == "telegram:1"
    await T(p.apply_write, payload)
    deletes = [r for r in fake.requests if r.method == "DELETE"]
    assert [r.path for r in deletes] == [f"/ns/{NS1}"]
    assert NS1 not in fake.memories and fake.texts(NS2) == ["I keep bees"]
    await T(
        p.apply_write, stored({"op": "forget_user", "key": "k", "scope": {"user_id": "telegram:1"}})
    )  # already gone: fine
    assert (await T(p.prefetch, "what do I love?", ctx(home, "telegram:1"))).text == ""
    fake.fail_with(503, retry_after="4")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 4.0


# --- faults --------------------------------------------------------------------------
async def test_rate_limits_and_server_errors_are_retried_later(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake)
    payload = p.prepare_write(SyncTurn("hello there", "hi"), ctx(home))
    fake.fail_with(429, retry_after="7")
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s == 7.0
    assert p.health.reachable is False and "429" in p.health.last_error
    fake.fail_with(502)
    with pytest.raises(RetryLater) as e:
        await T(p.apply_write, payload)
    assert e.value.retry_after_s is None
    assert len(fake.writes()) == 2  # the SDK's own retries are off: one request per attempt
    fake.fail_with(401)
    with pytest.raises(ProviderError, match="HTTP 401"):
        await T(p.apply_write, payload)
    await T(p.apply_write, payload)
    assert p.health.reachable is True
    assert fake.texts(NS1) == ["hello there"]  # one write stored, the failed ones not
    assert json.loads((home / "providers" / "supermemory" / "status.json").read_text())["reachable"] is True
    assert KEY not in p.health.last_error


async def test_malformed_wrong_shape_and_slow_answers_are_errors(home: Path, fake: FakeSupermemory) -> None:
    p = provider(home, fake, timeout_s=0.3)
    fake.malformed = True
    with pytest.raises(ProviderError, match="not JSON"):
        await T(p.prefetch, "what now", ctx(home))
    fake.malformed = False
    fake.wrong_shape = True
    with pytest.raises(ProviderError, match="unexpected answer"):
        await T(p.prefetch, "anything", ctx(home))
    with pytest.raises(ProviderError, match="unexpected answer"):
        await T(p.handle_tool_call, "supermemory_profile", {}, ctx(home))
    with pytest.raises(ProviderError, match="unexpected answer"):
        await T(p.apply_write, p.prepare_write(SyncTurn("a", "b"), ctx(home)))
    fake.wrong_shape = False
    fake.hold()
    with pytest.raises(ProviderError, match="timed out"):
        await T(p.prefetch, "anything", ctx(home))
    fake.release()
    assert p.health.reachable is False and "timed out" in p.health.last_error


async def test_an_unreachable_server_is_a_provider_error(home: Path, fake: FakeSupermemory) -> None:
    base_url = fake.base_url
    await fake.stop()
    p = SupermemoryProvider()
    p.initialize(home, {"api_key": KEY, "base_url": base_url, "timeout_s": 2.0})
    with pytest.raises(ProviderError, match="ConnectError"):
        await T(p.prefetch, "anything", ctx(home))


# --- CLI ---------------------------------------------------------------------------
def _cli(home: Path, *args: str) -> tuple[int, str]:
    p = run_mnemo(home, *args)  # in process, without the host's SUPERMEMORY_ variables
    return p.returncode, p.stdout + p.stderr


async def test_cli_setup_list_and_status(home: Path, fake: FakeSupermemory) -> None:
    rc, out = await T(_cli, home, "providers", "setup", "supermemory", "--set", "namespace_prefix=bad prefix")
    assert rc != 0 and "namespace_prefix" in out
    rc, out = await T(
        _cli,
        home,
        "providers",
        "setup",
        "supermemory",
        "--set",
        f"api_key={KEY}",
        "--set",
        f"base_url={fake.base_url}",
    )
    assert rc == 0, out
    secrets = home / "providers" / "supermemory" / "secrets.json"
    assert secrets.stat().st_mode & 0o777 == 0o600 and KEY in secrets.read_text()
    assert KEY not in (home / "providers" / "supermemory" / "config.json").read_text()
    rc, out = await T(_cli, home, "providers", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)["providers"]}
    assert (
        rows["supermemory"]["installed"]
        and rows["supermemory"]["configured"]
        and rows["supermemory"]["available"]
    )
    (home / "config.yaml").write_text("memory:\n  provider: supermemory\n")
    p = provider(home, fake)
    fake.down = True
    with pytest.raises(RetryLater):
        await T(p.prefetch, "hello world", ctx(home))
    rc, out = await T(_cli, home, "providers", "status", "--json")
    body = json.loads(out)
    assert rc == 0 and body["provider"] == "supermemory" and body["reachable"] is False
    assert "503" in body["last_error"] and body["queued_writes"] == 0 and body["failed_writes"] == 0
    assert fake.requests and all(
        r.path.endswith("/search") for r in fake.requests
    )  # the CLI itself sent nothing


# --- end to end ----------------------------------------------------------------------
_FENCE = re.compile(r"<memory-context>.*?</memory-context>", re.S)


async def _say_and_wait(adapter: LoopbackAdapter, texts: list[tuple[str, str]], start: int = 0) -> None:
    for i, (user, text) in enumerate(texts, start + 1):
        await adapter.say(text, user=user, chat="room", chat_type=ChatType.GROUP)
        await adapter.wait_sent(i)


async def test_e2e_shared_room_provider_down_writes_arrive_once_later(
    app_factory, emulator, home: Path, fake: FakeSupermemory, monkeypatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes

    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))  # no retry until we say so
    SupermemoryProvider().save_config({"api_key": KEY, "base_url": fake.base_url, "timeout_s": 2.0}, home)
    fake.down = True
    adapter = LoopbackAdapter()
    turns = [
        ("alice", "alice likes kayaking on rivers"),
        ("bob", "bob collects old maps"),
        ("alice", "alice asks about weekend plans"),
    ]
    alice, bob = "mnemo:loop:alice", "mnemo:loop:bob"
    async with app_factory(adapter, **{"memory.provider": "supermemory"}) as app:
        await _say_and_wait(adapter, turns)
        assert len(adapter.texts()) == 3  # every message answered while Supermemory is down
        assert (await app.gateway.health())["provider"] == "degraded"
        await app.providers.pending()
        await app.jobs.wait_idle()
        jobs = list(await app.jobs.jobs(kind="provider_write"))
        assert len(jobs) == 3 and all(j.state == "queued" and j.attempts == 1 for j in jobs)
        assert not fake.memories  # nothing stored while down
        sent_while_down = len(fake.writes())
        fake.down = False
        await app.db.write(
            lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        )
        app.jobs.wake()
        await app.jobs.wait_idle()
        assert fake.texts(bob) == ["bob collects old maps"]
        assert sorted(fake.texts(alice)) == [
            "alice asks about weekend plans",
            "alice likes kayaking on rivers",
        ]
        assert all(j.state == "done" for j in await app.jobs.jobs(kind="provider_write"))
        await app.jobs.wait_idle()
        assert len(fake.writes()) - sent_while_down == 3  # each write sent once after recovery, none again
        assert sum(len(v) for v in fake.documents.values()) == 3
        # the room is shared, the memories are not: bob's recall holds nothing of alice's
        await _say_and_wait(adapter, [("bob", "bob wonders which maps he owns")], start=3)
        await app.providers.pending()
        fenced = _FENCE.findall(json.dumps(emulator.requests[-1].body, ensure_ascii=False))
        assert fenced and "old maps" in fenced[0] and "kayaking" not in fenced[0]
    for r in fake.requests:
        assert r.namespace in (alice, bob)
        other = "bob" if r.namespace == alice else "alice"
        if r.path.endswith("/document"):
            assert f"{other} " not in r.body["content"]
    assert [r.namespace for r in fake.requests if r.path.endswith("/search")][-1] == bob


# --- kill -9 -------------------------------------------------------------------------
def _env(home: Path, emulator_url: str, fake: FakeSupermemory) -> dict[str, str]:
    import os

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_", "SUPERMEMORY_"))
    }
    env.update(
        MNEMO_HOME=str(home),
        ANTHROPIC_BASE_URL=emulator_url,
        ANTHROPIC_API_KEY="test-key",
        MNEMO_LOG_LEVEL="warning",
        SUPERMEMORY_API_KEY=KEY,
        SUPERMEMORY_BASE_URL=fake.base_url,
    )
    return env


def _write_jobs(home: Path) -> list[tuple[str, int]]:
    import sqlite3

    with sqlite3.connect(home / "state.db") as db:
        return db.execute("SELECT state, attempts FROM jobs WHERE kind = 'provider_write'").fetchall()


async def _until(check, what: str, timeout: float = 60.0) -> None:
    """Poll ``check`` (sync) off the event loop, so the fake keeps answering."""
    try:
        async with asyncio.timeout(timeout):
            while not await asyncio.to_thread(check):
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what}") from None


@pytest.mark.slow
async def test_kill_9_while_a_write_is_in_flight_then_restart_stores_it_once(
    tmp_path: Path, fake: FakeSupermemory
) -> None:
    import signal
    import subprocess
    import sys

    from mnemo.gateway.emulator import Emulator, Reply

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("memory:\n  provider: supermemory\n")
    chat = [sys.executable, "-m", "mnemo", "chat", "--user", "alice"]
    fake.hold("/document")  # the turn's write reaches Supermemory; its answer never comes back
    async with Emulator(responder=lambda request: Reply(text="kayaking sounds fun")) as emu:
        env = _env(home, emu.base_url, fake)
        first = await asyncio.create_subprocess_exec(
            *chat, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        assert first.stdin is not None
        first.stdin.write(b"alice likes kayaking on rivers\n")
        await first.stdin.drain()

        await _until(lambda: bool(fake.writes()), "the turn's write")
        first.send_signal(signal.SIGKILL)
        await first.wait()
        fake.release()  # the server finishes the request of the dead client
        await _until(lambda: bool(fake.memories), "the server storing it")
        assert _write_jobs(home) == [("running", 1)]

        second = await asyncio.create_subprocess_exec(
            *chat, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )

        try:
            await _until(lambda: _write_jobs(home) == [("done", 2)], "the restarted write")
        finally:
            assert second.stdin is not None
            second.stdin.close()
            _, err = await asyncio.wait_for(second.communicate(), 90)
        assert second.returncode == 0, err.decode()
    ns = "mnemo:cli:alice"
    writes = fake.writes()
    assert len(writes) == 2 and writes[0].body == writes[1].body  # sent again after the crash, same id
    assert list(fake.documents) == [ns] and len(fake.documents[ns]) == 1
    assert fake.texts(ns) == ["alice likes kayaking on rivers"]  # stored once
