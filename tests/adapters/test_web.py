"""The web chat adapter end to end: a websocket client → WebAdapter → the real gateway →
the real anthropic SDK → the emulator, and the reply back over the websocket."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mnemo.adapters.web import TOKEN_COOKIE, WebAdapter
from mnemo.gateway.config import TRIAL_DETAIL, WebSettings
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from mnemo.gateway.errors import StartupError
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.support.webchat import ChatClient, open_web_app, outbox_rows, web_settings

ALICE = "alice-0123456789"
BOB = "bob-0123456789ab"


async def until(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not await predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def delivered(app: Any, chat_id: str, count: int) -> bool:
    """The outbox marks a row sent just after the frame went out: poll for it."""
    return [r["state"] for r in await outbox_rows(app, chat_id)] == ["sent"] * count


async def test_a_websocket_conversation_goes_through_the_gateway(
    home: Path, emulator: Emulator, http
) -> None:
    release = asyncio.Event()

    async def thinking(_: RecordedRequest) -> Reply:
        await release.wait()  # long enough for typing to show (after a second)
        return Reply(text="Hello **Alice**!")

    emulator.script(thinking)
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        message_id = await chat.say("hi there")
        assert (await chat.next("ack"))["id"] == message_id
        assert (await chat.next("typing"))["active"] is True
        release.set()
        assert (await chat.next("typing"))["active"] is False
        reply = await chat.next("reply")
        assert reply["text"] == "Hello **Alice**!"
        assert reply["possible_duplicate"] is False and reply["scheduled"] is False
        assert emulator.last_request.body["messages"][-1]["content"][-1]["text"] == "hi there"
        session = await app.store.active_session(f"web:dm:{ALICE}")
        rows = await app.store.load_messages(session.id)
        assert [(r.role, r.content) for r in rows] == [
            ("user", "hi there"),
            ("assistant", "Hello **Alice**!"),
        ]
        await until(lambda: delivered(app, ALICE, 1))


async def test_a_reload_continues_the_same_chat(home: Path, emulator: Emulator, http) -> None:
    emulator.script(Reply(text="first"), Reply(text="second"))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("one")
        await chat.next("reply")
        await chat.close()
        again = await ChatClient.connect(http, app.web.url, ALICE)
        await again.say("two")
        assert (await again.next("reply"))["text"] == "second"
        sent = [m["content"] for m in emulator.last_request.body["messages"]]
        assert len(sent) == 3, "the second request carries the first exchange: same session"
        assert len(await app.store.list_sessions(None)) == 1


async def test_a_reply_reaches_every_open_page_of_its_chat_and_no_other(
    home: Path, emulator: Emulator, http
) -> None:
    emulator.script(Reply(text="for alice"), Reply(text="for bob"))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        tab1 = await ChatClient.connect(http, app.web.url, ALICE)
        tab2 = await ChatClient.connect(http, app.web.url, ALICE)
        bob = await ChatClient.connect(http, app.web.url, BOB)
        await tab1.say("hello from tab one")
        assert (await tab1.next("reply"))["text"] == "for alice"
        assert (await tab2.next("reply"))["text"] == "for alice"
        await bob.say("hello from bob")
        assert (await bob.next("reply"))["text"] == "for bob", "bob's first reply is his own, not alice's"


async def test_a_reply_for_a_closed_page_waits_in_the_outbox_and_arrives_on_reconnect(
    home: Path, emulator: Emulator, http
) -> None:
    release = asyncio.Event()

    async def held(_: RecordedRequest) -> Reply:
        await release.wait()
        return Reply(text="sorry for the wait")

    emulator.script(held)
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("are you there?")
        await chat.next("ack")
        await chat.close()
        release.set()

        async def failed_once() -> bool:
            rows = await outbox_rows(app, ALICE)
            return bool(rows) and rows[0]["state"] == "queued" and rows[0]["attempts"] >= 1

        await until(failed_once)
        # After a long absence the row's backoff is minutes: reconnecting must not wait for it.
        [row] = await outbox_rows(app, ALICE)
        await app.outbox.mark_retry(row["id"], 3600.0, "test: a long backoff")
        back = await ChatClient.connect(http, app.web.url, ALICE)
        reply = await back.next("reply")
        assert reply["text"] == "sorry for the wait"
        assert reply["id"] == f"o{row['id']}", "the reply id is its outbox row, so the page can drop a resend"
        await until(lambda: delivered(app, ALICE, 1))


async def test_a_resent_message_is_answered_once(home: Path, emulator: Emulator, http) -> None:
    emulator.script(Reply(text="once"), Reply(text="twice"))
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("hello", message_id="client-id-1")
        await chat.next("ack")
        await chat.next("reply")
        # The page resends what it has no ack for after a reconnect; the inbox drops it.
        await chat.say("hello", message_id="client-id-1")
        await chat.next("ack")
        await chat.say("next", message_id="client-id-2")
        assert (await chat.next("reply"))["text"] == "twice"
        assert len(emulator.requests) == 2


@pytest.mark.parametrize(
    "user",
    [
        "",
        "short",
        "x" * 7,
        "a" * 65,
        "../../../etc/passwd",
        "has space inside",
        "ünïcödé-user-id",
        "semi;colon-user",
    ],  # fmt: skip
)
async def test_a_bad_user_id_is_refused_before_the_websocket_opens(
    home: Path, emulator: Emulator, http, user
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{app.web.url}/ws", params={"user": user})
        assert err.value.status == 400
        assert not (app.settings.memories_dir / "users").exists()


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        '["message"]',
        {"type": "shout", "id": "m1", "text": "hi"},
        {"type": "message", "id": "bad id!", "text": "hi"},
        {"type": "message", "id": "x" * 65, "text": "hi"},
        {"type": "message", "id": "m1", "text": "   "},
        {"type": "message", "id": "m1", "text": 42},
        {"type": "message", "id": "m1", "text": "y" * 32_001},
    ],
)
async def test_a_malformed_frame_gets_an_error_and_stores_nothing(
    home: Path, emulator: Emulator, http, frame
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.send(frame)
        assert (await chat.next("error"))["text"]
        await chat.say("still works")
        await chat.next("ack")
        assert len(await app.inbox.unfinished()) + len(await outbox_rows(app, ALICE)) >= 1
        stored = await app.db.read(lambda c: c.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])
        assert stored == 1, "only the valid message reached the inbox"


async def test_the_token_is_required_when_configured(home: Path, emulator: Emulator, http) -> None:
    token = "correct-horse-battery-staple"
    emulator.script(Reply(text="authorised"))
    async with open_web_app(web_settings(home, **{"web.access_token": token}), emulator.base_url) as app:
        base = app.web.url
        for url in (f"{base}/", f"{base}/?token=wrong", f"{base}/chat.js"):
            async with http.get(url) as resp:
                assert resp.status == 401, url
        for params in ({}, {"token": "wrong"}):
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await http.ws_connect(f"{base}/ws", params={"user": ALICE, **params})
            assert err.value.status == 401
        async with http.get(f"{base}/", params={"token": token}) as resp:
            assert resp.status == 200
            cookie = resp.cookies[TOKEN_COOKIE]
            assert cookie.value == token and cookie["httponly"] and cookie["samesite"] == "Strict"
        by_query = await ChatClient.connect(http, base, ALICE, params={"token": token})
        await by_query.close()
        by_header = await ChatClient.connect(http, base, ALICE, headers={"Authorization": f"Bearer {token}"})
        await by_header.close()
        # The cookie the page set lets a reload (and the page's websocket) in without ?token=.
        async with aiohttp.ClientSession(cookies={TOKEN_COOKIE: token}) as browser:
            async with browser.get(f"{base}/") as resp:
                assert resp.status == 200
            chat = await ChatClient.connect(browser, base, ALICE)
            await chat.say("let me in")
            assert (await chat.next("reply"))["text"] == "authorised"


def test_a_non_loopback_bind_without_a_token_is_refused() -> None:
    with pytest.raises(StartupError, match="not a loopback address"):
        WebServer(WebSettings(host="0.0.0.0"), Metrics())
    with pytest.raises(StartupError, match="MNEMO_WEB_TOKEN"):
        WebServer(WebSettings(host="192.168.1.20"), Metrics())
    WebServer(WebSettings(host="0.0.0.0", access_token="a-long-random-token"), Metrics())  # allowed with one
    WebServer(WebSettings(host="::1"), Metrics())
    # (`mnemo run` turning this into exit 2 is pinned in tests/gateway/test_cli_run.py.)


async def test_a_cross_site_websocket_and_a_foreign_host_are_refused(
    home: Path, emulator: Emulator, http
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        base = app.web.url
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{base}/ws", params={"user": ALICE}, origin="https://evil.example")
        assert err.value.status == 403
        same = await ChatClient.connect(http, base, ALICE, origin=base)
        await same.close()
        # DNS rebinding: a foreign name resolving to 127.0.0.1 arrives with its own Host.
        async with http.get(f"{base}/", headers={"Host": f"evil.example:{app.web.port}"}) as resp:
            assert resp.status == 403
        async with http.get(f"{base}/", headers={"Host": f"localhost:{app.web.port}"}) as resp:
            assert resp.status == 200


async def test_the_page_is_self_contained_and_shows_the_trial_banner_only_in_trial(home: Path, http) -> None:
    pages = {}
    for trial in (True, False):
        server = WebServer(WebSettings(port=0), Metrics())
        WebAdapter(server, trial=trial)
        await server.start()
        try:
            async with http.get(f"{server.url}/") as resp:
                pages[trial] = await resp.text()
                csp = resp.headers["Content-Security-Policy"]
            async with http.get(f"{server.url}/chat.js") as resp:
                script = await resp.text()
                assert resp.content_type == "application/javascript"
            async with http.get(f"{server.url}/chat.css") as resp:
                style = await resp.text()
        finally:
            await server.stop()
    assert TRIAL_DETAIL in pages[True] and 'role="alert"' in pages[True]
    assert pages[True].lower().count("trial mode") == 1, "the banner does not repeat itself"
    assert "TRIAL" not in pages[False]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    # Offline machine: nothing is loaded from elsewhere.
    assert not re.search(r'(src|href)="(https?:)?//', pages[True])
    assert "url(" not in style and "@import" not in style
    assert "innerHTML" not in script, "the bot's text is rendered with DOM nodes only"


# --- refusals the page must not resend -------------------------------------------------
async def test_an_over_long_frame_gets_an_error_naming_it_and_the_socket_stays_open(
    home: Path, emulator: Emulator, http
) -> None:
    from mnemo.adapters.web import MAX_FRAME_BYTES

    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.say("x" * (MAX_FRAME_BYTES + 10), "big1")  # a 256 KiB+ paste
        error = await chat.next("error")
        assert error["id"] == "big1" and error["retry"] is False and "too long" in error["text"]
        await chat.say("still works", "small1")
        assert (await chat.next("ack"))["id"] == "small1"
        stored = await app.db.read(lambda c: c.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])
        assert stored == 1


async def test_the_hello_frame_tells_the_page_the_limit(home: Path, emulator: Emulator, http) -> None:
    from mnemo.adapters.web import MAX_TEXT_CHARS

    async with open_web_app(web_settings(home), emulator.base_url) as app:
        ws = await http.ws_connect(f"{app.web.url}/ws", params={"user": ALICE})
        hello = await ws.receive_json()
        assert hello["type"] == "hello" and hello["max_chars"] == MAX_TEXT_CHARS
        await ws.close()


@pytest.mark.parametrize("raw", ['"\\ud800"', '"ok \\udfff then"', '"a\\ud83d"'])
async def test_a_lone_surrogate_is_refused_for_good_not_promised_a_resend(
    home: Path, emulator: Emulator, http, raw: str
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.send('{"type": "message", "id": "sur1", "text": ' + raw + "}")
        error = await chat.next("error")
        assert error["id"] == "sur1" and error["retry"] is False
        assert "surrogate" in error["text"] and "resent" not in error["text"]
        await chat.say("still works", "ok1")
        assert (await chat.next("ack"))["id"] == "ok1"
