"""What people read of a search (``/search``, ``mnemo sessions search``, the dashboard):
per conversation, in time order, ``date · speaker: text``, no tool JSON, no blank
lines, names instead of ids — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnemo.app import App
from mnemo.cli.main import main
from mnemo.gateway.emulator import Reply, ToolUse
from mnemo.gateway.search_display import BOT_NAME, YOU, conversations, person, render_text
from mnemo.memory.search import ContextTurn, SearchHit, SearchResult, SessionHits
from tests.conftest import BackendUnderTest
from tests.gateway.test_slash_commands import converse
from tests.support.loopback import LoopbackAdapter

WEB_ID = "3f9a1c0d5e7b2a4c6d8e0f1a2b3c4d5e"  # the web page's random 32-hex id
LINE = re.compile(r"^ {2}\d{4}-\d\d-\d\d \d\d:\d\d · [^:]+: \S")


async def _stored(app: App, session_id: str, count: int) -> bool:
    return len(await app.store.load_messages(session_id)) >= count


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not await predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


def readable(text: str) -> list[str]:
    """The lines of a rendered result, checked for the shape every line must have."""
    lines = text.splitlines()
    assert all(line.strip() for line in lines), "no blank lines"
    for line in lines:
        assert line.startswith("Conversation of ") or LINE.match(line), line
    assert "{" not in text and '"success"' not in text, "no tool JSON"
    return lines


async def test_search_shows_a_transcript_without_tool_output_on_every_backend(
    backend: BackendUnderTest, app_factory, emulator, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.script(
        Reply(
            text="",
            tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "Likes green tea."})],
        ),
        Reply(text="Saved: you like green tea."),
        Reply(text="Sencha is a green tea too."),
    )
    adapter = LoopbackAdapter("web")
    async with app_factory(adapter, **{"access.allowed": ("web:*",)}) as app:
        await converse(adapter, emulator, "remember I like green tea", user=WEB_ID)
        await converse(adapter, emulator, "what about sencha tea?", user=WEB_ID)
        session = await app.store.active_session(f"web:dm:{WEB_ID}")
        assert session is not None
        await until(lambda: _stored(app, session.id, 6))
        [answer] = await converse(adapter, emulator, "/search tea", user=WEB_ID)

    lines = readable(answer)
    said = [line.split(" · ", 1)[1] for line in lines[1:]]
    assert said == [
        f"{YOU}: remember I like green tea",
        f"{BOT_NAME}: Saved: you like green tea.",
        f"{YOU}: what about sencha tea?",
        f"{BOT_NAME}: Sencha is a green tea too.",
    ]
    assert WEB_ID not in answer

    # The operator's view of the same chat: the web user by a short name, never the hex id.
    capsys.readouterr()  # the app's own log lines
    assert await asyncio.to_thread(main, ["--home", str(home), "sessions", "search", "tea"]) == 0
    out = capsys.readouterr().out
    lines = readable(out.replace(f"web:dm:{WEB_ID}", "web:dm:KEY"))  # the heading names the chat key
    assert f"web user {WEB_ID[:6]}: remember I like green tea" in out
    assert all(WEB_ID not in line for line in lines[1:])


T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def hit(mid: int, role: str, text: str, *, who: str | None = "ann", before=None, after=None) -> SearchHit:
    return SearchHit(
        mid, "s1", role, who if role == "user" else None, None, at(mid), text, 1.0, before, after
    )


def turn(mid: int, speaker: str, text: str) -> ContextTurn:
    return ContextTurn(mid, speaker, at(mid), text)


def result(*hits: SearchHit, chat: str = "telegram:dm:7") -> SearchResult:
    group = SessionHits("s1", chat, "telegram", None, at(0), 1.0, tuple(hits))
    return SearchResult("q", tuple(hits), (group,))


def test_hits_and_their_context_come_once_each_in_time_order() -> None:
    # Best first from the search: #18 then #16, each with its neighbours (#17 twice).
    found = conversations(
        result(
            hit(
                18,
                "user",
                "tea again",
                before=turn(17, "assistant", "Sure."),
                after=turn(19, "assistant", "ok"),
            ),
            hit(16, "user", "tea please", after=turn(17, "assistant", "Sure.")),
        )
    )
    assert [line.message_id for line in found[0].lines] == [16, 17, 18, 19]
    assert [line.hit for line in found[0].lines] == [True, False, True, False]


def test_tool_results_and_empty_turns_are_left_out() -> None:
    found = conversations(
        result(
            hit(5, "tool", '{"success": true}'),
            hit(
                6, "user", "green tea", before=turn(4, "tool", '{"ok": 1}'), after=turn(7, "assistant", "  ")
            ),
            hit(8, "assistant", ""),
        )
    )
    assert [(line.message_id, line.speaker, line.text) for line in found[0].lines] == [
        (6, "ann", "green tea")
    ]
    assert conversations(result(hit(5, "tool", '{"success": true}'))) == []


def test_names_not_ids() -> None:
    assert person(WEB_ID, None, "web") == "web user 3f9a1c"
    assert person(WEB_ID, None, "web", me=WEB_ID) == YOU
    assert person("123456", "Ada", "telegram") == "Ada"
    assert person("123456", None, "telegram") == "123456"
    assert person(None, None, "web") == "someone"
    # A context turn names its author by name or id: the hit's name is reused for the id.
    found = conversations(
        result(
            SearchHit(2, "s1", "user", WEB_ID, "Ada", at(2), "tea", 1.0, turn(1, WEB_ID, "hello"), None),
            chat=f"web:dm:{WEB_ID}",
        )
    )
    assert [line.speaker for line in found[0].lines] == ["Ada", "Ada"]


def test_conversations_are_oldest_first_and_render_in_the_bot_timezone() -> None:
    late = SessionHits(
        "s2", "telegram:dm:7", "telegram", "Later", at(60), 2.0, (hit(61, "user", "tea late"),)
    )
    early = SessionHits("s1", "telegram:dm:7", "telegram", None, at(0), 1.0, (hit(1, "user", "tea early"),))
    res = SearchResult("tea", (*late.hits, *early.hits), (late, early))
    from zoneinfo import ZoneInfo

    text = render_text(conversations(res), tz=ZoneInfo("Europe/Lisbon"))
    assert text.splitlines() == [
        "Conversation of 2026-05-01 10:00",
        "  2026-05-01 10:01 · ann: tea early",
        "Conversation of 2026-05-01 11:00 · Later",
        "  2026-05-01 11:01 · ann: tea late",
    ]


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
roles = st.sampled_from(["user", "assistant", "tool"])


@given(st.lists(st.tuples(st.integers(0, 50), roles, texts, st.booleans()), max_size=12))
def test_any_result_renders_as_readable_lines(items: list[tuple[int, str, str, bool]]) -> None:
    hits = [
        hit(mid, role, text, before=turn(mid - 1, "tool", text) if ctx else None)
        for mid, role, text, ctx in {i[0]: i for i in items}.values()
    ]
    found = conversations(result(*hits))
    for c in found:
        times = [(line.at, line.message_id) for line in c.lines]
        assert times == sorted(times) and len({m for _, m in times}) == len(times)
        assert all(line.text and line.text == " ".join(line.text.split()) for line in c.lines)
    rendered = render_text(found)
    assert all(line.strip() for line in rendered.splitlines())
