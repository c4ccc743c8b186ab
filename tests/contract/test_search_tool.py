"""What session_search shows the model, on every backend: windows of each hit's own
session within the token budget, never a turn of another chat whatever the window, and
the semantic path with the real model (int8 ONNX all-MiniLM-L6-v2, the ``semantic``
extra) — on PostgreSQL without pgvector, the byte-vector fallback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from mnemo.gateway.storage import state_database
from mnemo.memory.ports import SearchRepository, SessionRepository
from mnemo.memory.search import SessionSearch
from mnemo.memory.search_tool import run_session_search_tool
from mnemo.memory.search_view import ViewSettings
from mnemo.memory.semantic import MiniLMEmbedder, SemanticRetriever, embed_pending
from mnemo.memory.sessions import NewMessage, SessionStore

ALICE, BOB = "telegram:dm:alice", "telegram:dm:bob"
WORDS = ["dog", "vet", "Biscuit", "Lisbon", "moved", "pottery", "bowl", "hour", "usually", "trip", "the"]


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()  # the real model: the extra is part of the test install


@dataclass
class Store:
    name: str
    sessions: SessionRepository
    search: SearchRepository  # the word index alone
    semantic: SearchRepository  # fused with the model's vectors
    embed: Callable[[], Awaitable[int]]  # vectors for the messages without one


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, embedder: MiniLMEmbedder
) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield Store(
            "sqlite",
            SessionStore(db),
            SessionSearch(db),
            SessionSearch(db, retriever=SemanticRetriever(embedder)),
            lambda: embed_pending(db, embedder),
        )
        await db.close()
        return
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg import semantic as pg_semantic
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.search import PgSessionSearch
    from mnemo.memory.pg.sessions import PgSessionStore

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=4
    )
    await pg.open()
    yield Store(
        "postgresql",
        PgSessionStore(pg),
        PgSessionSearch(pg),
        PgSessionSearch(pg, vectors=pg_semantic.PgVectors(embedder)),
        lambda: pg_semantic.embed_pending(pg, embedder),
    )
    await pg.close()


async def talk(s: Store, chat: str, turns: list[str], who: str) -> list[int]:
    row = await s.sessions.create_session(
        chat_key=chat,
        platform="telegram",
        chat_id=chat.rsplit(":", 1)[1],
        thread_id=None,
        user_id=who,
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="p",
    )
    return await s.sessions.append_messages(
        row.id,
        [
            NewMessage("user" if i % 2 == 0 else "assistant", t, author_name=who if i % 2 == 0 else None)
            for i, t in enumerate(turns)
        ],
    )


async def ask(search: SearchRepository, query: str, chat: str, view: ViewSettings, **kw: Any):
    return await run_session_search_tool(
        search, {"query": query, **kw}, chat_key=chat, current_session_id=None, view=view, max_limit=20
    )


async def test_windows_merge_in_order_and_fill_the_budget(store: Store) -> None:
    chat = [f"small talk number {i}" for i in range(30)]
    chat[10] = "How long does the walk to the vet take?"
    chat[11] = "Usually about an hour with Biscuit."
    chat[13] = "Biscuit loved the vet, by the way."
    ids = await talk(store, ALICE, chat, "Alice")
    out = await ask(store.search, "Biscuit", ALICE, ViewSettings(before=2, after=2), limit=2)
    assert out.view is not None and not out.is_error
    # Both hits' windows (9-13 and 11-15) merge into one run, each turn once, in order.
    assert out.view.message_ids == set(ids[9:16])
    lines = out.text.splitlines()
    shown = [line for line in lines if line.startswith(("» ", "Alice:", "assistant:"))]
    assert shown == [
        "assistant: small talk number 9",
        "Alice: How long does the walk to the vet take?",  # the question a short answer answers
        "» assistant: Usually about an hour with Biscuit.",
        "Alice: small talk number 12",
        "» assistant: Biscuit loved the vet, by the way.",
        "Alice: small talk number 14",
        "assistant: small talk number 15",
    ]
    assert sum(line.startswith("## conversation of") for line in lines) == 1  # the date once
    # A budget too small for both windows still shows the best hit.
    tiny = await ask(store.search, "Biscuit", ALICE, ViewSettings(max_tokens=80))
    assert tiny.view is not None and tiny.view.shown == 1 and tiny.view.tokens <= 80
    # A larger one shows more of the chat than a smaller one.
    more = [f"Biscuit fact {i}: " + "words " * 30 for i in range(40)]
    await talk(store, ALICE, more, "Alice")
    small = await ask(store.search, "Biscuit fact", ALICE, ViewSettings(max_tokens=600))
    large = await ask(store.search, "Biscuit fact", ALICE, ViewSettings(max_tokens=3000))
    assert small.view and large.view and small.view.shown < large.view.shown
    assert small.view.tokens <= 600 and large.view.tokens <= 3000


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    before=st.integers(0, 6),
    after=st.integers(0, 6),
    budget=st.sampled_from([0, 200, 2000]),
)
def test_no_window_ever_reaches_another_chat(
    store: Store, query: str, before: int, after: int, budget: int
) -> None:
    """Two people talk about the same things; Alice's searches show only her turns,
    whatever the window and the budget."""

    async def check() -> None:
        if not hasattr(store, "ids"):
            alice: list[int] = []
            bob: list[int] = []
            for n in range(3):
                alice += await talk(store, ALICE, [f"{w} {n} Alice" for w in WORDS], "Alice")
                bob += await talk(store, BOB, [f"{w} {n} Bob" for w in reversed(WORDS)], "Bob")
            store.ids = (set(alice), set(bob))  # type: ignore[attr-defined]  # built once per backend
        alice_ids, bob_ids = store.ids  # type: ignore[attr-defined]
        out = await ask(
            store.search, query, ALICE, ViewSettings(max_tokens=budget, before=before, after=after)
        )
        shown = out.view.message_ids if out.view is not None else frozenset()
        assert shown <= alice_ids and not shown & bob_ids
        assert "Bob" not in out.text and not out.is_error

    asyncio.get_event_loop().run_until_complete(check())


async def test_the_real_model_finds_what_shares_no_word_with_the_question(store: Store) -> None:
    ids = await talk(
        store,
        ALICE,
        [
            "We adopted a kitten from the shelter on Friday, we named him Pepper.",
            "That's lovely!",
            "Pepper chewed up my favorite sneakers.",
            "The quarterly report is due next week.",
        ],
        "Alice",
    )
    await talk(store, BOB, ["My cat scratched the sofa again."], "Bob")
    before = await store.semantic.index_status()
    assert before.semantic and before.vectors_pending == 5 and not before.complete
    pending = await ask(store.semantic, "pet animal", ALICE, ViewSettings())
    assert "not in the meaning-based index yet" in pending.text  # the tool says the index is incomplete
    assert await store.embed() == 5
    after = await store.semantic.index_status()
    assert after.complete and after.vectors_pending == 0
    lexical = await store.search.search("pet animal", chat_keys=[ALICE], limit=5)
    fused = await store.semantic.search("pet animal", chat_keys=[ALICE], limit=5)
    assert not lexical.hits  # no word in common
    assert fused.message_ids[0] in (ids[0], ids[2]) and set(fused.message_ids) <= set(ids)
    out = await ask(store.semantic, "pet animal", ALICE, ViewSettings())
    assert "Pepper" in out.text and "sofa" not in out.text and "not in the meaning" not in out.text


async def test_past_a_thousand_matches_the_newest_are_ranked_and_the_chat_kept(store: Store) -> None:
    # A chat far larger than the cap of scored matches (1,000 on both backends: SQLite's
    # ContextRetriever.scored_docs, PostgreSQL's SCORED_ROWS): the matches ranked are the
    # chat's newest, never another chat's even when that one is newer.
    ids = await talk(store, ALICE, [f"kayak trip number {i:04d}" for i in range(1100)], "Alice")
    bob = await talk(store, BOB, [f"kayak trip number {i:04d}" for i in range(20)], "Bob")
    result = await store.search.search("kayak trip", chat_keys=[ALICE], limit=10)
    assert len(result.message_ids) == 10
    assert set(result.message_ids) <= set(ids[99:])  # a hit or the turn before one
    assert not set(result.message_ids) & set(bob)
