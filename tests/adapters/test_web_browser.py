"""The web chat page in a real browser: Debian's headless chromium driven by Playwright
(never a downloaded browser), against the real gateway and the emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from mnemo.adapters.web import WebAdapter
from mnemo.app import open_app
from mnemo.gateway.emulator import TRIAL_LABEL, Emulator, Reply
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.support.webchat import open_web_app, web_settings

pytestmark = pytest.mark.browser


async def send(page: Page, text: str) -> None:
    box = page.get_by_label("Message")
    await box.fill(text)
    await box.press("Enter")


async def test_type_a_message_and_see_the_reply_rendered_safely(
    home: Path, emulator: Emulator, browser
) -> None:
    emulator.script(
        Reply(text='Here is **bold**, `code` and <img src=x onerror="window.pwned=1">\n\n- one\n- two'),
        Reply(text="Welcome back."),
    )
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(f"{app.web.url}/")
        await expect(page.locator("#status")).to_have_text("connected")
        await send(page, "hello from the browser")

        reply = page.locator("li.msg.bot").first
        await expect(reply).to_contain_text("Here is bold")
        await expect(reply.locator("strong")).to_have_text("bold")
        await expect(reply.locator("code")).to_have_text("code")
        await expect(reply.locator("li")).to_have_text(["one", "two"])
        # The HTML in the reply is shown as text, never run.
        await expect(reply).to_contain_text('<img src=x onerror="window.pwned=1">')
        assert await reply.locator("img").count() == 0
        assert await page.evaluate("window.pwned === undefined")
        await expect(page.locator("li.msg.me")).to_have_text(["You" + "hello from the browser"])
        await expect(page.locator("li.msg.me.pending")).to_have_count(0)  # acknowledged
        assert "TRIAL" not in await page.content()

        user = await page.evaluate("localStorage.getItem('mnemo.user')")
        assert emulator.last_request.body["messages"][-1]["content"][-1]["text"] == "hello from the browser"
        assert await app.store.active_session(f"web:dm:{user}") is not None

        # A reload keeps the transcript and continues the same chat.
        await page.reload()
        await expect(page.locator("#status")).to_have_text("connected")
        await expect(page.locator("li.msg")).to_have_count(2)
        await send(page, "still me")
        await expect(page.locator("li.msg.bot")).to_have_count(2)
        await expect(page.locator("li.msg.bot").last).to_contain_text("Welcome back.")
        assert len(emulator.last_request.body["messages"]) == 3, "same session after the reload"
        assert errors == []


async def test_trial_mode_shows_the_banner_and_labels_scripted_replies(home: Path, browser) -> None:
    settings = web_settings(home)
    server = WebServer(settings.web, Metrics())
    adapter = WebAdapter(server, trial=True)
    async with open_app(settings, adapters=[adapter], web=server, trial=True):
        page = await browser.new_page()
        await page.goto(f"{server.url}/")
        banner = page.get_by_role("alert")
        await expect(banner).to_be_visible()
        await expect(banner).to_contain_text("SCRIPTED")
        await send(page, "my name is Ada")
        await expect(page.locator("li.msg.bot").first).to_contain_text(TRIAL_LABEL)


async def inbox_count(app) -> int:
    return await app.db.read(lambda c: c.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])


async def test_a_paste_over_the_limit_is_refused_on_the_page_and_the_chat_keeps_working(
    home: Path, emulator: Emulator, browser
) -> None:
    emulator.script(Reply(text="Got the short one."))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        page = await browser.new_page()
        frames: list[str] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda payload: frames.append(str(payload))))
        await page.goto(f"{app.web.url}/")
        await expect(page.locator("#status")).to_have_text("connected")
        await send(page, "x" * (300 * 1024))  # a 300 KiB paste
        note = page.locator("#note")
        await expect(note).to_be_visible()
        await expect(note).to_contain_text("Nothing was sent")
        assert await page.get_by_label("Message").input_value() == "x" * (300 * 1024), (
            "the text stays in the box"
        )
        await expect(page.locator("li.msg.me")).to_have_count(0)
        assert not any("xxxx" in f for f in frames), "nothing went over the socket"
        await expect(page.locator("#status")).to_have_text("connected")

        await send(page, "a short one")
        await expect(page.locator("li.msg.bot")).to_contain_text("Got the short one.")
        await expect(note).to_be_hidden()
        assert await inbox_count(app) == 1


async def test_a_message_the_server_refused_is_dropped_from_the_pending_store_and_never_resent(
    home: Path, emulator: Emulator, browser
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        page = await browser.new_page()
        await page.goto(f"{app.web.url}/")
        await expect(page.locator("#status")).to_have_text("connected")
        user = await page.evaluate("localStorage.getItem('mnemo.user')")
        # What an older page left behind: an over-long paste and a lone surrogate, both pending.
        await page.evaluate(
            """(user) => localStorage.setItem('mnemo.history.' + user, JSON.stringify([
                 {role: 'user', id: 'bigpaste0001', text: 'y'.repeat(300 * 1024), pending: true},
                 {role: 'user', id: 'surrogate001', text: 'bad \\ud800 text', pending: true}]))""",
            user,
        )
        await page.reload()
        await expect(page.locator("li.msg.me.error")).to_have_count(2)
        await expect(page.locator("li.msg.me.pending")).to_have_count(0)
        stored = await page.evaluate("(u) => JSON.parse(localStorage.getItem('mnemo.history.' + u))", user)
        assert [e.get("pending") for e in stored] == [None, None]
        assert all(e.get("error") for e in stored)

        await page.reload()  # nothing left to resend
        await expect(page.locator("#status")).to_have_text("connected")
        await expect(page.locator("li.msg.me.error")).to_have_count(2)
        assert await inbox_count(app) == 0
