"""Web chat uploads end to end: ``POST /upload`` → a message frame naming the upload →
the gateway (``WebAdapter.fetch_media``, ``gateway.media``) → the real anthropic SDK →
the emulator, which validates image and document blocks as the Messages API does."""

from __future__ import annotations

import base64
import io
import os
import stat
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from PIL import Image

from mnemo.adapters.web_uploads import MAX_UPLOAD_BYTES
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from mnemo.gateway.media import MAX_IMAGE_SIDE
from tests.adapters.telegram_harness import wait_until
from tests.contract.conftest import BACKENDS
from tests.fakes.telegram_world import jpeg
from tests.support.hostile_media import jpeg_declaring, png_declaring
from tests.support.webchat import ChatClient, open_web_app, web_settings

ALICE = "alice-0123456789"
BOB = "bob-0123456789ab"
MINI_PDF = (
    b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
    b"2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n"
    b"3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >> endobj\n"
    b"trailer << /Root 1 0 R >>\n%%EOF\n"
)


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(out, "PNG")
    return out.getvalue()


async def upload(
    http: aiohttp.ClientSession, url: str, user: str, data: bytes, media_type: str, name: str
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": media_type, "X-File-Name": quote(name)}
    async with http.post(f"{url}/upload", params={"user": user}, data=data, headers=headers) as resp:
        return resp.status, await resp.json()


def blocks_of(request: RecordedRequest, kind: str) -> list[dict[str, Any]]:
    return [
        b for m in request.messages if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"] if b.get("type") == kind
    ]  # fmt: skip


async def test_a_photo_with_a_caption_reaches_the_model_as_an_image_block(
    home: Path, emulator: Emulator, http
) -> None:
    emulator.default = lambda _: Reply(text="a blue square")
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        status, body = await upload(
            http, app.web.url, ALICE, png(2400, 1200), "image/png", "holiday/é pic.png"
        )
        assert status == 200, body
        assert (body["kind"], body["media_type"], body["name"]) == ("photo", "image/png", "é pic.png")
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.send(
            {"type": "message", "id": "m-photo", "text": "what is this?", "attachments": [body["id"]]}
        )
        assert (await chat.next("ack"))["id"] == "m-photo"
        reply = await chat.next("reply", timeout=30)
        assert reply["text"] == "a blue square"
        session = await app.store.active_session(f"web:dm:{ALICE}")
        [user_row, _] = await app.store.load_messages(session.id)
        await chat.close()
    [image] = blocks_of(emulator.requests[-1], "image")
    assert image["source"]["media_type"] == "image/png"
    with Image.open(io.BytesIO(base64.b64decode(image["source"]["data"]))) as img:
        assert img.size == (MAX_IMAGE_SIDE, MAX_IMAGE_SIDE // 2), "scaled so the long side is 1,568 px"
    assert "what is this?" in str(emulator.requests[-1].messages[-1]["content"])
    assert user_row.content == "what is this?" and user_row.meta["media"][0]["kind"] == "image"
    folder = home / "media" / "uploads"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (folder / ALICE).iterdir())


async def test_a_pdf_and_a_text_file_go_in_like_on_the_other_platforms(
    home: Path, emulator: Emulator, http
) -> None:
    emulator.default = lambda _: Reply(text="read them")
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        _, pdf = await upload(http, app.web.url, ALICE, MINI_PDF, "application/pdf", "report.pdf")
        _, notes = await upload(
            http, app.web.url, ALICE, b"the launch is on Tuesday", "text/markdown", "notes.md"
        )
        _, binary = await upload(
            http, app.web.url, ALICE, b"\x00\x01binary", "application/x-msdownload", "tool.exe"
        )
        assert pdf["kind"] == notes["kind"] == binary["kind"] == "document"
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.send(
            {
                "type": "message",
                "id": "m-docs",
                "text": "",
                "attachments": [pdf["id"], notes["id"], binary["id"]],
            }
        )
        await chat.next("reply", timeout=30)
        await chat.close()
    request = emulator.requests[-1]
    [doc] = blocks_of(request, "document")
    assert base64.b64decode(doc["source"]["data"]) == MINI_PDF
    text = str(request.messages[-1]["content"])
    assert "[file notes.md]" in text and "the launch is on Tuesday" in text
    assert "I can't read this kind of file" in text and "tool.exe" in text


@pytest.mark.parametrize(
    ("data", "media_type", "status", "message"),
    [
        (b"\xff\xd8\xff\xe0 not really a jpeg", "image/jpeg", 400, "the image is damaged or not an image"),
        (jpeg(40, 30)[:60], "image/jpeg", 400, "the image is damaged or not an image"),
        (b"", "image/png", 400, "the file is empty"),
    ],
    ids=["garbage", "truncated", "empty"],
)
async def test_a_corrupt_image_is_refused_with_a_clear_message(
    home: Path, emulator: Emulator, http, data: bytes, media_type: str, status: int, message: str
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        got = await upload(http, app.web.url, ALICE, data, media_type, "x.jpg")
    assert got == (status, {"error": message})
    assert not (home / "media" / "uploads" / ALICE).exists() or not list(
        (home / "media" / "uploads" / ALICE).iterdir()
    )


async def test_an_image_format_the_model_cannot_take_is_refused(home: Path, emulator: Emulator, http) -> None:
    out = io.BytesIO()
    Image.new("RGB", (20, 20)).save(out, "BMP")
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        status, body = await upload(http, app.web.url, ALICE, out.getvalue(), "image/bmp", "x.bmp")
    assert (status, body["error"]) == (415, "an image format I can't read (BMP; JPEG, PNG, GIF and WebP are)")


@pytest.mark.parametrize(
    ("data", "media_type", "message"),
    [
        (png_declaring(50_000, 50_000), "image/png", "this image is too large to read"),
        (png_declaring(12_000, 12_000), "image/png", "this image is too large to read (12000×12000 pixels)"),
        (
            jpeg_declaring(6000, 6000, progressive=True),
            "image/jpeg",
            "this image is too large to read (6000×6000 pixels)",
        ),
    ],
    ids=["50000x50000-png", "12000x12000-png", "progressive-jpeg-bomb"],
)
async def test_an_image_too_large_to_decode_is_refused_before_decoding(
    home: Path, emulator: Emulator, http, data: bytes, media_type: str, message: str
) -> None:
    # Issue 26: the 50000×50000 header raised DecompressionBombError: a 500.
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        got = await upload(http, app.web.url, ALICE, data, media_type, "bomb.img")
    assert got == (413, {"error": message})


async def test_an_oversize_file_is_refused_with_a_clear_message(home: Path, emulator: Emulator, http) -> None:
    big = b"%PDF-1.4\n" + b"0" * MAX_UPLOAD_BYTES
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        status, body = await upload(http, app.web.url, ALICE, big, "application/pdf", "big.pdf")
        assert (status, body) == (413, {"error": "the file is too large (10.0 MB; at most 10 MB)"})

        async def chunks():  # no Content-Length: refused while it is being read
            for _ in range(11):
                yield b"x" * (1024 * 1024)

        headers = {"Content-Type": "text/plain", "X-File-Name": "big.txt"}
        async with http.post(
            f"{app.web.url}/upload", params={"user": ALICE}, data=chunks(), headers=headers
        ) as resp:
            assert resp.status == 413 and (await resp.json())["error"].startswith("the file is too large")


async def test_an_upload_belongs_to_its_user_and_unknown_ids_are_refused(
    home: Path, emulator: Emulator, http
) -> None:
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        _, body = await upload(http, app.web.url, ALICE, jpeg(50, 40), "image/jpeg", "a.jpg")
        bob = await ChatClient.connect(http, app.web.url, BOB)
        await bob.send({"type": "message", "id": "m-steal", "text": "mine?", "attachments": [body["id"]]})
        error = await bob.next("error")
        assert error == {
            "type": "error",
            "text": "an attached file is no longer there; attach it again",
            "id": "m-steal",
            "retry": False,
        }
        await bob.send({"type": "message", "id": "m-bad", "text": "x", "attachments": ["../../etc/passwd"]})
        assert (await bob.next("error"))["id"] == "m-bad"
        await bob.send({"type": "message", "id": "m-many", "text": "x", "attachments": [body["id"]] * 11})
        assert "at most 10" in (await bob.next("error"))["text"]
        await bob.close()
        async with http.post(f"{app.web.url}/upload", params={"user": "no"}, data=b"x") as resp:
            assert resp.status == 400
    assert emulator.requests == [], "nothing reached the model"


async def test_the_token_and_origin_rules_cover_uploads(home: Path, emulator: Emulator, http) -> None:
    token = "web-token-0123456789abcdef"
    async with open_web_app(web_settings(home, **{"web.access_token": token}), emulator.base_url) as app:
        status, _ = await _raw_upload(http, app.web.url, {})
        assert status == 401
        status, _ = await _raw_upload(
            http, app.web.url, {"Authorization": f"Bearer {token}", "Origin": "http://evil.example"}
        )
        assert status == 403
        status, body = await _raw_upload(http, app.web.url, {"Authorization": f"Bearer {token}"})
        assert status == 200 and body["kind"] == "photo"


async def _raw_upload(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    headers = {"Content-Type": "image/jpeg", **headers}
    async with http.post(f"{url}/upload", params={"user": ALICE}, data=jpeg(20, 20), headers=headers) as resp:
        return resp.status, (
            await resp.json() if resp.content_type == "application/json" else await resp.text()
        )


@pytest.mark.browser
async def test_the_page_attaches_a_photo_and_shows_why_a_damaged_one_is_refused(
    home: Path, emulator: Emulator, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright, expect

    from tests.adapters.conftest import CHROMIUM, CHROMIUM_ARGS

    emulator.default = lambda _: Reply(text="a small orange picture")
    photo, broken = tmp_path / "sunset.jpg", tmp_path / "broken.png"
    photo.write_bytes(jpeg(64, 48))
    broken.write_bytes(b"\x89PNG\r\n\x1a\n damaged")
    async with open_web_app(web_settings(home), emulator.base_url) as app, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(f"{app.web.url}/")
            await expect(page.locator("#status")).to_have_text("connected")
            await page.set_input_files("#file", str(broken))
            await expect(page.locator("#note")).to_have_text(
                "broken.png: the image is damaged or not an image"
            )
            await page.set_input_files("#file", str(photo))
            await expect(page.locator("#attached")).to_have_text("Attached: sunset.jpg")
            await page.get_by_role("button", name="Send").click()  # no caption: the photo alone
            await expect(page.locator("li.msg.bot")).to_contain_text("a small orange picture")
            await expect(page.locator("li.msg.me")).to_contain_text("[attached: sunset.jpg]")
            await expect(page.locator("#attached")).to_be_hidden()
            assert errors == []
        finally:
            await browser.close()
    [image] = blocks_of(emulator.requests[-1], "image")
    assert base64.b64decode(image["source"]["data"]) == jpeg(64, 48)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_uploads_are_refused_past_the_daily_quotas(
    home: Path, emulator: Emulator, http, backend: str, request: pytest.FixtureRequest
) -> None:
    # Issue 26: 30 uploads of 10 MB from 3 made-up ids were all taken (315 MB).
    mb = 2**20
    database = (
        {"database.url": request.getfixturevalue("pg_cluster").fresh_database()}
        if backend == "postgresql"
        else {}
    )
    quota = {
        **database,
        "media.quota.per_person_daily_bytes": 3 * mb,
        "media.quota.global_daily_bytes": 7 * mb,
        "media.quota.per_person_total_bytes": None,
        "media.quota.global_total_bytes": None,
    }
    statuses: dict[str, list[int]] = {}
    async with open_web_app(web_settings(home, **quota), emulator.base_url) as app:
        for n in range(12):
            user = f"made-up-id-{n % 3}"
            headers = {"Content-Type": "text/plain", "X-File-Name": f"f{n}.txt"}
            data = bytes([n]) * mb
            async with http.post(
                f"{app.web.url}/upload", params={"user": user}, data=data, headers=headers
            ) as r:
                statuses.setdefault(user, []).append(r.status)
                if r.status == 429:
                    body = await r.json()
                    assert int(r.headers["Retry-After"]) > 0
                    assert "reached today's limit for files" in body["error"]
    assert statuses == {
        "made-up-id-0": [200, 200, 200, 429],
        "made-up-id-1": [200, 200, 429, 429],  # the bot's 7 MB went at the 7th upload
        "made-up-id-2": [200, 200, 429, 429],
    }
    stored = sorted((home / "media" / "uploads").rglob("*.bin"))
    assert len(stored) == 7, "a refused upload is not written"


async def test_an_upload_past_the_total_space_is_413(home: Path, emulator: Emulator, http) -> None:
    quota = {"media.quota.per_person_total_bytes": 2048, "media.quota.global_total_bytes": None}
    async with open_web_app(web_settings(home, **quota), emulator.base_url) as app:
        first = await upload(http, app.web.url, ALICE, b"a" * 1500, "text/plain", "a.txt")
        second = await upload(http, app.web.url, ALICE, b"b" * 1500, "text/plain", "b.txt")
        again = await upload(http, app.web.url, ALICE, b"a" * 1500, "text/plain", "a.txt")
    assert first[0] == 200 and again[0] == 200, "the same file again takes no more space"
    assert second == (
        413,
        {"error": "your files fill the space you have on this bot (2 KB); ask its operator for more"},
    )


async def test_uploads_a_day_old_are_removed_whoever_made_them_and_free_their_quota(
    home: Path, emulator: Emulator, http
) -> None:
    # Issue 26: an old upload was removed only when the same id uploaded again.
    quota = {"media.quota.per_person_total_bytes": 4000}
    settings = web_settings(home, **quota)
    async with open_web_app(settings, emulator.base_url) as app:
        status, body = await upload(http, app.web.url, ALICE, b"x" * 3000, "text/plain", "old.txt")
        assert status == 200
        assert (await upload(http, app.web.url, ALICE, b"y" * 3000, "text/plain", "new.txt"))[0] == 413
    day_ago = time.time() - 24 * 3600 - 60
    for path in (home / "media" / "uploads" / ALICE).iterdir():
        os.utime(path, (day_ago, day_ago))
    async with open_web_app(settings, emulator.base_url) as app:  # the sweep runs at start, then hourly
        await wait_until(lambda: not (home / "media" / "uploads" / ALICE / f"{body['id']}.bin").exists())
        chat = await ChatClient.connect(http, app.web.url, ALICE)
        await chat.send({"type": "message", "id": "m-old", "text": "x", "attachments": [body["id"]]})
        assert (await chat.next("error"))["text"] == "an attached file is no longer there; attach it again"
        await chat.close()
        assert (await upload(http, app.web.url, ALICE, b"y" * 3000, "text/plain", "new.txt"))[0] == 200
