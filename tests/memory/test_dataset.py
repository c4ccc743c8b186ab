"""The neutral dataset format, import through the store, recall scoring, and the shipped
development dataset (valid, reproducible from its seed)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.dataset import (
    DatasetImport,
    QuestionOutcome,
    ask_questions,
    dataset_files,
    import_dataset,
    load_dataset,
    parse_dataset,
    parse_started_at,
    summarize,
    timeline,
)
from mnemo.memory.errors import InvalidDataset
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import SessionStore

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "bench" / "data"

SMALL = {
    "sessions": [
        {
            "id": "s1",
            "started_at": "1:56 pm on 8 May, 2023",
            "extra": 1,
            "messages": [
                {"id": "a", "speaker": "Caroline", "content": "I went to a support group yesterday"},
                {"id": "b", "speaker": "Melanie", "content": "That sounds brave"},
                {"id": "c", "speaker": "assistant", "content": "Noted."},
            ],
        },
        {
            "id": "s2",
            "started_at": "sometime later",
            "messages": [
                {"id": "d", "speaker": "Caroline", "content": "The adoption agency called back"},
            ],
        },
    ],
    "questions": [
        {
            "id": "q1",
            "question": "When did Caroline go to the support group?",
            "evidence": ["a"],
            "category": "temporal",
        },
        {"id": "q2", "question": "no evidence here", "evidence": []},
        {"id": "q3", "question": "What did the agency do?", "evidence": ["d", "a"], "unknown": True},
    ],
}


def test_parse_ignores_unknown_keys_and_keeps_optional_fields() -> None:
    ds = parse_dataset(SMALL, "small")
    assert [s.id for s in ds.sessions] == ["s1", "s2"] and ds.message_count == 4
    assert ds.questions[0].category == "temporal" and ds.questions[2].category is None
    assert ds.questions[2].evidence == ("d", "a")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "top level"),
        ({}, "missing 'sessions'"),
        ({"sessions": [{"messages": [{"id": "x"}]}]}, "missing 'content'"),
        ({"sessions": [{"messages": [{"id": "x", "content": 5}]}]}, "must be a string"),
        (
            {"sessions": [], "questions": [{"id": "q", "question": "?", "evidence": "a"}]},
            "list of message ids",
        ),
        ({"sessions": [], "questions": [{"id": "q"}]}, "missing 'question'"),
    ],
)
def test_malformed_files_are_refused_with_the_place_named(data: object, message: str) -> None:
    with pytest.raises(InvalidDataset, match=message):
        parse_dataset(data, "bad")


def test_started_at_accepts_iso_and_common_free_text_dates() -> None:
    assert parse_started_at("2024-02-03T04:05:06") == datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert parse_started_at("2024-02-03T04:05:06Z") == datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert parse_started_at("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert parse_started_at("the day after") is None and parse_started_at("") is None


def test_load_and_folder_expansion(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps(SMALL))
    (tmp_path / "a.json").write_text(json.dumps(SMALL))
    (tmp_path / "notes.txt").write_text("ignored")
    assert [p.name for p in dataset_files([tmp_path])] == ["a.json", "b.json"]
    assert load_dataset(tmp_path / "a.json").name == "a"
    (tmp_path / "broken.json").write_text("{nope")
    with pytest.raises(InvalidDataset, match="cannot read"):
        load_dataset(tmp_path / "broken.json")
    with pytest.raises(InvalidDataset, match="no such file"):
        dataset_files([tmp_path / "missing"])


async def test_import_goes_through_the_store_and_questions_are_asked_in_scope(tmp_path: Path) -> None:
    db = state_database(tmp_path / "state.db")
    await db.open()
    store = SessionStore(db)
    seen: list[tuple[int, int]] = []
    ds = parse_dataset(SMALL, "small")
    report = await import_dataset(store, ds, "import:small", progress=lambda d, t: seen.append((d, t)))
    assert (report.sessions, report.messages) == (2, 4) and seen == [(3, 4), (4, 4)]
    sessions = await store.list_sessions("import:small")
    assert len(sessions) == 2 and all(s.end_reason == "imported" for s in sessions)
    first = sessions[-1]
    assert first.started_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert sessions[0].title == "sometime later" and sessions[0].started_at > first.started_at
    msgs = await store.load_messages(first.id)
    assert [(m.role, m.author_name) for m in msgs] == [
        ("user", "Caroline"),
        ("user", "Melanie"),
        ("assistant", "assistant"),
    ]
    assert msgs[0].meta == {"dataset_id": "a"} and report.id_map["a"] == msgs[0].id
    outcomes = await ask_questions(SessionSearch(db), ds, report, 10)
    await db.close()
    assert [o.question_id for o in outcomes] == ["q1", "q3"]  # q2 has no evidence
    assert outcomes[0].recall_at(10) == 1.0


def test_recall_and_any_hit_are_averaged_over_questions() -> None:
    outcomes = [
        QuestionOutcome("1", None, frozenset({"a", "b"}), ("x", "a", "y", "b")),
        QuestionOutcome("2", None, frozenset({"c"}), ("x", "y")),
    ]
    s = summarize(outcomes, (1, 2, 4))
    assert {k: v for k, v in s.items() if not k.startswith("session_")} == {
        "recall@1": 0.0,
        "any_hit@1": 0.0,
        "recall@2": 0.25,
        "any_hit@2": 0.5,
        "recall@4": 0.5,
        "any_hit@4": 0.5,
    }
    assert summarize([], (5,)) == {"recall@5": 0.0, "any_hit@5": 0.0, "session_recall@5": 0.0}


def test_session_recall_seen_and_token_percentiles() -> None:
    outcomes = [
        # Two evidence sessions, the top 2 hits are in one of them; the tool showed "a".
        QuestionOutcome(
            "1",
            None,
            frozenset({"a", "b"}),
            ("x", "a"),
            frozenset({"s1", "s2"}),
            ("s9", "s1"),
            frozenset({"a", "z"}),
            100,
        ),
        # Session-level evidence only: counts for session recall, not for the message figures.
        QuestionOutcome("2", None, frozenset(), ("y",), frozenset({"s3"}), ("s3",), frozenset(), 300),
    ]
    s = summarize(outcomes, (1, 2))
    assert s["recall@2"] == 0.5 and s["any_hit@1"] == 0.0  # question 2 has no message evidence
    assert s["session_recall@1"] == 0.5 and s["session_recall@2"] == 0.75
    assert s["seen"] == 0.5  # of the questions with message evidence
    assert s["tokens_median"] == 200 and s["tokens_p95"] == 290


TIMELINE = {
    "sessions": [
        {
            "id": "s1",
            "started_at": "2024-01-01",
            "messages": [{"id": "a", "speaker": "Ann", "content": "my cat Tom"}],
        },
        {
            "id": "s2",
            "started_at": "2024-02-01",
            "messages": [{"id": "b", "speaker": "Ann", "content": "Tom is ill"}],
        },
        {
            "id": "s3",
            "started_at": "2024-03-01",
            "messages": [{"id": "c", "speaker": "Ann", "content": "Tom is fine"}],
        },
    ],
    "questions": [
        {"id": "q1", "question": "how is Tom", "evidence": ["a"], "asked_in": "s2"},
        {"id": "q2", "question": "how is Tom", "evidence": [], "evidence_sessions": ["s2"], "asked_in": "s3"},
        {"id": "q3", "question": "how is Tom", "evidence": ["c"]},
    ],
}


async def test_a_question_on_the_timeline_only_finds_what_was_said_before_it(tmp_path: Path) -> None:
    ds = parse_dataset(TIMELINE, "t")
    assert ds.questions[0].evidence_sessions == ("s1",)  # derived from the evidence messages
    stretches = timeline(ds)
    assert [([s.id for s in ss], [q.id for q in qs]) for ss, qs in stretches] == [
        (["s1"], ["q1"]),
        (["s2"], ["q2"]),
        (["s3"], ["q3"]),
    ]
    db = state_database(tmp_path / "state.db")
    await db.open()
    stretch = DatasetImport(SessionStore(db), ds, "import:t")
    found = {}
    for sessions, questions in stretches:
        await stretch.add(sessions)
        for o in await ask_questions(SessionSearch(db), ds, stretch.report(), 10, questions=questions):
            found[o.question_id] = o
    await db.close()
    assert found["q1"].ranked == ("a",)  # s2 and s3 did not exist yet
    assert set(found["q2"].ranked) == {"a", "b"} and found["q2"].session_recall_at(10) == 1.0
    assert set(found["q3"].ranked) == {"a", "b", "c"}
    with pytest.raises(InvalidDataset, match="asked_in"):
        parse_dataset(
            {**TIMELINE, "questions": [{"question": "x", "evidence": ["a"], "asked_in": "nope"}]}, "t"
        )


def test_the_realmem_converter_places_queries_on_the_timeline() -> None:
    sys.path.insert(0, str(REPO))
    from bench.realmem import convert

    def turn(speaker: str, content: str, **kw: object) -> dict:
        return {"speaker": speaker, "content": content, "is_query": "False", **kw}

    data = {
        "_metadata": {"person_name": "Ada_Lovelace"},
        "dialogues": [
            {
                "session_uuid": "u1",
                "current_time": "2025-01-02 (Thursday)",
                "dialogue_turns": [
                    turn("User", "I want to learn the harp"),
                    turn("Assistant", "Start with scales daily."),
                ],
                "extracted_memory": [
                    {
                        "content": "Plan: scales daily",
                        "source_turn": 2,
                        "source_content_snapshot": "Start with scales daily.",
                    }
                ],
            },
            {
                "session_uuid": "u2",
                "current_time": "2025-01-02 (Thursday)",
                "dialogue_turns": [
                    turn(
                        "User", "What was my practice plan?", is_query=True, category_name="Dynamic Updating"
                    ),
                    turn(
                        "Assistant",
                        "Scales.",
                        memory_session_uuids="['u1']",
                        memory_used="[{'session_uuid': 'u1', 'content': 'Plan: scales daily'}]",
                    ),
                ],
                "extracted_memory": [],
            },
        ],
    }
    chat, stats = convert(data, "ada")
    ds = parse_dataset(chat, "ada")
    assert [s.started_at for s in ds.sessions] == ["2025-01-02T09:00:00", "2025-01-02T09:30:00"]
    assert (
        ds.sessions[0].messages[0].speaker == "Ada Lovelace"
        and ds.sessions[0].messages[1].speaker == "assistant"
    )
    (q,) = ds.questions
    assert (q.asked_in, q.evidence, q.evidence_sessions, q.category) == (
        "u2",
        ("u1-t1",),
        ("u1",),
        "Dynamic Updating",
    )
    assert stats["queries"] == 1


def test_the_development_dataset_is_valid_and_large_enough() -> None:
    files = dataset_files([DATA])
    questions = []
    total_bytes = 0
    for path in files:
        ds = load_dataset(path)
        ids = {m.id for s in ds.sessions for m in s.messages}
        assert len(ids) == ds.message_count  # ids are unique within a chat
        for q in ds.questions:
            assert q.evidence and set(q.evidence) <= ids, q.id
        questions += ds.questions
        total_bytes += path.stat().st_size
    cats = Counter(q.category for q in questions)
    assert len(questions) >= 300
    assert set(cats) == {"single-hop", "multi-hop", "temporal"} and min(cats.values()) >= 40
    assert total_bytes < 5_000_000


def test_the_development_dataset_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_dataset.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for path in dataset_files([DATA]):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name
