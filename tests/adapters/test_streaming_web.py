"""Streaming replies in the web chat: token frames over the real websocket while the
real anthropic SDK streams from the emulator, then the final reply frame that takes the
live bubble's place — on the wire and in the page itself (headless chromium)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.async_api import expect

from mnemo.gateway.emulator import Emulator, Reply
from tests.adapters.test_web_browser import send
from tests.support.webchat import ChatClient, open_web_app, web_settings

ALICE = "alice-0123456789"
TEXT = "Here is a **long** answer, written one token at a time so the page can show it. " * 12


async def frames_until_reply(chat: ChatClient) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tokens: list[dict[str, Any]] = []
    while True:
        for _ in range(2):
            for i, frame in enumerate(chat.buffer):
                if frame["type"] == "reply":
                    return tokens, chat.buffer.pop(i)
                if frame["type"] == "token":
                    tokens.append(chat.buffer.pop(i))
                    break
        msg = await chat.ws.receive(timeout=30)
        chat.buffer.append(msg.json())


def replay(tokens: list[dict[str, Any]]) -> list[str]:
    """What the page's live bubble shows after each token frame."""
    shown, out = "", []
    for t in tokens:
        shown = t["text"] if "text" in t else shown + t["delta"]
        out.append(shown)
    return out


async def test_a_reply_streams_token_by_token_then_the_final_frame_replaces_it(
    home: Path, emulator: Emulator, http
) -> None:
    emulator.script(Reply(text=TEXT, chunk_delay=0.005))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("tell me")
        tokens, reply = await frames_until_reply(chat)
    assert emulator.requests[0].stream
    assert len(tokens) >= 2, "token frames before the final text"
    assert {t["id"] for t in tokens} == {reply["replaces"]}, "one live bubble, and the reply replaces it"
    assert sum("delta" in t for t in tokens) >= len(tokens) - 1, "tokens append"
    views = replay(tokens)
    assert all(TEXT.startswith(v) for v in views), "the live text is always a prefix of the answer"
    assert reply["text"] == TEXT.strip() and reply["id"].startswith("o")


async def test_streaming_off_for_the_web_sends_only_the_reply(home: Path, emulator: Emulator, http) -> None:
    emulator.script(Reply(text=TEXT, chunk_delay=0.005))
    settings = web_settings(home, **{"streaming.platforms": {"web": False}})
    async with open_web_app(settings, emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("tell me")
        tokens, reply = await frames_until_reply(chat)
    assert tokens == [] and "replaces" not in reply
    assert not emulator.requests[0].stream
    assert reply["text"] == TEXT.strip()


async def test_the_page_shows_the_live_text_then_exactly_one_rendered_reply(
    home: Path,
    emulator: Emulator,
    browser,
) -> None:
    emulator.script(Reply(text=TEXT, chunk_delay=0.02))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(f"{app.web.url}/")
        await expect(page.locator("#status")).to_have_text("connected")
        await send(page, "tell me")
        live = page.locator("li.msg.bot.live")
        await expect(live).to_have_count(1)
        await expect(live).to_contain_text("Here is a long answer, written one token")
        await expect(live).to_have_count(0, timeout=30_000)
        bots = page.locator("li.msg.bot")
        await expect(bots).to_have_count(1)
        await expect(bots.first.locator("strong").first).to_have_text("long")
        await page.reload()
        await expect(page.locator("li.msg.bot")).to_have_count(1)  # the live bubble was never stored
        assert errors == []
