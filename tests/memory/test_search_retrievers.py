"""Every retriever of session_search: the scope rule, any text as a query, the
contextual index and its background re-indexing of a database from before it, the
participant-aware query, the ±1 window of the tool result, and the semantic path.

The semantic retriever is exercised with ``HashEmbedder`` (a deterministic bag-of-words
embedder) through the same ``Embedder`` interface as MiniLM: the extra (torch,
sentence-transformers) is not part of the test install.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemo.gateway.storage import STATE_MIGRATIONS, state_database
from mnemo.memory.db import Database
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.fts_query import parse
from mnemo.memory.ranking import (
    ContextRetriever,
    FusionRetriever,
    NaiveRetriever,
    Retriever,
    create_baseline_index,
    create_legacy_index,
    participant_words,
    without_names,
)
from mnemo.memory.reindex import SearchMaintenance, pending, reindex_in_background
from mnemo.memory.search import SessionSearch
from mnemo.memory.search_tool import run_session_search_tool
from mnemo.memory.search_view import ViewSettings
from mnemo.memory.semantic import (
    HashEmbedder,
    SemanticRetriever,
    SemanticUnavailable,
    configured_retriever,
    embed_pending,
    load_embedder,
)
from mnemo.memory.sessions import NewMessage, SessionStore

T0 = datetime(2024, 3, 7, 12, 0, tzinfo=UTC)
PRE_0008 = STATE_MIGRATIONS[:7]
A, B = "web:dm:alice", "web:dm:bob"
TEXTS = [
    "I took a pottery class yesterday and made a bowl",
    "That sounds so relaxing, working with clay!",
    "We adopted a puppy called Biscuit",
    "Biscuit chewed my sneakers",
    "Any news since last time?",
    "I moved to Lisbon in the spring",
]


async def fill(store: SessionStore, chat: str, speakers: tuple[str, str], *, day: int = 0) -> list[int]:
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
    msgs = [
        NewMessage("user", t, author_name=speakers[i % 2], created_at=T0 + timedelta(days=day, seconds=i))
        for i, t in enumerate(TEXTS)
    ]
    return await store.append_messages(s.id, msgs)


def retrievers() -> dict[str, Retriever]:
    return {
        "baseline": NaiveRetriever(),
        "fusion": FusionRetriever(),
        "contextual": ContextRetriever(),
        "semantic": SemanticRetriever(HashEmbedder()),
    }


async def prepared(db: Database) -> tuple[list[int], list[int]]:
    store = SessionStore(db)
    ids_a = await fill(store, A, ("Alice", "Carol"))
    ids_b = await fill(store, B, ("Bob", "Dan"), day=3)
    await db.write(create_baseline_index)
    await db.write(create_legacy_index)
    await embed_pending(db, HashEmbedder())
    return ids_a, ids_b


@pytest.fixture
async def db(tmp_path: Path):
    d = state_database(tmp_path / "state.db")
    await d.open()
    yield d
    await d.close()


@pytest.mark.parametrize("name", ["baseline", "fusion", "contextual", "semantic"])
async def test_a_chat_never_finds_another_chats_messages(db: Database, name: str) -> None:
    ids_a, ids_b = await prepared(db)
    search = SessionSearch(db, retriever=retrievers()[name])
    for q in ("pottery bowl", "Biscuit puppy sneakers", "Lisbon", "Bob Dan Alice Lisbon", "news"):
        got_a = (await search.search(q, chat_keys=[A], limit=20)).message_ids
        got_b = (await search.search(q, chat_keys=[B], limit=20)).message_ids
        assert got_a and set(got_a) <= set(ids_a), (name, q)
        assert got_b and set(got_b) <= set(ids_b), (name, q)


async def test_the_semantic_ranking_itself_only_sees_the_scope(db: Database) -> None:
    ids_a, ids_b = await prepared(db)
    retriever = SemanticRetriever(HashEmbedder())
    chat_a = await db.read(lambda c: c.execute("SELECT id FROM chats WHERE chat_key = ?", (A,)).fetchone()[0])
    from mnemo.memory.fts_query import Scope

    ranked = await db.read(
        lambda c: retriever.semantic_ranking(c, parse("pottery bowl clay"), Scope((chat_a,)), 50)
    )
    assert ranked and {i for i, _ in ranked} <= set(ids_a)
    vectors = await db.read(lambda c: c.execute("SELECT count(*) FROM message_vectors").fetchone()[0])
    assert vectors == len(ids_a) + len(ids_b)  # stored in state.db


# --- any text is a query, for every retriever and during re-indexing -----------------------

queries = st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(
    ['"', '" OR "', "content:", "{content context}:", "scope : c1", "NEAR(a b)", "Alice", "*", "context"]
)


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, list[SessionSearch]]]:
    loop = asyncio.new_event_loop()
    fresh = state_database(Path(tmp_path_factory.mktemp("any")) / "state.db")
    old_path = Path(tmp_path_factory.mktemp("old")) / "state.db"

    async def setup() -> Database:
        await fresh.open()
        await prepared(fresh)
        old = Database(old_path, migrations=PRE_0008)
        await old.open()
        await fill(SessionStore(old), A, ("Alice", "Carol"))
        await old.close()
        upgraded = state_database(old_path)
        await upgraded.open()  # re-indexing pending: searches run on the old index
        assert await upgraded.read(pending)
        return upgraded

    upgraded = loop.run_until_complete(setup())
    searches = [SessionSearch(fresh, retriever=r) for r in retrievers().values()]
    searches.append(SessionSearch(upgraded))
    yield loop, searches
    loop.run_until_complete(fresh.close())
    loop.run_until_complete(upgraded.close())
    loop.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries)
def test_any_string_is_a_valid_query_for_every_retriever(env, query: str) -> None:
    loop, searches = env
    for search in searches:
        try:
            result = loop.run_until_complete(search.search(query, chat_keys=[A], limit=5))
        except InvalidSearchQuery:
            assert not query.strip()
        else:
            assert len(result.hits) <= 5


# --- a database from before 0008 --------------------------------------------------------------


async def test_a_database_from_before_the_migration_upgrades_and_answers_while_reindexing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    old = Database(path, migrations=PRE_0008)
    await old.open()
    store = SessionStore(old)
    ids_a = []
    for day in range(30):  # 180 rows: several batches of 50
        ids_a += await fill(store, A, ("Alice", "Carol"), day=day)
    ids_b = await fill(store, B, ("Bob", "Dan"))
    await old.close()

    db = state_database(path)
    await db.open()  # returns without re-indexing anything
    assert db.schema_version == len(STATE_MIGRATIONS)
    assert await db.read(pending)
    assert await db.read(lambda c: c.execute("SELECT count(*) FROM messages_ctx").fetchone()[0]) == 0
    search = SessionSearch(db)
    await embed_pending(db, HashEmbedder())
    semantic = SessionSearch(db, retriever=SemanticRetriever(HashEmbedder()))
    before = await search.search("pottery bowl", chat_keys=[A], limit=10)
    assert before.message_ids and set(before.message_ids) <= set(ids_a)

    # A message written during re-indexing is found too, and stays in its chat.
    new_b = await fill(SessionStore(db), B, ("Bob", "Dan"), day=40)
    steps = []
    done = asyncio.create_task(reindex_in_background(db, batch=50, pause=0, progress=steps.append))
    while not done.done():
        got = await search.search("pottery bowl", chat_keys=[A], limit=10)
        assert got.message_ids and set(got.message_ids) <= set(ids_a)
        got_b = await search.search("Lisbon", chat_keys=[B], limit=10)
        assert got_b.message_ids and set(got_b.message_ids) <= set(ids_b + new_b)
        got_s = await semantic.search("pottery bowl", chat_keys=[A], limit=10)
        assert got_s.message_ids and set(got_s.message_ids) <= set(ids_a)
        await asyncio.sleep(0)
    final = await done
    assert final.finished and len(steps) >= 3
    assert [s.done for s in steps] == sorted(s.done for s in steps)
    assert not await db.read(pending)
    tables = await db.read(lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master")})
    assert "messages_fts" not in tables and "messages_fts_ai" not in tables
    indexed = await db.read(lambda c: c.execute("SELECT count(*) FROM messages_ctx").fetchone()[0])
    assert indexed == len(ids_a) + len(ids_b) + len(new_b)
    await db.write(lambda c: c.execute("INSERT INTO messages_ctx(messages_ctx) VALUES ('integrity-check')"))
    after = await search.search("pottery bowl", chat_keys=[A], limit=10)
    assert after.message_ids and set(after.message_ids) <= set(ids_a)
    speakers = await db.read(lambda c: sorted(r[0] for r in c.execute("SELECT name FROM chat_speakers")))
    assert speakers == ["Alice", "Bob", "Carol", "Dan"]
    await db.close()


async def test_the_app_maintenance_task_reindexes_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = Database(path, migrations=PRE_0008)
    await old.open()
    await fill(SessionStore(old), A, ("Alice", "Carol"))
    await old.close()
    db = state_database(path)
    await db.open()
    maintenance = SearchMaintenance(db, ContextRetriever())
    maintenance.start()
    for _ in range(200):
        if maintenance.progress is not None and maintenance.progress.finished:
            break
        await asyncio.sleep(0.01)
    await maintenance.stop()
    assert maintenance.progress is not None and maintenance.progress.finished
    assert not await db.read(pending)
    await db.close()


# --- what the contextual index and the query cleaning do ---------------------------------------


async def test_each_message_is_indexed_with_speaker_date_and_previous_turn(db: Database) -> None:
    ids_a, _ = await prepared(db)

    def match(expr: str) -> list[int]:
        return db.read(
            lambda c: [
                r[0]
                for r in c.execute(
                    "SELECT rowid FROM messages_ctx WHERE messages_ctx MATCH ? ORDER BY rowid",
                    (f"scope : c1 AND ({expr})",),
                )
            ]
        )

    # The reply about clay carries the pottery turn before it, under its own id.
    assert await match('context : "pottery"') == [ids_a[1]]
    assert await match('content : "pottery"') == [ids_a[0]]
    assert set(await match('context : "carol"')) == {ids_a[1], ids_a[3], ids_a[5]}
    assert await match('context : ("march" AND "2024")') == ids_a  # 7 March 2024


async def test_the_chats_participants_are_left_out_of_the_query(db: Database) -> None:
    await prepared(db)
    chat_a = await db.read(lambda c: c.execute("SELECT id FROM chats WHERE chat_key = ?", (A,)).fetchone()[0])
    from mnemo.memory.fts_query import Scope

    names = await db.read(lambda c: participant_words(c, Scope((chat_a,))))
    assert names == {"alice", "carol"}
    q = without_names(parse("When did Alice take a pottery class?"), names)
    assert [f[0] for f in q.terms] == ["take", "pottery", "class"]
    only_names = parse("Alice")
    assert without_names(only_names, names) == only_names  # nothing else left: keep it


async def test_a_question_naming_a_speaker_ranks_that_speakers_turn_first(
    store_db: tuple[SessionStore, Database],
) -> None:
    store, db = store_db
    s = await store.create_session(
        chat_key=A,
        platform="web",
        chat_id="x",
        thread_id=None,
        user_id="u",
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="p",
        started_at=T0,
    )
    ids = await store.append_messages(
        s.id,
        [
            NewMessage("user", "Carol, I went to a pottery class at the studio", author_name="Alice"),
            NewMessage("user", "A pottery class? My cousin does pottery.", author_name="Carol"),
        ],
    )
    got = await SessionSearch(db).search("When did Alice go to a pottery class?", chat_keys=[A], limit=5)
    assert got.message_ids[0] == ids[0]
    got = await SessionSearch(db).search("Did Carol's cousin do pottery?", chat_keys=[A], limit=5)
    assert got.message_ids[0] == ids[1]


@pytest.fixture
async def store_db(db: Database) -> tuple[SessionStore, Database]:
    return SessionStore(db), db


async def test_the_tool_result_keeps_the_turns_around_each_hit_with_dates_and_speakers(db: Database) -> None:
    ids_a, _ = await prepared(db)
    out = await run_session_search_tool(
        SessionSearch(db),
        {"query": "adopted puppy", "limit": 1},
        chat_key=A,
        current_session_id=None,
        view=ViewSettings(before=1, after=1),
        max_limit=5,
    )
    assert out.view is not None and out.view.message_ids == {ids_a[1], ids_a[2], ids_a[3]}
    lines = out.text.splitlines()
    at = lines.index(f"» Alice: {TEXTS[2]}")
    assert lines[at - 1] == f"Carol: {TEXTS[1]}" and lines[at + 1] == f"Carol: {TEXTS[3]}"
    assert lines[at - 3] == f"## conversation of {T0:%Y-%m-%d (%a)}"  # the date once, then "…"
    assert lines[at - 2] == "…" and lines[at + 2] == "…"
    first = await run_session_search_tool(
        SessionSearch(db),
        {"query": "pottery class bowl", "limit": 1},
        chat_key=A,
        current_session_id=None,
        view=ViewSettings(before=1, after=1),
        max_limit=5,
    )
    lines = first.text.splitlines()
    at = lines.index(f"» Alice: {TEXTS[0]}")
    assert lines[at - 1].startswith("## conversation of")  # the session's first turn: nothing before
    assert lines[at + 1] == f"Carol: {TEXTS[1]}"


# --- the semantic extra ---------------------------------------------------------------------


async def test_semantic_fusion_finds_what_the_lexical_ranking_misses(db: Database) -> None:
    store = SessionStore(db)
    s = await store.create_session(
        chat_key=A,
        platform="web",
        chat_id="x",
        thread_id=None,
        user_id="u",
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="p",
        started_at=T0,
    )
    # "potter" shares a 5-letter prefix feature with "pottery" (HashEmbedder) but no stem.
    ids = await store.append_messages(
        s.id, [NewMessage("user", "my neighbour is a potter"), NewMessage("user", "the weather was grey")]
    )
    await embed_pending(db, HashEmbedder())
    lexical = await SessionSearch(db).search("pottery", chat_keys=[A], limit=5)
    fused = await SessionSearch(db, retriever=SemanticRetriever(HashEmbedder())).search(
        "pottery", chat_keys=[A], limit=5
    )
    assert ids[0] not in lexical.message_ids
    assert fused.message_ids[0] == ids[0]
    # New messages get vectors on the next pass, and only those.
    more = await store.append_messages(s.id, [NewMessage("user", "pottery again")])
    assert await embed_pending(db, HashEmbedder()) == len(more)


def test_without_the_extra_semantic_is_off_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(SemanticUnavailable, match=r"pip install 'mnemo\[semantic\]'"):
        load_embedder()
    assert isinstance(configured_retriever(True), ContextRetriever)
    assert isinstance(configured_retriever(False), ContextRetriever)


def test_the_search_semantic_setting_exists_and_defaults_off() -> None:
    from mnemo.gateway.config import SearchSettings

    assert SearchSettings().semantic is False
    assert SearchSettings(semantic=True).semantic is True


def test_contextual_index_sql_is_valid_on_an_empty_message(tmp_path: Path) -> None:
    # A message with no author, no previous turn: the context is still a string.
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    from mnemo.memory.migrations import migrate

    migrate(conn, STATE_MIGRATIONS)
    conn.execute("INSERT INTO chats(id, chat_key) VALUES (1, 'k')")
    conn.execute(
        "INSERT INTO sessions(id, chat_no, chat_key, platform, chat_id, agent_context, source, model,"
        " system_prompt, started_at) VALUES ('s', 1, 'k', 'b', 'b', 'primary', 'chat', 'm', 'p', 'x')"
    )
    conn.execute(
        "INSERT INTO messages(session_id, chat_no, role, content, created_at) VALUES ('s', 1, 'tool', '',"
        " '2024-12-01T00:00:00.000000+00:00')"
    )
    assert conn.execute("SELECT rowid FROM messages_ctx WHERE messages_ctx MATCH 'december'").fetchall() == [
        (1,)
    ]
    conn.close()


def test_bench_recall_measures_extra_retrievers_per_category(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from mnemo.cli.main import main

    chat = {
        "sessions": [
            {
                "id": "s1",
                "started_at": "2:00 pm on 8 May, 2023",
                "messages": [
                    {
                        "id": "m1",
                        "speaker": "Caroline",
                        "content": "I took a pottery class yesterday, made a bowl",
                    },
                    {"id": "m2", "speaker": "Melanie", "content": "Working with clay must be relaxing!"},
                ],
            },
            {
                "id": "s2",
                "started_at": "2:00 pm on 20 May, 2023",
                "messages": [
                    {"id": "m3", "speaker": "Melanie", "content": "We adopted a puppy called Oscar"},
                ],
            },
        ],
        "questions": [
            {
                "id": "q1",
                "question": "When did Caroline take a pottery class?",
                "evidence": ["m1"],
                "category": "temporal",
            },
            {
                "id": "q2",
                "question": "What is Melanie's puppy called?",
                "evidence": ["m3"],
                "category": "single-hop",
            },
        ],
    }
    path = tmp_path / "dlg.json"
    path.write_text(json.dumps(chat))
    argv = [
        "--home",
        str(tmp_path / "home"),
        "bench",
        "recall",
        "--dataset",
        str(path),
        "--k",
        "1,5",
        "--json",
        "--retriever",
        "fusion",
        "--retriever",
        "semantic-hash",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert list(result) == ["baseline", "shipped", "fusion", "semantic-hash"]
    assert set(result["shipped"]) == {
        f"{m}@{k}" for m in ("recall", "any_hit", "session_recall") for k in (1, 5)
    }
    assert result["shipped"]["recall@1"] == 1.0  # the names are not what is searched
    assert any(line.startswith("[temporal]") for line in lines) and any(
        line.startswith("[single-hop]") for line in lines
    )
    # --as-tool: what the session_search tool shows the model, next to recall@k.
    assert main([*argv[:-4], "--as-tool"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    tool = json.loads(lines[-1])["shipped"]
    assert {"recall@1", "seen", "tokens_median", "tokens_p95"} <= set(tool)
    assert tool["seen"] == 1.0 and 0 < tool["tokens_median"] <= tool["tokens_p95"] <= 2000
    assert any(line.startswith("as the tool shows it") for line in lines)
    with pytest.raises(SystemExit) as exited:
        main([*argv[:-4], "--retriever", "nonsense"])
    assert exited.value.code == 2


async def test_a_month_named_in_the_question_prefers_turns_of_that_month(
    store_db: tuple[SessionStore, Database],
) -> None:
    from mnemo.memory.ranking import named_months

    store, db = store_db
    ids = []
    for day, text in (
        (0, "I'm reading a great book, Dune"),
        (60, "I'm reading a great book, Emma"),
    ):  # March, May
        s = await store.create_session(
            chat_key=A,
            platform="web",
            chat_id="x",
            thread_id=None,
            user_id="u",
            agent_context="primary",
            source="chat",
            model="m",
            system_prompt="p",
            started_at=T0 + timedelta(days=day),
        )
        ids += await store.append_messages(
            s.id, [NewMessage("user", text, created_at=T0 + timedelta(days=day))]
        )
    for question, want in (
        ("Which book was I reading in March?", ids[0]),
        ("Which book was I reading in May?", ids[1]),
    ):
        got = await SessionSearch(db).search(question, chat_keys=[A], limit=5)
        assert got.message_ids[0] == want, question
    assert named_months("which book in january".split()) == {1}
    assert named_months("may 2023".split()) == {5}
    assert named_months("i may have said".split()) == set()
