"""The fake Bot API, driven by the real python-telegram-bot: if PTB is happy with it and
it refuses what Telegram refuses, adapter tests written against it mean something."""

from __future__ import annotations

import asyncio
import datetime as dt
import html
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from telegram import Bot, BotCommand, Update
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Conflict, InvalidToken, NetworkError, RetryAfter
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters

from tests.fakes.telegram_api import FakeTelegram

CHAT = USER = 4711


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def build_app(fake: FakeTelegram) -> Application:
    return (
        ApplicationBuilder()
        .token(fake.token)
        .base_url(fake.root + "/bot")
        .base_file_url(fake.root + "/file/bot")
        .build()
    )


@asynccontextmanager
async def polling(app: Application) -> AsyncIterator[Application]:
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0, timeout=1)
        try:
            yield app
        finally:
            await app.updater.stop()
            await app.stop()


@asynccontextmanager
async def bot_for(fake: FakeTelegram, token: str | None = None) -> AsyncIterator[Bot]:
    bot = Bot(token or fake.token, base_url=fake.root + "/bot", base_file_url=fake.root + "/file/bot")
    async with bot:
        yield bot


def recording_app(fake: FakeTelegram, inbox: asyncio.Queue[Update]) -> Application:
    async def on_message(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await inbox.put(update)

    app = build_app(fake)
    app.add_handler(MessageHandler(filters.ALL, on_message))
    return app


async def next_update(inbox: asyncio.Queue[Update]) -> Update:
    return await asyncio.wait_for(inbox.get(), timeout=10)


# -- the application lifecycle -------------------------------------------------------------


async def test_polling_app_receives_a_message_and_replies_in_html(fake: FakeTelegram) -> None:
    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        text = f"<b>Echo</b>: {html.escape(update.message.text)}"
        await update.message.reply_text(text, parse_mode=ParseMode.HTML)

    app = build_app(fake)
    app.add_handler(MessageHandler(filters.TEXT, echo))
    async with polling(app):
        fake.push_text(CHAT, USER, "a < b & c", username="alice")
        [sent] = await fake.wait_for_sent(1)

    assert (sent.chat_id, sent.parse_mode, sent.plain_text) == (CHAT, "HTML", "Echo: a < b & c")
    assert sent.entities == ({"type": "bold", "offset": 0, "length": 4},)
    assert [c.method for c in fake.calls[:2]] == ["getMe", "deleteWebhook"]
    assert fake.pending_updates == []  # PTB confirmed what it processed before stopping


async def test_a_confirmed_update_is_not_delivered_again(fake: FakeTelegram) -> None:
    inbox: asyncio.Queue[Update] = asyncio.Queue()
    first = fake.push_text(CHAT, USER, "first")
    async with polling(recording_app(fake, inbox)):
        update = await next_update(inbox)
    assert (update.update_id, update.message.text) == (first["update_id"], "first")  # type: ignore[union-attr]  # None fails the test

    second = fake.push_text(CHAT, USER, "second")
    async with polling(recording_app(fake, inbox)):  # a restart: a new Application
        update = await next_update(inbox)
    assert (update.update_id, update.message.text) == (second["update_id"], "second")  # type: ignore[union-attr]  # None fails the test
    assert inbox.empty()
    assert second["update_id"] > first["update_id"]
    assert second["message"]["message_id"] > first["message"]["message_id"]


async def test_429_raises_retry_after_with_the_servers_value(
    fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # PTB 22.2+ warns on the int form
    fake.add_chat(CHAT)
    fake.fail_next("sendMessage", status=429, retry_after=7)
    async with bot_for(fake) as bot:
        with pytest.raises(RetryAfter) as caught:
            await bot.send_message(CHAT, "hello")
        assert caught.value.retry_after == dt.timedelta(seconds=7)
        await bot.send_message(CHAT, "hello again")  # the fault was for one call only
    assert [c.status for c in fake.calls_to("sendMessage")] == [429, 200]
    assert [m.text for m in fake.sent] == ["hello again"]


async def test_malformed_html_is_refused_like_telegram(fake: FakeTelegram) -> None:
    fake.add_chat(CHAT)
    async with bot_for(fake) as bot:
        for text in ("<b>never closed", "1 < 2", "<p>paragraph</p>", "fish & chips"):
            with pytest.raises(BadRequest) as caught:
                await bot.send_message(CHAT, text, parse_mode=ParseMode.HTML)
            assert "can't parse entities" in str(caught.value).lower()
        await bot.send_message(CHAT, "fish & chips")  # fine without a parse mode
    [call, *_] = fake.calls_to("sendMessage")
    assert call.status == 400 and call.params["text"] == "<b>never closed"
    assert [m.text for m in fake.sent] == ["fish & chips"]


async def test_length_is_counted_in_utf16_after_entity_parsing(fake: FakeTelegram) -> None:
    fake.add_chat(CHAT)
    async with bot_for(fake) as bot:
        await bot.send_message(CHAT, "<b>" + "x" * 4096 + "</b>", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match="(?i)message is too long"):
            await bot.send_message(CHAT, "😀" * 2049)  # 4,098 UTF-16 units
        with pytest.raises(BadRequest, match="(?i)message text is empty"):
            await bot.send_message(CHAT, "<b> </b>", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match="(?i)chat not found"):
            await bot.send_message(999, "who?")
    assert len(fake.sent) == 1


# -- getUpdates semantics --------------------------------------------------------------------


async def test_offset_confirms_and_negative_offset_keeps_the_tail(fake: FakeTelegram) -> None:
    ids = [fake.push_text(CHAT, USER, f"m{i}")["update_id"] for i in range(4)]
    async with bot_for(fake) as bot:
        assert [u.update_id for u in await bot.get_updates()] == ids
        assert [u.update_id for u in await bot.get_updates(offset=ids[1] + 1)] == ids[2:]
        assert [u.update_id for u in await bot.get_updates()] == ids[2:]  # the first two are gone
        assert [u.update_id for u in await bot.get_updates(offset=-1)] == ids[3:]
        assert [u.update_id for u in await bot.get_updates(limit=1)] == ids[3:]
        assert await bot.get_updates(offset=ids[3] + 1) == ()


async def test_long_poll_waits_for_an_update_and_a_second_poll_ends_the_first(fake: FakeTelegram) -> None:
    async with bot_for(fake) as bot:
        waiting = asyncio.create_task(bot.get_updates(timeout=30))
        await fake.wait_for_poll()
        pushed = fake.push_text(CHAT, USER, "wake up")
        [update] = await asyncio.wait_for(waiting, 10)
        assert update.update_id == pushed["update_id"]

    # PTB polls over a one-connection pool: a second poller is a second bot instance.
    async with bot_for(fake) as bot, bot_for(fake) as other:
        first = asyncio.create_task(bot.get_updates(offset=update.update_id + 1, timeout=30))
        await fake.wait_for_poll()
        second = asyncio.create_task(other.get_updates(timeout=30))
        with pytest.raises(Conflict, match="terminated by other getUpdates"):
            await asyncio.wait_for(first, 10)
        await fake.wait_for_poll()
        fake.push_text(CHAT, USER, "for the survivor")
        survivor = await asyncio.wait_for(second, 10)
        assert [u.message.text for u in survivor] == ["for the survivor"]  # type: ignore[union-attr]  # None fails the test


async def test_allowed_updates_is_remembered_and_filters_later_updates(fake: FakeTelegram) -> None:
    sent_earlier = fake.push_text(CHAT, USER, "before the filter")
    async with bot_for(fake) as bot:
        await bot.get_updates(offset=sent_earlier["update_id"] + 1, allowed_updates=["callback_query"])
        fake.push_text(CHAT, USER, "filtered out")
        bot_message = await bot.send_message(CHAT, "pick one")
        query = fake.push_callback_query(CHAT, USER, "choice-1", message_id=bot_message.message_id)
        [update] = await bot.get_updates()  # no allowed_updates: the previous setting holds
        assert update.callback_query is not None and update.callback_query.data == "choice-1"
        assert await bot.answer_callback_query(update.callback_query.id, text="ok")
        with pytest.raises(BadRequest, match="(?i)query id is invalid"):
            await bot.answer_callback_query("12345")
    assert [u["message"]["text"] for u in fake.dropped_updates] == ["filtered out"]
    assert update.update_id == query["update_id"]


# -- what users send ---------------------------------------------------------------------------


async def test_group_mention_reply_edit_and_photo_build_realistic_updates(fake: FakeTelegram) -> None:
    group = -100123
    fake.add_chat(group, chat_type="supergroup", title="Team")
    async with bot_for(fake) as bot:
        bot_message = await bot.send_message(group, "I am the bot")
        mention = fake.push_text(group, USER, "hey @mnemo_test_bot 😀 look", chat_type="supergroup")
        reply = fake.push_text(
            group, USER, "answering you", chat_type="supergroup", reply_to=bot_message.message_id
        )
        edit = fake.push_edit(group, mention["message"]["message_id"], "edited text")
        photo = fake.push_photo(CHAT, USER, caption="/start a caption")
        command = fake.push_text(CHAT, USER, "/start@mnemo_test_bot now")
        updates = {u.update_id: u for u in await bot.get_updates()}

        message = updates[mention["update_id"]].message
        assert message is not None and message.chat.type == "supergroup" and message.chat.title == "Team"
        assert list(message.parse_entities(["mention"]).values()) == ["@mnemo_test_bot"]
        replied = updates[reply["update_id"]].message.reply_to_message  # type: ignore[union-attr]  # None fails the test
        assert replied is not None and replied.from_user is not None
        assert (replied.from_user.id, replied.text) == (bot.id, "I am the bot")
        edited = updates[edit["update_id"]].edited_message
        assert edited is not None and edited.text == "edited text" and edited.edit_date is not None
        photo_message = updates[photo["update_id"]].message
        assert photo_message is not None and photo_message.caption == "/start a caption"
        assert list(photo_message.parse_caption_entities(["bot_command"]).values()) == ["/start"]
        file = await bot.get_file(photo_message.photo[-1].file_id)
        assert bytes(await file.download_as_bytearray()).startswith(b"\xff\xd8")
        command_message = updates[command["update_id"]].message
        assert command_message is not None
        assert list(command_message.parse_entities(["bot_command"]).values()) == ["/start@mnemo_test_bot"]


# -- other methods -------------------------------------------------------------------------------


async def test_commands_actions_edits_and_chat_info(fake: FakeTelegram) -> None:
    fake.add_chat(CHAT, username="alice")
    async with bot_for(fake) as bot:
        await bot.set_my_commands(
            [BotCommand("new", "Start a new session"), BotCommand("memory", "Show memory")]
        )
        assert [c.command for c in await bot.get_my_commands()] == ["new", "memory"]
        with pytest.raises(BadRequest):
            await bot.set_my_commands([BotCommand("Bad-Name", "x")])
        assert await bot.delete_my_commands()
        assert await bot.get_my_commands() == ()

        assert await bot.send_chat_action(CHAT, ChatAction.TYPING)
        message = await bot.send_message(CHAT, "draft")
        edited = await bot.edit_message_text(
            "<i>final</i>", CHAT, message.message_id, parse_mode=ParseMode.HTML
        )
        assert edited.text == "final"  # type: ignore[union-attr]  # edit_message_text returns True only for inline messages
        with pytest.raises(BadRequest, match="(?i)not modified"):
            await bot.edit_message_text("<i>final</i>", CHAT, message.message_id, parse_mode=ParseMode.HTML)
        chat = await bot.get_chat(CHAT)
        assert (chat.id, chat.type, chat.username) == (CHAT, "private", "alice")
    assert [(e.message_id, e.plain_text) for e in fake.edits] == [(message.message_id, "final")]
    assert fake.calls_to("sendChatAction")[0].params == {"chat_id": CHAT, "action": "typing"}


async def test_tokens_are_checked_like_the_real_api(fake: FakeTelegram) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.root}/bot123:{'x' * 35}/getMe") as response:
            assert (response.status, (await response.json())["description"]) == (401, "Unauthorized")
        async with http.get(f"{fake.root}/botnot-a-token/getMe") as response:
            assert response.status == 404
        async with http.get(f"{fake.root}/bot{fake.token}/noSuchMethod") as response:
            assert response.status == 404
    with pytest.raises(InvalidToken):
        async with bot_for(fake, token=f"999:{'y' * 35}"):
            pass


async def test_json_bodies_are_accepted_too(fake: FakeTelegram) -> None:
    fake.add_chat(CHAT)
    async with aiohttp.ClientSession() as http:
        reply = {"message_id": 999, "allow_sending_without_reply": True}
        body = {"chat_id": CHAT, "text": "123", "reply_parameters": reply}
        async with http.post(f"{fake.root}/bot{fake.token}/sendMessage", json=body) as response:
            payload = await response.json()
    assert payload["ok"] and payload["result"]["text"] == "123"
    assert fake.sent[0].text == "123" and fake.sent[0].reply_to_message_id is None


async def test_dropped_connections_and_lost_answers(fake: FakeTelegram) -> None:
    fake.add_chat(CHAT)
    async with bot_for(fake) as bot:
        fake.fail_next("sendMessage", drop=True)
        with pytest.raises(NetworkError):
            await bot.send_message(CHAT, "lost before sending")
        fake.fail_next("*", drop=True, processed=True)
        with pytest.raises(NetworkError):
            await bot.send_message(CHAT, "sent, but the answer was lost")
        fake.fail_next("sendMessage", status=502)
        with pytest.raises(NetworkError):
            await bot.send_message(CHAT, "bad gateway")
    assert [m.text for m in fake.sent] == ["sent, but the answer was lost"]
    assert [c.status for c in fake.calls_to("sendMessage")] == [0, 0, 502]


# -- webhooks ------------------------------------------------------------------------------------


@asynccontextmanager
async def webhook_receiver(
    secret: str, answers: list[int]
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A bot-side webhook endpoint that checks the secret and answers from ``answers``."""
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        if request.headers.get("X-Telegram-Bot-Api-Secret-Token") != secret:
            return web.Response(status=403)
        received.append(await request.json())
        return web.Response(status=answers.pop(0) if answers else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook", received
    finally:
        await runner.cleanup()


async def test_webhook_delivery_with_secret_retry_and_conflict(fake: FakeTelegram) -> None:
    async with webhook_receiver("s3cret-token", answers=[500]) as (url, received), bot_for(fake) as bot:
        with pytest.raises(BadRequest, match="(?i)https url must be provided"):
            await bot.set_webhook("http://example.org/hook")
        with pytest.raises(BadRequest, match="(?i)unallowed characters"):
            await bot.set_webhook(url, secret_token="not allowed!")
        assert await bot.set_webhook(url, secret_token="s3cret-token")
        pushed = fake.push_text(CHAT, USER, "via webhook")
        await fake.wait_for_webhook_statuses(2)  # a 500, then delivered again
        assert [u["update_id"] for u in received] == [pushed["update_id"]] * 2
        assert fake.pending_updates == []
        info = await bot.get_webhook_info()
        assert info.url == url and info.last_error_message == "Wrong response from the webhook: 500"
        with pytest.raises(Conflict, match="webhook is active"):
            await bot.get_updates()

        assert await fake.deliver_webhook(url, {"message": pushed["message"]}, "wrong") == 403
        assert await fake.deliver_webhook(url, {"message": pushed["message"]}, None) == 403
        assert await fake.deliver_webhook(None, {"message": pushed["message"]}) == 200

        assert await bot.delete_webhook()
        fake.push_text(CHAT, USER, "polled again")
        assert [u.message.text for u in await bot.get_updates()] == ["polled again"]  # type: ignore[union-attr]  # None fails the test
    assert len(received) == 3
