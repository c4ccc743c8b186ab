"""SessionRepository + SearchRepository: create/append/load, the active session, and
search scoped to the chats asked for (a chat never finds another chat's messages)."""

from __future__ import annotations

import pytest

from mnemo.memory.errors import InvalidSearchQuery, StoreError
from mnemo.memory.sessions import NewMessage, SessionRow
from tests.contract.conftest import Backend


async def new_session(backend: Backend, chat_key: str, **extra: object) -> SessionRow:
    platform, _, chat_id = chat_key.split(":")
    return await backend.sessions.create_session(
        chat_key=chat_key,
        platform=platform,
        chat_id=chat_id,
        thread_id=None,
        user_id=chat_id,
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="frozen prompt",
        **extra,
    )


async def test_create_append_load_and_end(backend: Backend) -> None:
    s = backend.sessions
    row = await new_session(backend, "telegram:dm:1")
    assert await s.active_session("telegram:dm:1") == row
    ids = await s.append_messages(row.id, [NewMessage("user", "hi"), NewMessage("assistant", "hello")])
    assert len(ids) == 2 and ids[0] < ids[1]
    loaded = await s.load_messages(row.id)
    assert [(m.id, m.role, m.content) for m in loaded] == [
        (ids[0], "user", "hi"),
        (ids[1], "assistant", "hello"),
    ]
    stored = await s.get_session(row.id)
    assert stored is not None and stored.system_prompt == "frozen prompt" and stored.message_count == 2
    await s.end_session(row.id, "reset")
    await s.end_session(row.id, "idle")  # the first reason wins
    ended = await s.get_session(row.id)
    assert ended is not None and ended.end_reason == "reset"
    assert await s.active_session("telegram:dm:1") is None


async def test_an_unknown_parent_is_refused(backend: Backend) -> None:
    with pytest.raises(StoreError):
        await new_session(backend, "telegram:dm:1", parent_session_id="nope")


async def test_search_never_crosses_chats(backend: Backend) -> None:
    mine = await new_session(backend, "telegram:dm:1")
    theirs = await new_session(backend, "telegram:dm:2")
    await backend.sessions.append_messages(mine.id, [NewMessage("user", "we adopted a beagle puppy")])
    await backend.sessions.append_messages(theirs.id, [NewMessage("user", "my beagle puppy is called Rex")])
    found = await backend.search.search("beagle", chat_keys=["telegram:dm:1"], limit=10)
    assert [h.session_id for h in found.hits] == [mine.id]
    both = await backend.search.search(
        "adopting beagle", chat_keys=["telegram:dm:1", "telegram:dm:2"], limit=10
    )
    assert {h.session_id for h in both.hits} == {mine.id, theirs.id}
    none = await backend.search.search("beagle", chat_keys=["telegram:dm:3"], limit=10)
    assert none.hits == ()
    excluded = await backend.search.search(
        "beagle", chat_keys=["telegram:dm:1"], limit=10, exclude_session_ids=[mine.id]
    )
    assert excluded.hits == ()
    with pytest.raises(InvalidSearchQuery):
        await backend.search.search("  ", chat_keys=["telegram:dm:1"], limit=10)


async def test_last_activity_is_the_newest_message_time(backend: Backend) -> None:
    from datetime import UTC, datetime

    row = await new_session(backend, "telegram:dm:1")
    assert await backend.sessions.last_activity(row.id) is None
    old, new = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 3, 1, 12, tzinfo=UTC)
    await backend.sessions.append_messages(
        row.id, [NewMessage("user", "a", created_at=new), NewMessage("assistant", "b", created_at=old)]
    )
    assert await backend.sessions.last_activity(row.id) == new
