"""session_search in a large chat (issue 29, item 5): ``ContextRetriever`` leaves out
words found in more than ``common_docs`` messages of the scope when rarer ones are
there, and scores only the newest ``scored_docs`` messages matching the query (bm25
costs microseconds a row: at a million messages that was most of a search). The caps
are small here so that a few dozen messages make a "large" chat; what must hold is what
a user notices: the rare word still finds its message, an all-common query finds the
newest messages holding it, and nothing ever comes from another chat.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database
from mnemo.memory.ranking import ContextRetriever
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import NewMessage, SessionStore

T0 = datetime(2024, 3, 7, 12, 0, tzinfo=UTC)
A, B = "web:dm:alice", "web:dm:bob"
CAPPED = ContextRetriever(common_docs=20, scored_docs=10)
UNCAPPED = ContextRetriever(common_docs=0, scored_docs=0)


async def session(store: SessionStore, chat: str, texts: list[str], day: int) -> list[int]:
    s = await store.create_session(
        chat_key=chat,
        platform="web",
        chat_id=chat,
        thread_id=None,
        user_id="u",
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="p",
        started_at=T0 + timedelta(days=day),
    )
    return await store.append_messages(
        s.id,
        [
            NewMessage(
                "user" if i % 2 == 0 else "assistant", t, created_at=T0 + timedelta(days=day, minutes=i)
            )
            for i, t in enumerate(texts)
        ],
    )


class Chats:
    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = {A: [], B: []}
        self.violin: int = 0


async def fill(db: Database) -> Chats:
    """Chat A: 60 turns about the weather (a common word), one old turn about a violin
    teacher among them, 15 about tulips; chat B: the same words, its own turns."""
    store, chats = SessionStore(db), Chats()
    for day, chat in enumerate((A, B)):
        texts = [f"the weather was grey again, day {n}" for n in range(30)]
        ids = await session(store, chat, ["my violin teacher said the weather suits practice", *texts], day)
        if chat == A:
            chats.violin = ids[0]
        chats.ids[chat] += ids
        texts = [f"tulip bulb number {n} went in, weather permitting" for n in range(15)]
        chats.ids[chat] += await session(
            store, chat, texts + [f"the weather again {n}" for n in range(15)], day + 2
        )
    return chats


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    d = state_database(tmp_path / "state.db")
    await d.open()
    yield d
    await d.close()


async def test_a_rare_word_finds_its_message_beside_a_common_one(db: Database) -> None:
    chats = await fill(db)
    capped, uncapped = SessionSearch(db, retriever=CAPPED), SessionSearch(db, retriever=UNCAPPED)
    for q in ("violin weather", "what did my violin teacher say about the weather?"):
        got = (await capped.search(q, chat_keys=[A], limit=10)).message_ids
        assert got[0] == chats.violin
        assert got[0] == (await uncapped.search(q, chat_keys=[A], limit=10)).message_ids[0]
        assert set(got) <= set(chats.ids[A])


async def test_an_all_common_query_finds_the_newest_messages_holding_it(db: Database) -> None:
    chats = await fill(db)
    got = (await SessionSearch(db, retriever=CAPPED).search("weather", chat_keys=[B], limit=5)).message_ids
    assert got and set(got) <= set(chats.ids[B])
    assert min(got) > max(chats.ids[B]) - 10  # among the chat's last turns


async def test_only_the_newest_matches_are_scored_past_the_cap(db: Database) -> None:
    chats = await fill(db)
    got = (
        await SessionSearch(db, retriever=CAPPED).search("tulip bulb", chat_keys=[A], limit=20)
    ).message_ids
    tulips = [i for i in chats.ids[A] if i in set(got)]
    assert tulips and set(got) <= set(chats.ids[A])
    assert max(got) >= max(i for i in chats.ids[A][31:46])  # the newest tulip turn is found


words = st.sampled_from(["violin", "teacher", "weather", "tulip", "bulb", "grey", "day", "practice", "again"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.lists(words, min_size=1, max_size=4).map(" ".join), limit=st.integers(1, 30))
async def test_the_caps_never_reach_outside_the_chat(db: Database, query: str, limit: int) -> None:
    if not await db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0]):
        await fill(db)
    ids = await db.read(
        lambda c: {
            key: {
                r[0]
                for r in c.execute(
                    "SELECT m.id FROM messages m JOIN chats c ON c.id = m.chat_no WHERE c.chat_key = ?",
                    (key,),
                )
            }
            for key in (A, B)
        }
    )
    search = SessionSearch(db, retriever=CAPPED)
    for key in (A, B):
        result = await search.search(query, chat_keys=[key], limit=limit, around=(3, 3))
        assert result.message_ids and set(result.message_ids) <= ids[key]
        for hit in result.hits:
            around = {t.message_id for t in (*hit.turns_before, *hit.turns_after)}
            assert around <= ids[key]
