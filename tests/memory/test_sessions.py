"""SessionStore: sessions, messages in order, counters, usage, chains, listing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database
from mnemo.memory.errors import StoreError
from mnemo.memory.sessions import NewMessage, SessionStore, ToolCall, Usage, insert_messages
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
async def db(tmp_path: Path):
    d = state_database(tmp_path / "state.db")
    await d.open()
    yield d
    await d.close()


@pytest.fixture
def store(db: Database) -> SessionStore:
    return SessionStore(db, clock=Clock())


async def new(store: SessionStore, chat_key: str = "telegram:dm:1", **kw):
    args = dict(
        chat_key=chat_key,
        platform="telegram",
        chat_id="1",
        thread_id=None,
        user_id="1",
        agent_context="primary",
        source="chat",
        model="claude-x",
        system_prompt="You are mnemo.",
    )
    args.update(kw)
    return await store.create_session(**args)


async def test_create_and_get_session_round_trips_every_field(store: SessionStore) -> None:
    s = await new(store, thread_id="t9", title="hello")
    got = await store.get_session(s.id)
    assert got == s
    assert (got.chat_key, got.thread_id, got.model, got.system_prompt, got.title) == (
        "telegram:dm:1",
        "t9",
        "claude-x",
        "You are mnemo.",
        "hello",
    )
    assert got.started_at.tzinfo is not None and got.ended_at is None and got.message_count == 0
    assert await store.get_session("nope") is None


async def test_messages_are_appended_atomically_and_loaded_in_order(store: SessionStore) -> None:
    s = await new(store)
    call = ToolCall("tu_1", "memory", {"action": "add", "content": "likes tea"})
    ids = await store.append_messages(
        s.id,
        [
            NewMessage(
                "user", "remember I like tea", author_id="42", author_name="Ann", platform_message_id="m1"
            ),
            NewMessage("assistant", "Saving that.", tool_calls=(call,), finish_reason="tool_use"),
            NewMessage("tool", '{"ok": true}', tool_call_id="tu_1", tool_name="memory", is_error=False),
            NewMessage("assistant", "Done.", finish_reason="end_turn", meta={"flushed": True}),
        ],
    )
    assert ids == sorted(ids) and len(ids) == 4
    msgs = await store.load_messages(s.id)
    assert [m.id for m in msgs] == ids
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[0].author_name == "Ann" and msgs[0].platform_message_id == "m1"
    assert msgs[1].tool_calls == (call,)
    assert msgs[2].tool_call_id == "tu_1" and msgs[2].tool_name == "memory"
    assert msgs[3].meta == {"flushed": True} and msgs[3].finish_reason == "end_turn"
    row = await store.get_session(s.id)
    assert row is not None and row.message_count == 4 and row.tool_call_count == 1


async def test_token_count_is_estimated_when_not_given(store: SessionStore) -> None:
    s = await new(store)
    call = ToolCall("a", "search", {"q": "x"})
    await store.append_messages(
        s.id,
        [
            NewMessage("user", "héllo wörld, 你好"),
            NewMessage("user", "plain ascii text"),
            NewMessage("assistant", "ok", tool_calls=(call,)),
            NewMessage("user", "given", token_count=99),
        ],
    )
    msgs = await store.load_messages(s.id)
    assert msgs[0].token_count == estimate_tokens("héllo wörld, 你好")
    assert msgs[1].token_count == estimate_tokens("plain ascii text")
    assert msgs[2].token_count == estimate_tokens("ok") + estimate_json_tokens([call.to_json()])
    assert msgs[3].token_count == 99


async def test_a_batch_failing_half_way_stores_nothing(store: SessionStore, db: Database) -> None:
    s = await new(store)
    good = SessionStore._message_values(NewMessage("user", "first"), T0)
    bad = ("robot", *good[1:])  # violates the role CHECK constraint
    with pytest.raises(Exception, match="CHECK"):
        await db.write(lambda c: insert_messages(c, s.id, [good, bad]))
    assert await store.load_messages(s.id) == []
    row = await store.get_session(s.id)
    assert row is not None and row.message_count == 0


async def test_appending_to_an_unknown_session_is_a_store_error(store: SessionStore) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        await store.append_messages("missing", [NewMessage("user", "hi")])


def test_new_message_rejects_an_unknown_role() -> None:
    with pytest.raises(ValueError, match="role"):
        NewMessage("system", "x")  # type: ignore[arg-type]  # an unknown role is the point of the test


async def test_created_at_is_injectable_and_naive_times_are_utc(store: SessionStore) -> None:
    s = await new(store, started_at=datetime(2020, 5, 5, 8, 0))
    when = datetime(2021, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    await store.append_messages(s.id, [NewMessage("user", "x", created_at=when)])
    m = (await store.load_messages(s.id))[0]
    assert m.created_at == when and m.created_at.utcoffset() == timedelta(0)
    assert s.started_at == datetime(2020, 5, 5, 8, 0, tzinfo=UTC)


async def test_end_session_keeps_the_first_reason(store: SessionStore) -> None:
    s = await new(store)
    await store.end_session(s.id, "reset")
    first = await store.get_session(s.id)
    await store.end_session(s.id, "compression")
    second = await store.get_session(s.id)
    assert first is not None and second is not None
    assert second.end_reason == "reset" and second.ended_at == first.ended_at and second.is_ended


async def test_active_session_is_the_latest_not_ended_one_of_that_source(store: SessionStore) -> None:
    assert await store.active_session("telegram:dm:1") is None
    a = await new(store)
    b = await new(store)
    cron = await new(store, source="cron", agent_context="cron")
    await new(store, chat_key="telegram:dm:2")
    assert (await store.active_session("telegram:dm:1")).id == b.id  # type: ignore[union-attr]  # None fails the test
    assert (await store.active_session("telegram:dm:1", source="cron")).id == cron.id  # type: ignore[union-attr]  # None fails the test
    await store.end_session(b.id, "reset")
    assert (await store.active_session("telegram:dm:1")).id == a.id  # type: ignore[union-attr]  # None fails the test


async def test_usage_accumulates_per_session(store: SessionStore) -> None:
    s = await new(store)
    await store.add_usage(s.id, Usage(100, 20, 1000, 50, 0.01))
    await store.add_usage(s.id, Usage(input_tokens=5, output_tokens=7, cost_usd=0.002))
    row = await store.get_session(s.id)
    assert row is not None
    assert (row.input_tokens, row.output_tokens, row.cache_read_tokens, row.cache_write_tokens) == (
        105,
        27,
        1000,
        50,
    )
    assert row.estimated_cost_usd == pytest.approx(0.012)


async def test_list_sessions_is_newest_first_and_per_chat(store: SessionStore) -> None:
    ids = [(await new(store)).id for _ in range(3)]
    other = await new(store, chat_key="discord:group:5:9")
    listed = await store.list_sessions("telegram:dm:1")
    assert [s.id for s in listed] == ids[::-1]
    assert [s.id for s in await store.list_sessions("telegram:dm:1", limit=2)] == ids[::-1][:2]
    assert other.id in [s.id for s in await store.list_sessions(None)]


async def test_session_chain_runs_from_root_to_leaf(store: SessionStore) -> None:
    root = await new(store)
    mid = await new(store, parent_session_id=root.id)
    leaf = await new(store, parent_session_id=mid.id)
    assert [s.id for s in await store.session_chain(leaf.id)] == [root.id, mid.id, leaf.id]
    assert [s.id for s in await store.session_chain(root.id)] == [root.id]
    assert await store.session_chain("missing") == []


async def test_a_parent_that_does_not_exist_is_refused(store: SessionStore) -> None:
    with pytest.raises(StoreError, match="parent session"):
        await new(store, parent_session_id="ghost")


async def test_get_messages_returns_rows_in_the_requested_order(store: SessionStore) -> None:
    s = await new(store)
    ids = await store.append_messages(s.id, [NewMessage("user", str(i)) for i in range(3)])
    got = await store.get_messages([ids[2], 999_999, ids[0]])
    assert [m.content for m in got] == ["2", "0"]
    assert await store.get_messages([]) == []
