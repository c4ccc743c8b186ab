"""Streaming replies on Telegram: the real python-telegram-bot inside ``TelegramAdapter``
against the fake Bot API, the real anthropic SDK streaming from the emulator.

A long reply is shown in one message edited while it is written — at most one edit per
interval, counted on the fake's own timestamps — and that message becomes the reply
exactly as it is formatted and split without streaming. Streaming off, a group, and a
flood wait behave as the settings and Telegram say."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from mnemo.adapters.telegram_format import render_chunks
from mnemo.adapters.telegram_html import parse_telegram_html
from mnemo.gateway.delivery.streams import INTERRUPTED
from mnemo.gateway.emulator import Emulator, Fault, Reply, ToolUse
from mnemo.gateway.events import ChatRef
from tests.adapters.telegram_harness import TelegramRig, wait_until
from tests.fakes.telegram_api import ApiCall, FakeTelegram

INTERVAL = 0.3  # streaming.min_interval_s and the adapter's floor, for quick tests
BOT = "mnemo_test_bot"

PARAGRAPH = (
    "**Streaming** shows a reply while the model writes it: one message, edited as text arrives, "
    "then turned into the final, formatted answer with `code`, _emphasis_ and lists.\n\n"
    "- first point, with a [link](https://example.org)\n- second point\n\n"
)
LONG = PARAGRAPH * 22  # over 4,096 UTF-16 units once rendered: split into two messages


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(fake: FakeTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


def streaming(on: bool = True, **extra: Any) -> dict[str, Any]:
    return {"streaming.enabled": on, "streaming.min_interval_s": INTERVAL, **extra}


FAST = {"stream_interval_s": INTERVAL}


def bot_messages(fake: FakeTelegram, chat_id: int) -> list[dict[str, Any]]:
    """The bot's messages in a chat as the user sees them now (after every edit), oldest first."""
    found = [
        m for (cid, _), m in fake.world.messages.items() if cid == chat_id and m["from"]["id"] == fake.bot_id
    ]
    return sorted(found, key=lambda m: m["message_id"])


def visible(messages: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    return [(m["text"], m.get("entities", [])) for m in messages]


def live_calls(fake: FakeTelegram, chat_id: int) -> list[ApiCall]:
    """Every successful post or edit of the streamed message (plain sendMessage, editMessageText)."""
    return [
        c
        for c in fake.calls
        if c.status == 200
        and str(c.params.get("chat_id")) == str(chat_id)
        and (c.method == "editMessageText" or (c.method == "sendMessage" and not c.params.get("parse_mode")))
    ]


def assert_paced(calls: list[ApiCall], interval: float) -> None:
    gaps = [b.at - a.at for a, b in pairwise(calls)]
    assert all(g >= interval for g in gaps), f"edits closer than {interval}s: {gaps}"


async def test_a_long_reply_is_edited_while_written_then_becomes_the_formatted_split_reply(
    rig: TelegramRig,
) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text=LONG, chunk_delay=0.006), Reply(text=LONG))
    async with rig.app(adapter_options=FAST, **streaming()) as (app, adapter):
        fake.push_text(1001, 1001, "tell me about streaming")
        chunks = render_chunks(LONG, adapter.max_message_len)
        assert len(chunks) == 2
        await wait_until(
            lambda: (
                any(e.parse_mode == "HTML" for e in fake.edits)
                and any(m.parse_mode == "HTML" for m in fake.sent)
            ),
            60,
        )
    assert rig.emulator.requests[0].stream, "the request was streamed"
    streamed = live_calls(fake, 1001)
    first_post, *edits = streamed
    live_edits = [c for c in edits if not c.params.get("parse_mode")]
    assert len(live_edits) >= 2, f"at least two edits before the final text, got {len(live_edits)}"
    assert edits[-1].params.get("parse_mode") == "HTML", "the last edit is the final, formatted text"
    assert_paced(streamed, INTERVAL)
    assert all(len(c.params["text"]) <= 4096 for c in streamed)
    partial = [c.params["text"] for c in live_edits]
    assert all(t.endswith("…") for t in partial) and len(set(partial)) == len(partial)

    # The same reply without streaming, in another chat: what the user ends up with is identical.
    async with rig.app(adapter_options=FAST, **streaming(False)):
        fake.push_text(1002, 1002, "tell me about streaming")
        await wait_until(lambda: len(bot_messages(fake, 1002)) == 2, 30)
    assert visible(bot_messages(fake, 1001)) == visible(bot_messages(fake, 1002))
    assert [m.text for m in fake.sent if m.chat_id == 1002] == [c.html for c in chunks]
    assert not rig.emulator.requests[1].stream, "streaming off: the request is not streamed"
    assert not [e for e in fake.edits if e.chat_id == 1002], "streaming off: no edits"


async def test_streaming_off_is_exactly_todays_behaviour(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text="A slow **answer** " * 30, chunk_delay=0.01))
    async with rig.app(adapter_options=FAST, **streaming(False)):
        fake.push_text(1001, 1001, "hello")
        await fake.wait_for_sent(1, timeout=30)
        await wait_until(
            lambda: not rig.emulator.requests or rig.emulator.requests[-1].response_status == 200, 10
        )
    assert not rig.emulator.requests[0].stream
    assert fake.calls_to("editMessageText") == []
    [sent] = fake.sent
    assert sent.parse_mode == "HTML" and sent.text == render_chunks("A slow **answer** " * 30, 4096)[0].html


async def test_a_quick_reply_is_delivered_as_without_streaming(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text="Quick **one**."))
    async with rig.app(adapter_options=FAST, **streaming()):
        fake.push_text(1001, 1001, "hi")
        await fake.wait_for_sent(1, timeout=30)
    assert rig.emulator.requests[0].stream
    assert fake.calls_to("editMessageText") == [], "faster than one interval: nothing to show early"
    assert [s.text for s in fake.sent] == ["Quick <b>one</b>."]


async def test_groups_do_not_stream_by_default(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text="group answer " * 60, chunk_delay=0.01))
    async with rig.app(adapter_options=FAST, **streaming(), **{"telegram.groups_enabled": True}):
        fake.push_text(-100200, 1001, f"@{BOT} what do you think?", chat_type="supergroup")
        await fake.wait_for_sent(1, timeout=30)
    assert not rig.emulator.requests[0].stream
    assert fake.calls_to("editMessageText") == []


async def test_a_flood_wait_skips_edits_and_never_holds_the_turn(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text=PARAGRAPH * 12, chunk_delay=0.01))
    fake.fail_next("editMessageText", status=429, retry_after=1)
    async with rig.app(adapter_options=FAST, **streaming()):
        fake.push_text(1001, 1001, "hello")
        await wait_until(lambda: any(e.parse_mode == "HTML" for e in fake.edits), 30)
    limited = [c for c in fake.calls if c.method == "editMessageText" and c.status == 429]
    assert len(limited) == 1
    after = [c for c in fake.calls if c.method == "editMessageText" and c.at > limited[0].at]
    assert after, "editing resumed after the flood wait"
    assert after[0].at - limited[0].at >= 1.0, "no edit inside Telegram's retry_after"
    assert_paced(live_calls(fake, 1001), INTERVAL)
    final = bot_messages(fake, 1001)
    assert visible(final)[0][0].startswith("Streaming shows a reply")


async def test_a_tool_call_shows_a_status_line(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(
        Reply(
            text="Let me look through our earlier chats for that. " * 4,
            tool_uses=[ToolUse("session_search", {"query": "plans"})],
            chunk_delay=0.02,
        ),
        Reply(text="Found it: **the plan** was to ship on Friday.", delay=1.0),
    )
    async with rig.app(adapter_options=FAST, **streaming()):
        fake.push_text(1001, 1001, "what was the plan?")
        await wait_until(lambda: any(e.parse_mode == "HTML" for e in fake.edits), 30)
    shown = [c.params["text"] for c in live_calls(fake, 1001)]
    assert any(t.endswith("🔧 session_search…") for t in shown), shown
    assert visible(bot_messages(fake, 1001))[0][0] == "Found it: the plan was to ship on Friday."


async def test_a_message_left_by_an_earlier_run_is_marked_interrupted_then_completed(
    rig: TelegramRig,
) -> None:
    """What a restart finds after a crash mid-stream (the real kill -9 is in
    tests/gateway/test_streaming_crash.py): the recorded message is taken over."""
    fake = rig.fake
    fake.add_chat(1001)
    rig.emulator.script(Reply(text="the real answer", delay=1.0))
    chat = ChatRef("telegram", "1001")
    async with rig.app(adapter_options=FAST, **streaming()) as (app, adapter):
        old = await adapter.stream_open(chat, "half of an ans", reply_to=None)
        await app.gateway.streams.record(1, chat, old)  # inbox row 1: the message pushed next
        fake.push_text(1001, 1001, "question")
        await wait_until(lambda: any(e.parse_mode == "HTML" for e in fake.edits), 30)
        for _ in range(100):
            if await app.gateway.streams.get(1) is None:
                break
            await asyncio.sleep(0.02)
        assert await app.gateway.streams.get(1) is None, "forgotten once delivered"
    edits = [e.plain_text for e in fake.edits]
    assert edits[0] == INTERRUPTED and edits[-1] == "the real answer", edits
    assert all(e == "the real answer …" for e in edits[1:-1]), edits
    assert visible(bot_messages(fake, 1001)) == [("the real answer", [])], "one message: the answer"


async def test_a_stream_broken_mid_reply_is_retried_and_the_history_stays_valid(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Fault(status=529, mid_stream=True), Reply(text=PARAGRAPH * 6, chunk_delay=0.01))
    async with rig.app(adapter_options=FAST, **streaming()):
        fake.push_text(1001, 1001, "hello")
        await wait_until(lambda: any(e.parse_mode == "HTML" for e in fake.edits), 30)
    assert [r.stream for r in rig.emulator.requests] == [True, True]
    assert not any(
        "Partial answer before the failure" in c.params["text"] for c in live_calls(fake, 1001)[1:]
    )
    [message] = bot_messages(fake, 1001)
    assert message["text"].startswith("Streaming shows a reply")
    with sqlite3.connect(rig.home / "state.db") as db:
        rows = db.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant"] and rows[1][1] == PARAGRAPH * 6


async def test_a_live_message_the_user_deleted_is_replaced_by_the_final_reply(rig: TelegramRig) -> None:
    fake = rig.fake
    rig.emulator.script(Reply(text=PARAGRAPH * 8, chunk_delay=0.01))
    async with rig.app(adapter_options=FAST, **streaming()):
        fake.push_text(1001, 1001, "hello")
        await fake.wait_for_call("editMessageText", 1, timeout=30)
        [live] = bot_messages(fake, 1001)
        del fake.world.messages[(1001, live["message_id"])]  # the user deleted it
        await wait_until(lambda: any(m.parse_mode == "HTML" for m in fake.sent), 30)
    [final] = bot_messages(fake, 1001)
    assert final["message_id"] != live["message_id"]
    [chunk] = render_chunks(PARAGRAPH * 8, 4096)
    assert final["text"] == parse_telegram_html(chunk.html).text and final.get("entities")
