"""Images and documents end to end (issue 18): the real ``TelegramAdapter`` against the fake
Bot API (photos, documents, getFile, file downloads), the gateway, and the emulator, which
validates image and document blocks as the Messages API does."""

from __future__ import annotations

import asyncio
import base64
import io
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mnemo.cli.main import main
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from mnemo.gateway.events import Attachment, InboundMessage
from mnemo.gateway.media import (
    CANNOT_READ,
    MAX_ATTACHMENTS_PER_TURN,
    MAX_IMAGE_SIDE,
    OLD_IMAGE,
)
from mnemo.gateway.transcription import NOT_SET_UP as VOICE_NOT_SET_UP
from mnemo.gateway.transcription import TRANSCRIBED
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig, last_user_text
from tests.fakes.telegram_world import jpeg
from tests.fakes.transcription import FakeTranscriber
from tests.support.hostile_media import jpeg_declaring, pdf, png_declaring

CHAT = USER = 4711
BOT = "mnemo_test_bot"

MINI_PDF = (
    b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
    b"2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n"
    b"3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >> endobj\n"
    b"trailer << /Root 1 0 R >>\n%%EOF\n"
)


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


def blocks_of(request: RecordedRequest, kind: str) -> list[dict[str, Any]]:
    return [
        b
        for m in request.messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == kind
    ]


async def test_a_photo_with_a_caption_reaches_the_model_as_an_image_block(
    rig: TelegramRig, home: Path
) -> None:
    rig.emulator.script(Reply(text="A red square."))
    big = jpeg(3000, 2000)
    async with rig.app() as _:
        rig.fake.push_image(CHAT, USER, big, width=3000, height=2000, caption="what is in this picture?")
        [sent] = await rig.fake.wait_for_sent(1)
    assert sent.plain_text == "A red square."
    [request] = rig.emulator.requests
    [image] = blocks_of(request, "image")
    assert image["source"]["media_type"] == "image/jpeg"
    with Image.open(io.BytesIO(base64.b64decode(image["source"]["data"]))) as img:
        assert max(img.size) == MAX_IMAGE_SIDE  # scaled down, aspect kept
        assert img.size[1] == round(2000 * MAX_IMAGE_SIDE / 3000)
    last = request.messages[-1]["content"]
    assert [b["type"] for b in last] == ["image", "text"] and last[-1]["text"] == "what is in this picture?"
    assert rig.fake.calls_to("getFile")
    media = home / "media"
    [stored] = list(media.iterdir())
    assert stat.S_IMODE(media.stat().st_mode) == 0o700 and stat.S_IMODE(stored.stat().st_mode) == 0o600


async def test_only_the_last_three_image_turns_resend_their_images(
    rig: TelegramRig, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.emulator.default = lambda request: Reply(text="seen")
    async with rig.app() as _:
        for n in range(5):
            content = jpeg(40 + n, 30, (n * 40, 10, 10))
            rig.fake.push_image(
                CHAT, USER, content, width=40 + n, height=30, caption=f"picture number {n} of a kiwi{n}"
            )
            await rig.fake.wait_for_sent(n + 1)
    fifth = rig.emulator.requests[-1]
    images = blocks_of(fifth, "image")
    assert len(images) == 3
    sizes = []
    for block in images:
        with Image.open(io.BytesIO(base64.b64decode(block["source"]["data"]))) as img:
            sizes.append(img.size[0])
    assert sizes == [42, 43, 44]  # the newest three, in order
    placeholders = [b for b in blocks_of(fifth, "text") if b["text"] == OLD_IMAGE]
    assert len(placeholders) == 2
    assert "picture number 0 of a kiwi0" in str(fifth.messages[0]["content"])  # the caption stays
    # session search finds an image message by its caption
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--home", str(home), "sessions", "search", "kiwi1"]) == 0
    assert "picture number 1" in capsys.readouterr().out


async def test_a_pdf_is_a_document_block_and_text_files_are_inlined(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text="read it")
    async with rig.app() as _:
        rig.fake.push_document(
            CHAT,
            USER,
            MINI_PDF,
            file_name="report.pdf",
            mime_type="application/pdf",
            caption="summarise this",
        )
        await rig.fake.wait_for_sent(1)
        rig.fake.push_document(
            CHAT, USER, ("x" * 60_000).encode(), file_name="notes.md", mime_type="text/markdown"
        )
        await rig.fake.wait_for_sent(2)
        rig.fake.push_document(
            CHAT, USER, b"\x00\x01binary", file_name="tool.exe", mime_type="application/x-msdownload"
        )
        await rig.fake.wait_for_sent(3)
    first, second, third = rig.emulator.requests
    [doc] = blocks_of(first, "document")
    assert doc["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(doc["source"]["data"]) == MINI_PDF
    inlined = last_user_text(second)
    assert "[file notes.md]" in inlined and "[cut: only the first 50,000 characters" in inlined
    assert CANNOT_READ in last_user_text(third) and "tool.exe" in last_user_text(third)


async def test_bad_input_is_a_note_and_the_turn_goes_on(rig: TelegramRig, home: Path) -> None:
    rig.emulator.default = lambda request: Reply(text="ok")
    async with rig.app() as _:
        # a corrupt image, an oversize file (declared over 20 MB), a failed download
        rig.fake.push_document(
            CHAT,
            USER,
            b"\xff\xd8\xff not really",
            file_name="broken.jpg",
            mime_type="image/jpeg",
            caption="look",
        )
        await rig.fake.wait_for_sent(1)
        rig.fake.push_document(
            CHAT,
            USER,
            b"small",
            file_name="huge.pdf",
            mime_type="application/pdf",
            file_size=21 * 1024 * 1024,
            caption="and this",
        )
        await rig.fake.wait_for_sent(2)
        rig.fake.fail_next("getFile", status=400, description="Bad Request: file is too big")
        rig.fake.push_image(CHAT, USER, jpeg(), width=64, height=48, caption="and this one")
        await rig.fake.wait_for_sent(3)
    corrupt, oversize, failed = (last_user_text(r) for r in rig.emulator.requests)
    assert corrupt.startswith("look") and "damaged or not an image" in corrupt
    assert "too large (over 20 MB)" in oversize
    assert "the download failed" in failed
    assert not any(blocks_of(r, "image") for r in rig.emulator.requests)
    assert not (home / "media").exists()  # nothing stored, not even half


async def test_a_voice_note_is_transcribed_stored_and_searchable(
    rig: TelegramRig, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.emulator.default = lambda request: Reply(text="noted")
    async with FakeTranscriber(
        transcripts={b"OggS voice-1": "remind me to buy saffron tomorrow"}, api_key="stt-key"
    ) as stt:
        async with rig.app(**{"transcription.url": stt.url, "transcription.api_key": "stt-key"}) as _:
            rig.fake.push_voice(CHAT, USER, b"OggS voice-1")
            await rig.fake.wait_for_sent(1)
            rig.fake.push_voice(CHAT, USER, b"OggS unreadable")
            await rig.fake.wait_for_sent(2)
    first, second = rig.emulator.requests
    assert last_user_text(first) == f"{TRANSCRIBED} remind me to buy saffron tomorrow"
    assert "could not be transcribed" in last_user_text(second)
    assert next((u.content_type, u.model, u.authorization) for u in stt.uploads) == (
        "audio/ogg",
        "whisper-1",
        "Bearer stt-key",
    )
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--home", str(home), "sessions", "search", "saffron"]) == 0
    assert "remind me to buy saffron" in capsys.readouterr().out


async def test_without_a_transcription_server_voice_gets_one_notice_per_hour(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text="hello")
    async with rig.app() as _:
        for _n in range(3):
            rig.fake.push_voice(CHAT, USER, b"OggS hi")
        await rig.fake.wait_for_sent(1)
        rig.fake.push_text(CHAT, USER, "and text")  # queued behind the voice notes in the chat's lane
        await rig.fake.wait_for_sent(2)
        await asyncio.sleep(0.2)
    assert [s.plain_text for s in rig.fake.sent] == [VOICE_NOT_SET_UP, "hello"]
    assert len(rig.emulator.requests) == 1 and not rig.fake.calls_to("getFile")


async def test_an_oversized_album_reads_the_first_ten_and_says_so(rig: TelegramRig) -> None:
    """Fifty photos reaching one turn: ten are read, one note for the rest."""
    rig.emulator.default = lambda request: Reply(text="many pictures")
    async with rig.app() as (app, _):
        rig.fake.add_chat(CHAT)
        refs = [rig.fake.world.photo_of(jpeg(20 + n, 20), 20 + n, 20)[0]["file_id"] for n in range(50)]
        msg = InboundMessage(
            platform="telegram",
            chat_id=str(CHAT),
            user_id=str(USER),
            message_id="9001",
            text="my album",
            attachments=tuple(Attachment(kind="photo", ref=r, media_type="image/jpeg") for r in refs),
        )
        await app.gateway.submit(msg)
        [sent] = await rig.fake.wait_for_sent(1)
    assert sent.plain_text == "many pictures"
    [request] = rig.emulator.requests
    assert len(blocks_of(request, "image")) == MAX_ATTACHMENTS_PER_TURN
    assert "[40 more attachment(s) not read: at most 10 per message]" in last_user_text(request)


async def test_image_and_pdf_bombs_are_one_note_each_and_the_caption_is_answered(
    rig: TelegramRig, home: Path
) -> None:
    # Issue 26: a 50000×50000 header raised DecompressionBombError through the turn
    # ("Sorry — something went wrong", the caption lost); 12000×12000 was decoded whole
    # (hundreds of MB); a progressive JPEG keeps coefficients for its declared size;
    # a 20,000-page PDF was stored and re-sent to a model that takes 100 pages.
    rig.emulator.default = lambda request: Reply(text="answered")
    files = [
        ("tiny-bomb.png", "image/png", png_declaring(50_000, 50_000), "this image is too large to read"),
        ("huge.png", "image/png", png_declaring(12_000, 12_000), "this image is too large to read"),
        ("bomb.jpg", "image/jpeg", jpeg_declaring(6000, 6000, progressive=True), "too large to read"),
        ("long.pdf", "application/pdf", pdf(20_000), "the PDF has 20,000 pages; I can read at most 100"),
        ("hidden.pdf", "application/pdf", pdf(150, object_stream=True), "the PDF has 150 pages"),
    ]
    async with rig.app() as _:
        for n, (name, mime, data, _) in enumerate(files):
            rig.fake.push_document(CHAT, USER, data, file_name=name, mime_type=mime, caption=f"caption {n}")
            await rig.fake.wait_for_sent(n + 1, timeout=30)
    assert [s.plain_text for s in rig.fake.sent] == ["answered"] * len(files)
    for n, (request, (name, _, _, expected)) in enumerate(zip(rig.emulator.requests, files, strict=True)):
        text = last_user_text(request)
        assert text.startswith(f"caption {n}") and f"({name}): " in text and expected in text, text
        assert not blocks_of(request, "image") and not blocks_of(request, "document")
    assert not (home / "media").exists()  # nothing stored


async def test_the_largest_images_still_read_are_scaled_and_sent(rig: TelegramRig) -> None:
    rig.emulator.default = lambda request: Reply(text="seen")
    async with rig.app() as _:
        # A baseline JPEG far over the decode bound is read at 1/8 scale (draft).
        rig.fake.push_document(CHAT, USER, jpeg(8000, 6000), file_name="big.jpg", mime_type="image/jpeg")
        await rig.fake.wait_for_sent(1, timeout=30)
    [image] = blocks_of(rig.emulator.requests[0], "image")
    with Image.open(io.BytesIO(base64.b64decode(image["source"]["data"]))) as img:
        assert img.size == (MAX_IMAGE_SIDE, MAX_IMAGE_SIDE * 3 // 4)


async def test_a_document_name_reaches_the_store_and_the_model_without_nul_or_path(
    rig: TelegramRig, home: Path
) -> None:
    # Issue 26: "../../x\x00evil.txt" reached the model and the stored message as sent.
    rig.emulator.default = lambda request: Reply(text="read")
    async with rig.app() as (app, _):
        rig.fake.push_document(
            CHAT, USER, b"hello from a file", file_name="../../x\x00evil.txt", mime_type="text/plain",
            caption="what does it say?",
        )  # fmt: skip
        rig.fake.push_document(
            CHAT, USER, b"\x00\x01", file_name="..\\..\\tool\u202eexe.bin", mime_type="application/x-bin"
        )
        await rig.fake.wait_for_sent(2)
        session = await app.store.active_session(f"telegram:dm:{CHAT}")
        assert session is not None
        rows = await app.store.load_messages(session.id)
        inbox = await asyncio.to_thread(_inbox_payloads, home / "state.db")
    stored = "\n".join(r.content for r in rows if r.role == "user")
    sent = "\n".join(last_user_text(r) for r in rig.emulator.requests)
    for where in (stored, sent, inbox):
        assert "\x00" not in where and "../" not in where and "..\\" not in where and "\u202e" not in where
    assert "[file xevil.txt]" in stored and "[file xevil.txt]" in sent
    assert "(toolexe.bin)" in stored and "(toolexe.bin)" in sent
    assert '"name": "xevil.txt"' in inbox


def _inbox_payloads(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return "\n".join(row[0] for row in conn.execute("SELECT payload FROM inbox"))


async def test_a_photo_past_the_daily_quota_is_a_note_and_the_caption_is_answered(
    rig: TelegramRig, home: Path
) -> None:
    rig.emulator.default = lambda request: Reply(text="answered")
    first, second = jpeg(600, 400, (200, 10, 10)), jpeg(600, 400, (10, 200, 10))
    limit = len(first) + len(second) // 2
    async with rig.app(**{"media.quota.per_person_daily_bytes": limit}) as _:
        rig.fake.push_image(CHAT, USER, first, width=600, height=400, caption="first picture")
        await rig.fake.wait_for_sent(1)
        rig.fake.push_image(CHAT, USER, second, width=600, height=400, caption="second picture")
        await rig.fake.wait_for_sent(2)
        rig.fake.push_image(CHAT, USER, first, width=600, height=400, caption="the first again")
        await rig.fake.wait_for_sent(3)
    one, two, three = rig.emulator.requests
    assert len(blocks_of(one, "image")) == 1
    refused = last_user_text(two)
    assert refused.startswith("second picture")
    assert (
        "not kept: you've reached today's limit for files" in refused and "more can be sent after" in refused
    )
    assert [s.plain_text for s in rig.fake.sent] == ["answered"] * 3
    assert len(blocks_of(three, "image")) == 2, "the same picture again takes no more space"
    assert len(list((home / "media").iterdir())) == 1
