"""Telegram end to end: python-telegram-bot's real ``Application`` inside ``TelegramAdapter``
against the fake Bot API, the real anthropic SDK against the emulator, the whole
gateway in between (``open_app``) — and, for the crash case, ``mnemo run`` as a real
process killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml

from mnemo.adapters.splitting import utf16_len
from mnemo.adapters.telegram_format import is_valid_telegram_html, render_chunks, to_plain_text
from mnemo.adapters.telegram_updates import UNSUPPORTED_NOTE
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from mnemo.gateway.errors import Forbidden, StartupError
from mnemo.gateway.events import ChatRef, InboundMessage, OutboundMessage
from mnemo.gateway.transcription import NOT_SET_UP as VOICE_NOT_SET_UP
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig, last_user_text, wait_until

CHAT = USER = 4711
BOT = "mnemo_test_bot"


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


def inbox_texts(db_path: Path) -> list[str]:
    import json

    with sqlite3.connect(db_path) as db:
        return [json.loads(r[0])["text"] for r in db.execute("SELECT payload FROM inbox ORDER BY id")]


# -- a conversation ------------------------------------------------------------------------------


async def test_a_dm_conversation_with_html_typing_quotes_and_the_commands_menu(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="Hello **Ada**, nice to meet you."), Reply(text="You said hello."))
    async with rig.app() as (app, adapter):
        assert adapter.connected
        rig.fake.push_text(CHAT, USER, "hi there, I am Ada", first_name="Ada")
        [first] = await rig.fake.wait_for_sent(1)
        rig.fake.push_text(CHAT, USER, "what did you just say?", reply_to=first.message_id)
        second = (await rig.fake.wait_for_sent(2))[1]
        session = await app.store.active_session(f"telegram:dm:{CHAT}")
        rows = await app.store.load_messages(session.id)

    assert (first.chat_id, first.parse_mode, first.plain_text) == (
        CHAT,
        "HTML",
        "Hello Ada, nice to meet you.",
    )
    assert first.entities == ({"type": "bold", "offset": 6, "length": 3},)
    assert first.reply_to_message_id is None, "a DM answer does not quote the question"
    assert second.plain_text == "You said hello."
    assert [r.role for r in rows] == ["user", "assistant", "user", "assistant"]
    assert rows[0].content == "hi there, I am Ada"
    # The reply's quoted context reaches the model.
    assert last_user_text(rig.emulator.requests[1]).startswith("> Hello Ada, nice to meet you.")
    assert rig.fake.calls_to("sendChatAction") == [], "a reply ready at once shows no typing"
    # The menu is the app's one command registry, /cron included.
    menu = [c["command"] for c in rig.fake.commands()]
    assert menu == [c.name for c in app.commands.infos()]
    assert {"help", "search", "memory", "cron"} <= set(menu)
    assert [c.method for c in rig.fake.calls[:3]] == ["getMe", "setMyCommands", "deleteWebhook"]
    assert rig.fake.pending_updates == [], "handled updates are confirmed"


async def test_a_10000_character_reply_is_split_into_valid_complete_chunks(rig: TelegramRig) -> None:
    paragraph = (
        "**Step {i}.** Configure the `worker_{i}` with *care*: set a & b < c, then check "
        "[the docs](https://example.org/docs/{i}) before moving on. " * 3
    )
    functions = (f"def handler_{n}(x):\n    return x * {n}  # <tag> & more" for n in range(40))
    code = "```python\n" + "\n".join(functions) + "\n```"
    parts = [paragraph.format(i=i) for i in range(20)]
    parts.insert(6, code)
    parts.append("- first point\n- second point\n\n> a closing quote that is **bold** in part")
    markdown = "\n\n".join(parts)
    assert len(markdown) >= 10_000
    expected = render_chunks(markdown, 4096)
    assert len(expected) >= 3
    rig.emulator.script(Reply(text=markdown))

    async with rig.app(**{"llm.max_tokens": 16000}):
        rig.fake.push_text(CHAT, USER, "write me a long guide")
        sent = await rig.fake.wait_for_sent(len(expected))
        await asyncio.sleep(0.2)

    assert len(rig.fake.sent) == len(expected)
    assert [s.text for s in sent] == [c.html for c in expected]
    for s in sent:
        assert s.parse_mode == "HTML" and is_valid_telegram_html(s.text)
        assert 0 < utf16_len(s.plain_text) <= 4096
    seen = "".join("".join(s.plain_text for s in sent).split())
    assert seen == "".join(to_plain_text(markdown).split()), "every character arrives, in order"
    assert any("def handler_39(x):" in s.plain_text for s in sent)


async def test_a_long_reply_is_split_in_a_worker_thread_not_on_the_event_loop(rig: TelegramRig) -> None:
    long_reply = "**Point.** Check `the_value` & move on; see [docs](https://example.org). " * 400
    assert len(long_reply) > 20_000  # a few ms of splitting that would hold every other chat
    expected = render_chunks(long_reply, 4096)
    rig.emulator.script(Reply(text="short answer"), Reply(text=long_reply))
    splits = render_chunks.__code__
    on_loop: list[int] = []

    def probe(frame: FrameType, event: str, arg: object) -> None:
        # sys.setprofile watches this thread only: the one running the event loop.
        if event == "call" and frame.f_code is splits:
            on_loop.append(len(frame.f_locals.get("markdown", "")))

    async with rig.app(**{"llm.max_tokens": 16000}):
        previous = sys.getprofile()
        sys.setprofile(probe)
        try:
            rig.fake.push_text(CHAT, USER, "short please")
            await rig.fake.wait_for_sent(1)
            rig.fake.push_text(CHAT, USER, "now a long one")
            sent = await rig.fake.wait_for_sent(1 + len(expected), timeout=30)
        finally:
            sys.setprofile(previous)

    assert on_loop == [len("short answer")], "a short reply is split in place, a long one is not"
    assert [s.text for s in sent[1:]] == [c.html for c in expected]


async def test_html_refused_by_telegram_is_resent_as_plain_text(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="**Bold** claim with `code`"))
    refusal = 'Bad Request: can\'t parse entities: Unsupported start tag "b" at byte offset 0'
    rig.fake.fail_next("sendMessage", status=400, description=refusal)
    async with rig.app():
        rig.fake.push_text(CHAT, USER, "format something")
        [sent] = await rig.fake.wait_for_sent(1)

    calls = rig.fake.calls_to("sendMessage")
    assert [c.status for c in calls] == [400, 200]
    assert calls[0].params["parse_mode"] == "HTML" and "parse_mode" not in calls[1].params
    assert (sent.parse_mode, sent.text) == (None, "Bold claim with code")


async def test_a_short_flood_wait_is_slept_inside_send_and_the_message_goes_once(
    rig: TelegramRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # RetryAfter in its timedelta form
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(seconds)

    rig.emulator.script(Reply(text="after the wait"))
    rig.fake.fail_next("sendMessage", status=429, retry_after=1)
    async with rig.app(adapter_options={"sleep": sleep}) as (app, _):
        rig.fake.push_text(CHAT, USER, "hello")
        await rig.fake.wait_for_sent(1)
        await asyncio.sleep(0.2)
        counts = await app.outbox.counts()

    assert slept == [1.0]
    assert [c.status for c in rig.fake.calls_to("sendMessage")] == [429, 200]
    assert [s.plain_text for s in rig.fake.sent] == ["after the wait"]
    assert counts == {"sent": 1}


# PTB's own RetryAfter constructor reads the deprecated int form (and warns); the adapter does not.
@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_a_long_flood_wait_goes_back_to_the_outbox_with_telegrams_delay(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="later"))
    rig.fake.fail_next("sendMessage", status=429, retry_after=120)
    async with rig.app() as (app, _):
        rig.fake.push_text(CHAT, USER, "hello")
        await rig.fake.wait_for_call("sendMessage", 1)

        async def row() -> Any:
            return await app.db.read(lambda c: c.execute("SELECT * FROM outbox").fetchone())

        for _ in range(200):
            if (r := await row()) is not None and r["state"] == "queued" and r["error"]:
                break
            await asyncio.sleep(0.02)
    assert r["error"].startswith("rate limited") and r["not_before"] - time.time() > 100
    assert rig.fake.sent == []


# -- delivery guarantees ---------------------------------------------------------------------------


async def test_a_retry_after_a_failed_middle_chunk_does_not_resend_the_first(
    rig: TelegramRig, fake: FlakyTelegram
) -> None:
    markdown = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 20 for i in range(20))
    expected = render_chunks(markdown, 4096)
    assert len(expected) == 3
    rig.emulator.script(Reply(text=markdown))
    fake.fail_sends = {2}
    async with rig.app(**{"llm.max_tokens": 16000}) as (app, _):
        rig.fake.push_text(CHAT, USER, "long please")
        sent = await rig.fake.wait_for_sent(3, timeout=20)
        await asyncio.sleep(0.2)
        counts = await app.outbox.counts()

    assert [c.status for c in rig.fake.calls_to("sendMessage")] == [200, 502, 200, 200]
    assert [s.text for s in sent] == [c.html for c in expected]
    assert counts == {"sent": 1}


async def test_a_blocked_bot_gives_up_on_the_reply(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="you will never see this"))
    rig.fake.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
    async with rig.app() as (app, _):
        rig.fake.push_text(CHAT, USER, "hello")
        await rig.fake.wait_for_call("sendMessage", 1)
        for _ in range(200):
            if (await app.outbox.counts()).get("failed"):
                break
            await asyncio.sleep(0.02)
        counts = await app.outbox.counts()
    assert counts == {"failed": 1}
    assert len(rig.fake.calls_to("sendMessage")) == 1


async def test_polling_reconnects_after_a_network_outage(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="first"), Reply(text="second"))
    async with rig.app() as (_, adapter):
        rig.fake.push_text(CHAT, USER, "one")
        await rig.fake.wait_for_sent(1)
        await rig.fake.wait_for_poll()
        rig.fake.fail_next("getUpdates", drop=True, times=3)
        rig.fake.push_text(CHAT, USER, "two")  # ends the waiting poll; the next three are cut
        await rig.fake.wait_for_sent(2, timeout=20)
        assert adapter.connected
    statuses = [c.status for c in rig.fake.calls_to("getUpdates")]
    assert statuses.count(0) == 3 and statuses[-1] == 200
    assert [s.plain_text for s in rig.fake.sent] == ["first", "second"]


# -- who is answered ---------------------------------------------------------------------------------


async def test_two_users_in_parallel_keep_separate_profiles_and_prompts(rig: TelegramRig) -> None:
    alice, bob = 1001, 1002

    def responder(request: RecordedRequest) -> Reply:
        last = request.messages[-1]
        if isinstance(last["content"], list) and any(b.get("type") == "tool_result" for b in last["content"]):
            return Reply(text="Noted.")
        text = last_user_text(request)
        if match := re.search(r"my name is (\w+)", text):
            fact = {"action": "add", "target": "user", "content": f"User's name is {match[1]}."}
            return Reply(tool_uses=[ToolUse("memory", fact)])
        return Reply(text=f"Reply to: {text}")

    rig.emulator.default = responder
    async with rig.app() as (app, _):
        rig.fake.push_text(alice, alice, "my name is Alice")
        rig.fake.push_text(bob, bob, "my name is Bob")
        await rig.fake.wait_for_sent(2)
        for uid in (alice, bob):
            rig.fake.push_text(uid, uid, "/reset")
        await rig.fake.wait_for_sent(4)
        for uid in (alice, bob):
            rig.fake.push_text(uid, uid, f"who am I? ({uid})")
        await rig.fake.wait_for_sent(6)
        users = app.settings.memories_dir / "users" / "telegram"
        alice_profile = (users / str(alice) / "USER.md").read_text()
        bob_profile = (users / str(bob) / "USER.md").read_text()

    assert "Alice" in alice_profile and "Bob" not in alice_profile
    assert "Bob" in bob_profile and "Alice" not in bob_profile
    for uid, own, other in ((alice, "Alice", "Bob"), (bob, "Bob", "Alice")):
        [request] = [r for r in rig.emulator.requests if last_user_text(r) == f"who am I? ({uid})"]
        assert f"User's name is {own}." in request.system_text
        assert other not in request.system_text
        replies = [s for s in rig.fake.sent if s.plain_text == f"Reply to: who am I? ({uid})"]
        assert [s.chat_id for s in replies] == [uid]


async def test_groups_answer_only_mentions_commands_and_replies_to_the_bot(rig: TelegramRig) -> None:
    group = -100777
    rig.emulator.default = lambda request: Reply(text=f"Re: {last_user_text(request)}")
    async with rig.app(**{"telegram.groups_enabled": True}) as (app, _):
        kw: dict[str, Any] = {"chat_type": "supergroup"}
        rig.fake.push_text(group, USER, "just chatting among ourselves", **kw)
        rig.fake.push_text(group, USER, "/help@other_bot", **kw)
        asked = rig.fake.push_text(group, USER, f"@{BOT} what is 2+2?", **kw)
        [first] = await rig.fake.wait_for_sent(1)
        rig.fake.push_text(group, USER, "thanks, and 3+3?", reply_to=first.message_id, **kw)
        await rig.fake.wait_for_sent(2)
        rig.fake.push_text(group, USER, f"/help@{BOT}", **kw)
        await rig.fake.wait_for_sent(3)
        rig.fake.push_text(
            group, USER, f"@{BOT} in the topic", message_thread_id=55, is_topic_message=True, **kw
        )
        sent = await rig.fake.wait_for_sent(4)
        await asyncio.sleep(0.2)

    assert first.reply_to_message_id == asked["message"]["message_id"], (
        "in a group the answer quotes the question"
    )
    assert [last_user_text(r) for r in rig.emulator.requests] == [
        "what is 2+2?",
        "> Re: what is 2+2?\nthanks, and 3+3?",
        "in the topic",
    ]
    assert sent[2].plain_text.startswith("Commands:")
    assert sent[3].message_thread_id == 55
    assert len(rig.fake.sent) == 4
    assert inbox_texts(app.settings.state_db) == [
        "what is 2+2?", "thanks, and 3+3?", f"/help@{BOT}", "in the topic",
    ]  # fmt: skip


async def test_groups_are_ignored_entirely_when_disabled(rig: TelegramRig) -> None:
    rig.emulator.script(Reply(text="dm answer"))
    async with rig.app() as (app, _):
        rig.fake.push_text(-100888, USER, f"@{BOT} are you there?", chat_type="group")
        rig.fake.push_text(CHAT, USER, "ping")
        [sent] = await rig.fake.wait_for_sent(1)
        await asyncio.sleep(0.2)
    assert (sent.chat_id, sent.plain_text) == (CHAT, "dm answer")
    assert len(rig.fake.sent) == 1 and len(rig.emulator.requests) == 1
    assert inbox_texts(app.settings.state_db) == ["ping"]


async def test_unsupported_media_gets_one_note_and_captions_are_read(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text="a nice photo")
    async with rig.app() as (app, _):
        rig.fake.push_message(
            CHAT, USER, video_note={"file_id": "vn", "file_unique_id": "uvn", "duration": 1, "length": 9}
        )
        for n in range(3):  # a burst of voice notes (no transcription set up) gets one note, not three
            rig.fake.push_message(
                CHAT, USER, voice={"file_id": f"v{n}", "file_unique_id": f"uv{n}", "duration": 3}
            )
        rig.fake.push_photo(CHAT, USER, caption="what is in this picture?")
        sent = await rig.fake.wait_for_sent(3)
        await asyncio.sleep(0.2)

    assert [s.plain_text for s in sent] == [UNSUPPORTED_NOTE, VOICE_NOT_SET_UP, "a nice photo"]
    [request] = rig.emulator.requests
    assert last_user_text(request) == "what is in this picture?"
    assert [b["type"] for b in request.messages[-1]["content"]] == ["image", "text"]
    assert inbox_texts(app.settings.state_db) == ["", "", "", "what is in this picture?"]


STICKER = {
    "file_id": "st1", "file_unique_id": "ust1", "type": "regular",
    "width": 512, "height": 512, "is_animated": False, "is_video": False,
}  # fmt: skip


def rows(db_path: Path, table: str) -> int:
    with sqlite3.connect(db_path) as db:
        return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


async def test_the_unsupported_media_note_is_for_allowed_users_only(rig: TelegramRig) -> None:
    stranger = 6660
    async with rig.app(**{"access.allowed": (f"telegram:{USER}",)}) as (app, _):
        rig.fake.push_message(stranger, stranger, sticker=STICKER)
        rig.fake.push_message(CHAT, USER, sticker=STICKER)
        [sent] = await rig.fake.wait_for_sent(1)
        await asyncio.sleep(0.3)  # the stranger's sticker was handled in the same batch

    assert (sent.chat_id, sent.plain_text) == (CHAT, UNSUPPORTED_NOTE)
    assert len(rig.fake.sent) == 1, "a blocked stranger's sticker gets no reply"
    for table in ("inbox", "outbox", "pairings"):  # no pairing code asked for either
        assert rows(app.settings.state_db, table) == 0, f"a sticker leaves nothing in {table}"
    assert rig.emulator.requests == []


async def test_edits_are_not_answered_again(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text=f"Re: {last_user_text(request)}")
    async with rig.app():
        original = rig.fake.push_text(CHAT, USER, "helo")
        await rig.fake.wait_for_sent(1)
        rig.fake.push_edit(CHAT, original["message"]["message_id"], "hello")
        rig.fake.push_text(CHAT, USER, "next one")
        await rig.fake.wait_for_sent(2)
        await asyncio.sleep(0.2)
    assert [s.plain_text for s in rig.fake.sent] == ["Re: helo", "Re: next one"]


async def test_a_user_outside_the_allowlist_is_refused_once_and_nothing_is_stored(rig: TelegramRig) -> None:
    friend, stranger = 1001, 2002
    rig.emulator.default = lambda request: Reply(text="welcome, friend")
    async with rig.app(**{"access.allowed": (), "telegram.allowed_users": (str(friend),)}) as (app, _):
        rig.fake.push_text(stranger, stranger, "let me in")
        [refusal] = await rig.fake.wait_for_sent(1)
        rig.fake.push_text(stranger, stranger, "please?")
        rig.fake.push_text(friend, friend, "hello")
        await rig.fake.wait_for_sent(2)
        await wait_until(lambda: not rig.fake.pending_updates)
        await asyncio.sleep(0.2)

    assert refusal.chat_id == stranger and "pairing code" in refusal.plain_text
    assert [s.chat_id for s in rig.fake.sent] == [stranger, friend]
    assert inbox_texts(app.settings.state_db) == ["hello"]
    assert [last_user_text(r) for r in rig.emulator.requests] == ["hello"]


# -- webhook mode --------------------------------------------------------------------------------------


async def test_webhook_mode_processes_updates_with_the_secret_and_rejects_the_rest(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text="via webhook")
    async with rig.app(webhook=True) as (app, adapter):
        url = app.settings.telegram.webhook_url
        assert rig.fake.webhook_url == url and rig.fake.webhook_secret == "hook_secret-0123456789"
        rig.fake.push_text(CHAT, USER, "hello through the hook")
        [sent] = await rig.fake.wait_for_sent(1)
        forged = {"message": rig.fake.world.user_message(CHAT, USER, text="forged message")}
        wrong = await rig.fake.deliver_webhook(url, forged, "not-the-secret")
        missing = await rig.fake.deliver_webhook(url, forged, None)
        await asyncio.sleep(0.2)

    assert sent.plain_text == "via webhook"
    assert rig.fake.webhook_statuses == [200]
    assert (wrong, missing) == (403, 403)
    assert rig.fake.calls_to("getUpdates") == []
    assert inbox_texts(app.settings.state_db) == ["hello through the hook"]
    assert [last_user_text(r) for r in rig.emulator.requests] == ["hello through the hook"]


# -- the adapter on its own ------------------------------------------------------------------------------


async def _nowhere(msg: InboundMessage) -> None:
    raise AssertionError(f"unexpected inbound message {msg}")


async def test_a_wrong_token_is_a_clear_startup_error(rig: TelegramRig) -> None:
    token = "4242000001:" + "x" * 35
    adapter = rig.adapter(rig.settings(**{"telegram.bot_token": token}))
    with pytest.raises(StartupError, match="TELEGRAM_BOT_TOKEN") as caught:
        await adapter.start(_nowhere)
    assert token not in str(caught.value)
    assert not adapter.connected


async def test_webhook_mode_refuses_to_start_without_a_secret(rig: TelegramRig) -> None:
    from mnemo.gateway.metrics import Metrics
    from mnemo.gateway.webserver import WebServer

    settings = rig.settings(**{"telegram.webhook_url": "https://bot.example.org/telegram"})
    adapter = rig.adapter(settings, web=WebServer(settings.web, Metrics()))
    with pytest.raises(StartupError, match="TELEGRAM_WEBHOOK_SECRET"):
        await adapter.start(_nowhere)
    assert rig.fake.calls == []


async def test_labels_typing_refresh_and_forbidden(rig: TelegramRig) -> None:
    adapter = rig.adapter(rig.settings(), typing_interval_s=0.05)
    rig.fake.add_chat(CHAT)
    await adapter.start(_nowhere)
    try:
        chat = ChatRef("telegram", str(CHAT))
        await adapter.send(OutboundMessage(chat=chat, text="daily digest", scheduled=True))
        await adapter.send(OutboundMessage(chat=chat, text="the answer", possible_duplicate=True))
        async with adapter.typing(chat):
            await rig.fake.wait_for_call("sendChatAction", 3)
        await asyncio.sleep(0.1)  # a request cut short by the exit may still be recorded
        after = len(rig.fake.calls_to("sendChatAction"))
        await asyncio.sleep(0.3)  # six more refreshes, had typing not stopped
        rig.fake.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
        with pytest.raises(Forbidden, match="blocked"):
            await adapter.send(OutboundMessage(chat=chat, text="nobody listens"))
    finally:
        await adapter.stop()
        await adapter.stop()  # idempotent
    assert [s.plain_text for s in rig.fake.sent] == [
        "⏰ scheduled\n\ndaily digest",
        "(possible duplicate: re-sent after a restart)\n\nthe answer",
    ]
    assert len(rig.fake.calls_to("sendChatAction")) == after, "typing stops with the turn"


# -- a crash ---------------------------------------------------------------------------------------------

MNEMO = [sys.executable, "-m", "mnemo"]


def _process_env(home: Path, fake: FlakyTelegram, emulator: Emulator) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(
        MNEMO_HOME=str(home),
        TELEGRAM_BOT_TOKEN=fake.token,
        TELEGRAM_API_BASE_URL=fake.root,
        ANTHROPIC_BASE_URL=emulator.base_url,
        ANTHROPIC_API_KEY="test-key",
        MNEMO_LOG_LEVEL="warning",
    )
    return env


async def test_after_kill_9_a_pending_inbox_row_and_a_queued_reply_are_each_answered_once(
    rig: TelegramRig, fake: FlakyTelegram, emulator: Emulator, home: Path
) -> None:
    (home / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "access": {"allowed": ["telegram:*"], "rate_limit_per_minute": 0},
                "web": {"enabled": False, "port": 0},
                "gateway": {"debounce_s": 0},
            }
        )
    )
    hold = asyncio.Event()

    async def responder(request: RecordedRequest) -> Reply:
        text = last_user_text(request)
        if text == "question B" and not hold.is_set():
            await hold.wait()  # the first process dies while B's turn waits on the model
        return Reply(text=f"answer to {text}")

    emulator.default = responder
    fake.sends_down = True
    first = await asyncio.create_subprocess_exec(
        *MNEMO, "run", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=_process_env(home, fake, emulator),
    )  # fmt: skip
    try:
        fake.push_text(1001, 1001, "question A")
        await fake.wait_for_call("sendMessage", 1, timeout=60)  # A's reply is stored, not delivered
        fake.push_text(1002, 1002, "question B")
        await emulator.wait_for_requests(2, timeout=30)

        def outbox_waits() -> bool:
            with sqlite3.connect(home / "state.db") as db:
                row = db.execute("SELECT state, not_before FROM outbox").fetchone()
            # queued, with the next attempt far enough away that the kill cannot hit a send
            return row is not None and row[0] == "queued" and row[1] - time.time() > 0.3

        await wait_until(outbox_waits, timeout=30)
        first.send_signal(signal.SIGKILL)
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    hold.set()
    with sqlite3.connect(home / "state.db") as db:
        inbox = dict(db.execute("SELECT json_extract(payload, '$.text'), state FROM inbox").fetchall())
    assert inbox == {"question A": "done", "question B": "processing"}
    assert [s.plain_text for s in fake.sent] == []

    fake.sends_down = False
    async with rig.app():
        await fake.wait_for_sent(2, timeout=30)
        await asyncio.sleep(0.5)
    texts = sorted(s.plain_text for s in fake.sent)
    assert texts == ["answer to question A", "answer to question B"], "each answered exactly once"
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("SELECT DISTINCT state FROM inbox").fetchall() == [("done",)]
        assert db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall() == [("sent", 2)]
    asked_b = [r for r in emulator.requests if last_user_text(r) == "question B"]
    assert len(asked_b) == 2, "asked once before the crash (never answered) and once after"
