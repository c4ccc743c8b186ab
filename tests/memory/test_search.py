"""session_search: scope isolation, ranking features, grouping, and the tool handler."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.fts_query import parse
from mnemo.memory.search import SearchResult, SessionSearch, make_snippet
from mnemo.memory.search_tool import SESSION_SEARCH_TOOL_SCHEMA, SearchToolOutput, run_session_search_tool
from mnemo.memory.search_view import ViewSettings
from mnemo.memory.sessions import NewMessage, SessionStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
async def db(tmp_path: Path):
    d = state_database(tmp_path / "state.db")
    await d.open()
    yield d
    await d.close()


@pytest.fixture
def store(db: Database) -> SessionStore:
    return SessionStore(db)


@pytest.fixture
def search(db: Database) -> SessionSearch:
    return SessionSearch(db)


async def session(
    store: SessionStore,
    chat: str,
    texts: list[str],
    *,
    source: str = "chat",
    day: int = 0,
    authors: tuple[str, str] = ("Ann", "assistant"),
) -> tuple[str, list[int]]:
    s = await store.create_session(
        chat_key=chat,
        platform=chat.split(":")[0],
        chat_id=chat,
        thread_id=None,
        user_id="u",
        agent_context="cron" if source == "cron" else "primary",
        source=source,
        model="m",
        system_prompt="p",
        started_at=T0 + timedelta(days=day),
    )
    msgs = [
        NewMessage("user" if i % 2 == 0 else "assistant", t, author_name=authors[i % 2])
        for i, t in enumerate(texts)
    ]
    return s.id, await store.append_messages(s.id, msgs)


async def test_a_query_never_returns_another_chats_messages(
    store: SessionStore, search: SessionSearch
) -> None:
    _, a_ids = await session(store, "telegram:dm:1", ["my secret password is hunter2", "noted"])
    _, b_ids = await session(store, "telegram:dm:2", ["my secret password is swordfish", "noted"])
    for query in ("secret password", "hunter2", "swordfish", "noted", '"secret password" OR x'):
        from_a = await search.search(query, chat_keys=["telegram:dm:1"], limit=50)
        from_b = await search.search(query, chat_keys=["telegram:dm:2"], limit=50)
        assert set(from_a.message_ids) <= set(a_ids)
        assert set(from_b.message_ids) <= set(b_ids)
    assert (await search.search("swordfish", chat_keys=["telegram:dm:1"], limit=50)).hits == ()
    both = await search.search("password", chat_keys=["telegram:dm:1", "telegram:dm:2"], limit=50)
    assert {a_ids[0], b_ids[0]} <= set(both.message_ids)
    assert (await search.search("password", chat_keys=["telegram:dm:3"], limit=5)).hits == ()
    assert (await search.search("password", chat_keys=[], limit=5)).hits == ()


async def test_hits_are_grouped_by_session_with_dates_authors_and_snippets(
    store: SessionStore, search: SessionSearch
) -> None:
    s1, ids1 = await session(
        store, "web:dm:1", ["we talked about the lighthouse trip", "the lighthouse was lovely"]
    )
    s2, ids2 = await session(store, "web:dm:1", ["another lighthouse story"], day=3)
    result = await search.search("lighthouse", chat_keys=["web:dm:1"], limit=10)
    assert {s.session_id for s in result.sessions} == {s1, s2}
    assert sorted(result.message_ids) == sorted(ids1 + ids2)
    first = next(s for s in result.sessions if s.session_id == s1)
    assert first.started_at == T0 and first.score == first.hits[0].score
    assert [h.author_name for h in first.hits if h.role == "user"] == ["Ann"]
    assert all("lighthouse" in h.snippet for h in result.hits)
    flat_scores = [h.score for h in result.hits]
    assert flat_scores == sorted(flat_scores, reverse=True)


async def test_limit_bounds_the_number_of_messages(store: SessionStore, search: SessionSearch) -> None:
    await session(store, "web:dm:1", [f"pancake recipe number {i}" for i in range(30)])
    assert len((await search.search("pancake", chat_keys=["web:dm:1"], limit=4)).hits) == 4
    assert len((await search.search("pancake", chat_keys=["web:dm:1"], limit=0)).hits) == 1


async def test_the_excluded_session_is_skipped(store: SessionStore, search: SessionSearch) -> None:
    old, old_ids = await session(store, "web:dm:1", ["the quokka photo"])
    current, _ = await session(store, "web:dm:1", ["show me the quokka again"], day=1)
    result = await search.search("quokka", chat_keys=["web:dm:1"], limit=10, exclude_session_ids={current})
    assert result.message_ids == tuple(old_ids)


async def test_cron_sessions_rank_below_conversations(store: SessionStore, search: SessionSearch) -> None:
    _, cron_ids = await session(store, "web:dm:1", ["daily weather report: rain in Oslo"], source="cron")
    _, chat_ids = await session(store, "web:dm:1", ["weather report for today: rain in Oslo"], day=1)
    result = await search.search("weather Oslo", chat_keys=["web:dm:1"], limit=10)
    assert result.message_ids[:2] == (chat_ids[0], cron_ids[0])
    assert result.sessions[1].source == "cron"


async def test_a_repeated_text_is_returned_once_and_from_outside_the_excluded_session(
    store: SessionStore, search: SessionSearch
) -> None:
    _, old = await session(store, "web:dm:1", ["Any news about the zeppelin?"])
    _, older = await session(store, "web:dm:1", ["any news about   the Zeppelin?"], day=1)
    current, _ = await session(store, "web:dm:1", ["Any news about the zeppelin?"], day=2)
    result = await search.search(
        "zeppelin news", chat_keys=["web:dm:1"], limit=5, exclude_session_ids={current}
    )
    assert len(result.hits) == 1 and result.message_ids[0] in (old[0], older[0])


async def test_inflections_and_irregular_forms_match(store: SessionStore, search: SessionSearch) -> None:
    _, ids = await session(
        store, "web:dm:1", ["We adopted a beagle last spring", "ok", "I bought a bicycle", "ok"]
    )
    assert (await search.search("adopting beagles", chat_keys=["web:dm:1"], limit=1)).message_ids == (ids[0],)
    assert (await search.search("buy bicycles", chat_keys=["web:dm:1"], limit=1)).message_ids == (ids[2],)


async def test_a_turn_is_found_through_the_reply_that_restates_it(
    store: SessionStore, search: SessionSearch
) -> None:
    _, ids = await session(
        store,
        "web:dm:1",
        [
            "We brought home a tiny puppy today",
            "Congratulations on the new dog!",
            "what should I cook tonight",
            "pasta",
        ],
    )
    hits = (await search.search("my dog", chat_keys=["web:dm:1"], limit=3)).message_ids
    assert ids[0] in hits  # the user's turn, which never says "dog"


async def test_names_in_the_best_hits_lead_to_related_turns(
    store: SessionStore, search: SessionSearch
) -> None:
    _, ids = await session(store, "web:dm:1", ["I called my sister Clara yesterday", "nice"])
    _, later = await session(store, "web:dm:1", ["Clara just qualified as a lawyer", "great news"], day=5)
    await session(store, "web:dm:1", ["lawyers are expensive", "true"], day=6)
    hits = (await search.search("what does my sister do", chat_keys=["web:dm:1"], limit=4)).message_ids
    assert ids[0] in hits and later[0] in hits


async def test_cjk_text_is_found_by_one_two_and_more_characters(
    store: SessionStore, search: SessionSearch
) -> None:
    _, ids = await session(
        store, "web:dm:1", ["我昨天在东京买了一只小狗", "好的", "今日は京都で抹茶を飲みました", "いいね"]
    )
    for q, want in (
        ("狗", ids[0]),
        ("东京", ids[0]),
        ("买了一只", ids[0]),
        ("京都", ids[2]),
        ("抹茶を飲み", ids[2]),
    ):
        assert want in (await search.search(q, chat_keys=["web:dm:1"], limit=3)).message_ids, q
    assert (await search.search("大阪", chat_keys=["web:dm:1"], limit=3)).hits == ()


async def test_quoted_phrases_rank_the_exact_phrase_first(store: SessionStore, search: SessionSearch) -> None:
    _, ids = await session(
        store, "web:dm:1", ["the red car and the blue house", "x", "the blue car and the red house"]
    )
    result = await search.search('"blue car"', chat_keys=["web:dm:1"], limit=3)
    assert result.message_ids[0] == ids[2]


async def test_an_empty_query_is_a_clear_error(search: SessionSearch) -> None:
    for q in ("", "   \n"):
        with pytest.raises(InvalidSearchQuery, match="empty"):
            await search.search(q, chat_keys=["web:dm:1"], limit=5)


async def test_punctuation_only_queries_return_nothing(store: SessionStore, search: SessionSearch) -> None:
    await session(store, "web:dm:1", ["hello there"])
    assert (await search.search("?!*()", chat_keys=["web:dm:1"], limit=5)).hits == ()


def test_snippet_is_a_window_around_the_first_match() -> None:
    text = "word " * 100 + "the zeppelin landed " + "more " * 100
    snip = make_snippet(text, parse("zeppelin"))
    assert "zeppelin" in snip and snip.startswith("…") and snip.endswith("…") and len(snip) <= 242
    assert make_snippet("short text", parse("zeppelin")) == "short text"


# --- the tool ---------------------------------------------------------------------------------


class FakeDigest:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, SearchResult]] = []

    async def summarize(self, query: str, result: SearchResult) -> str:
        self.calls.append((query, result))
        if self.fail:
            raise RuntimeError("aux model down")
        return f"You talked about {query} {len(result.hits)} times."


async def tool(search: SessionSearch, args: dict, **kw) -> SearchToolOutput:
    params: dict = dict(chat_key="web:dm:1", current_session_id=None, view=ViewSettings(), max_limit=10)
    params.update(kw)
    return await run_session_search_tool(search, args, **params)


def test_the_tool_schema_is_an_anthropic_tool_definition() -> None:
    schema = SESSION_SEARCH_TOOL_SCHEMA
    assert schema["name"] == "session_search" and schema["description"]
    assert schema["input_schema"]["type"] == "object"
    assert schema["input_schema"]["required"] == ["query"]
    # The guidance the model needs to search well.
    assert "keep the names" in schema["description"] and "search again" in schema["description"]


async def test_tool_errors_are_results_not_exceptions(search: SessionSearch) -> None:
    for args in ({}, {"query": ""}, {"query": "  "}, {"query": 5}, {"query": None}):
        out = await tool(search, args)
        assert out.is_error and "query" in out.text
    for bad in ("ten", [1], True):
        out = await tool(search, {"query": "x", "limit": bad})
        assert out.is_error and "limit" in out.text


async def test_without_a_limit_the_budget_is_filled_past_max_limit(
    store: SessionStore, search: SessionSearch
) -> None:
    # max_limit caps what the model asks for; the budget alone decides how many of the
    # best 40 matches fit (20 short matches used to leave most of 2,000 tokens unused).
    for day in range(30):
        await session(store, "web:dm:1", [f"kayak trip number {day}"], day=day)
    out = await tool(search, {"query": "kayak"})
    assert out.view is not None and out.view.shown == 30 > 10  # max_limit=10
    assert out.view.tokens <= ViewSettings().max_tokens


async def test_tool_scopes_to_the_chat_clamps_the_limit_and_skips_the_current_session(
    store: SessionStore, search: SessionSearch
) -> None:
    old, old_ids = await session(store, "web:dm:1", [f"kayak trip {i}" for i in range(20)])
    current, current_ids = await session(store, "web:dm:1", ["kayak again"], day=1)
    _, other_ids = await session(store, "web:dm:2", ["kayak elsewhere"])
    out = await tool(search, {"query": "kayak", "limit": 500}, current_session_id=current)
    assert out.view is not None and out.view.shown == 10  # max_limit
    assert out.view.message_ids <= set(old_ids)
    assert not out.view.message_ids & {*current_ids, *other_ids}
    assert "kayak elsewhere" not in out.text and "kayak again" not in out.text
    asked = await tool(search, {"query": "kayak", "limit": 3}, current_session_id=current)
    assert asked.view is not None and asked.view.shown == 3
    none = await tool(search, {"query": "zeppelin"})
    assert not none.is_error and none.view is None and "no earlier messages matched" in none.text


async def test_a_digest_replaces_the_windows_and_its_failure_falls_back(
    store: SessionStore, search: SessionSearch
) -> None:
    await session(store, "web:dm:1", ["the marathon in Berlin", "well done"])
    ok = FakeDigest()
    out = await tool(search, {"query": "marathon"}, digest=ok)
    query, result = ok.calls[0]
    assert query == "marathon" and result.hits
    assert f"You talked about marathon {len(result.hits)} times." in out.text
    assert "the marathon in Berlin" not in out.text
    failing = FakeDigest(fail=True)
    fallback = await tool(search, {"query": "marathon"}, digest=failing)
    assert "Ann: the marathon in Berlin" in fallback.text
    assert failing.calls  # it was tried
    skipped = FakeDigest()
    await tool(search, {"query": "zeppelin"}, digest=skipped)
    assert skipped.calls == []  # nothing to summarise


async def test_leaving_out_the_scope_filter_for_the_whole_store_changes_no_ranking(
    db: Database, store: SessionStore
) -> None:
    from mnemo.memory.fts_query import Scope
    from mnemo.memory.ranking import ContextRetriever

    await session(
        store, "web:dm:1", ["We adopted a beagle named Biscuit", "lovely dog", "Biscuit hates rain", "ha"]
    )
    chat_no = await db.read(lambda c: c.execute("SELECT id FROM chats").fetchone()[0])
    retriever = ContextRetriever()
    q = parse("what is my dog called")
    scoped = await db.read(lambda c: retriever.retrieve(c, q, Scope((chat_no,)), 10))
    whole = await db.read(lambda c: retriever.retrieve(c, q, Scope((chat_no,), whole_store=True), 10))
    assert scoped and scoped == whole
