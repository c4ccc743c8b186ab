"""Any text is a valid search query: results or a clear error, never an FTS5 syntax error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemo.gateway.storage import state_database
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.ranking import NaiveRetriever, create_baseline_index
from mnemo.memory.search import SessionSearch
from mnemo.memory.search_tool import run_session_search_tool
from mnemo.memory.search_view import ViewSettings
from mnemo.memory.sessions import NewMessage, SessionStore

CHAT = "web:dm:fuzz"
FTS_BITS = [
    '"',
    "'",
    "(",
    ")",
    "*",
    ":",
    "^",
    "-",
    "+",
    "AND",
    "OR",
    "NOT",
    "NEAR",
    "NEAR(",
    "NEAR/3",
    "content:",
    "scope:",
    "{content scope}:",
    "c1",
    "rank",
    "messages_fts",
    "\\",
    ";",
    "--",
    "/*",
    "\x00",
    "🐶",
    "狗",
    "東京",
    "ไทย",
    "é",
    "İ",
    "ß",
    "_",
    "%",
    "@",
    "#",
    "~",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "?",
    "!",
    "$",
    "=",
    "<",
    ">",
    "|",
    "&",
    "dog",
    "adopted",
    " ",
    "\n",
    "\t",
    "\u200b",
    "\ufeff",
    "\ue000",
]
queries = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(FTS_BITS), max_size=25).map("".join),
    st.lists(st.sampled_from(FTS_BITS), max_size=25).map(" ".join),
)
SPECIMENS = [
    '"unbalanced',
    'a "b c" d',
    "(((",
    ")))",
    "NEAR(a b, 3)",
    "a NOT b",
    "NOT",
    "OR OR AND",
    "*",
    "dog*",
    "**x",
    "^start",
    "-minus",
    "content: dog",
    "scope: c1",
    "{content}: x",
    "col:umn",
    "🐶🐱",
    "我的狗",
    "x" * 10_000,
    "我" * 5000,
    'I\'m "quoted" (and) NEAR/2 {braces} [brackets] ^caret -dash *star :colon',
    "\x00\x01",
]


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, SessionSearch, SessionSearch]]:
    loop = asyncio.new_event_loop()
    db = state_database(Path(tmp_path_factory.mktemp("fuzz")) / "state.db")

    async def setup() -> None:
        await db.open()
        store = SessionStore(db)
        s = await store.create_session(
            chat_key=CHAT,
            platform="web",
            chat_id="fuzz",
            thread_id=None,
            user_id="u",
            agent_context="primary",
            source="chat",
            model="m",
            system_prompt="p",
        )
        await store.append_messages(
            s.id,
            [
                NewMessage("user", t)
                for t in (
                    "we adopted a dog",
                    "NEAR the content: scope",
                    "我的狗叫小白",
                    '"quoted" (parens) *stars*',
                    "c1 c2",
                )
            ],
        )
        await db.write(create_baseline_index)

    loop.run_until_complete(setup())
    yield loop, SessionSearch(db), SessionSearch(db, retriever=NaiveRetriever())
    loop.run_until_complete(db.close())
    loop.close()


def check(env: tuple[asyncio.AbstractEventLoop, SessionSearch, SessionSearch], query: str) -> None:
    loop, shipped, naive = env
    for search in (shipped, naive):
        try:
            result = loop.run_until_complete(search.search(query, chat_keys=[CHAT], limit=5))
        except InvalidSearchQuery:
            assert not query.strip()
        else:
            assert len(result.hits) <= 5
    out = loop.run_until_complete(
        run_session_search_tool(
            shipped,
            {"query": query},
            chat_key=CHAT,
            current_session_id=None,
            view=ViewSettings(),
            max_limit=10,
        )
    )
    assert out.is_error == (not query.strip())
    assert out.text and (out.is_error or out.text.startswith("session_search"))


@pytest.mark.parametrize("query", SPECIMENS)
def test_hostile_specimens_are_plain_searches(env, query: str) -> None:
    check(env, query)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries)
def test_any_text_searches_or_fails_clearly(env, query: str) -> None:
    check(env, query)
