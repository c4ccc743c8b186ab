"""SearchRepository: any text is a valid query on every backend (never a syntax error),
and unspaced scripts (CJK) are found by their characters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from mnemo.memory.sessions import NewMessage
from tests.contract.conftest import Backend
from tests.contract.test_sessions import new_session

NASTY = [
    "adopted?",
    "'",
    '"',
    '"unbalanced',
    "free: NEAR NOT AND OR",
    "a & b | !c",
    "(",
    ")",
    ":*",
    "<->",
    "foo:* & !bar",
    "\\",
    "-beagle",
    "beagle -puppy",
    "\x00beagle",
    "a" * 5000,
    "🐶 beagle",
    "the and of",
    "'); DROP TABLE messages; --",
    "beagle\u200b",
    "ÄÖÜ ß",
    "狗狗 beagle",
    "%s %(x)s {}",
    "*",
    "...",
    "' OR 1=1",
]


async def test_no_text_is_a_syntax_error_and_scope_still_holds(backend: Backend) -> None:
    mine = await new_session(backend, "telegram:dm:1")
    theirs = await new_session(backend, "telegram:dm:2")
    await backend.sessions.append_messages(mine.id, [NewMessage("user", "we adopted a beagle puppy")])
    await backend.sessions.append_messages(theirs.id, [NewMessage("user", "their beagle puppy")])
    for query in NASTY:
        result = await backend.search.search(query, chat_keys=["telegram:dm:1"], limit=5)
        assert {h.session_id for h in result.hits} <= {mine.id}, query
    assert (await backend.search.search("-beagle", chat_keys=["telegram:dm:1"], limit=5)).hits


async def test_any_generated_text_is_a_valid_query(backend: Backend) -> None:
    row = await new_session(backend, "telegram:dm:1")
    await backend.sessions.append_messages(row.id, [NewMessage("user", "the vet appointment is on friday")])

    @hsettings(max_examples=60)
    @given(st.text(min_size=1, max_size=60))
    def check(text: str) -> None:
        found.append(text)

    found: list[str] = []
    check()
    for text in found:
        if text.strip():
            result = await backend.search.search(text, chat_keys=["telegram:dm:1"], limit=3)
            assert all(h.session_id == row.id for h in result.hits)


async def test_cjk_text_is_found_by_its_characters(backend: Backend) -> None:
    row = await new_session(backend, "telegram:dm:1")
    await backend.sessions.append_messages(
        row.id, [NewMessage("user", "我家的狗叫旺财"), NewMessage("user", "今天天气很好")]
    )
    result = await backend.search.search("旺财", chat_keys=["telegram:dm:1"], limit=5)
    assert result.hits and result.hits[0].snippet == "我家的狗叫旺财"
