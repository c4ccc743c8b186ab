"""The context preflight counts the images and PDFs a request re-sends, as the API (and
the emulator) counts them: width × height / 750 after scaling, ~1,500 per PDF page. A
chat whose text fits but whose images do not is trimmed before it is sent, instead of
being refused by the API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.emulator.cache import block_tokens
from mnemo.gateway.media import IMAGE_TOKENS_UNKNOWN, MediaStore, ref_tokens
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig
from tests.fakes.telegram_world import jpeg

CHAT = USER = 4711
MINI_PDF = (
    b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
    b"2 0 obj << /Type /Pages /Kids [3 0 R 4 0 R] /Count 2 >> endobj\n"
    b"3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >> endobj\n"
    b"4 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >> endobj\n"
    b"trailer << /Root 1 0 R >>\n%%EOF\n"
)


@pytest.mark.parametrize("size", [(1568, 1568), (3000, 2000), (800, 600), (90, 60), (40, 1900)])
def test_an_images_estimate_is_what_the_emulator_counts(home: Path, size: tuple[int, int]) -> None:
    store = MediaStore(home)
    [ref] = store.prepare("photo", "p.jpg", "image/jpeg", jpeg(*size)).refs
    [block] = store.blocks([ref], show=True)
    assert ref_tokens(ref) == block_tokens(block)


def test_a_pdf_counts_per_page_and_an_old_reference_gets_the_default(home: Path) -> None:
    store = MediaStore(home)
    [ref] = store.prepare("document", "r.pdf", "application/pdf", MINI_PDF).refs
    [block] = store.blocks([ref], show=True)
    assert ref["pages"] == 2 and ref_tokens(ref) == block_tokens(block) == 3000
    assert ref_tokens({"kind": "image", "file": "x.jpg", "media_type": "image/jpeg"}) == IMAGE_TOKENS_UNKNOWN


def test_only_the_turns_that_still_show_their_images_count(home: Path) -> None:
    store = MediaStore(home, history_images=2)
    refs = [store.prepare("photo", f"{n}.jpg", "image/jpeg", jpeg(750, 100 * (n + 1))).refs for n in range(4)]
    rows = [SimpleNamespace(role="user", meta={"media": r}) for r in refs]
    rows.insert(1, SimpleNamespace(role="assistant", meta={}))
    rows.insert(2, SimpleNamespace(role="user", meta={}))
    assert store.shown_tokens(rows) == 300 + 400  # the last two image turns: 750 × 300 / 750, 750 × 400 / 750


@pytest.fixture
async def telegram() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username="mnemo_test_bot") as server:
        yield server


async def test_a_chat_whose_images_do_not_fit_is_trimmed_before_it_is_sent(
    telegram: FlakyTelegram, emulator: Emulator, home: Path
) -> None:
    window, answer = 16384, 1024
    budget = int((window - answer) * 0.9)  # the preflight's margin (gateway/turns/agent.py)
    emulator.default = lambda _: Reply(text="seen")
    rig = TelegramRig(telegram, emulator, home)
    trimmed: list[bool] = []

    async def listener(ctx, result) -> None:
        trimmed.append(result.context_trimmed)

    settings = {"llm.context_window": window, "llm.max_tokens": answer, "compression.enabled": False}
    async with rig.app(**settings) as (app, _):
        app.gateway.turn_listeners.append(listener)
        telegram.push_text(CHAT, USER, "hello")
        await telegram.wait_for_sent(1)
        usage = emulator.requests[-1].usage or {}
        used = sum(
            int(usage.get(k) or 0)
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
        # Text that leaves 5,000 tokens of the budget free: two 1568 px images (3,278
        # tokens each) do not fit in what is left, one does.
        filler = budget - used - 5000
        assert filler > 1000, f"the fixed part of a request is too large for this test: {used}"
        telegram.push_document(
            CHAT, USER, ("word " * (filler * 4 // 5)).encode(), file_name="notes.txt", mime_type="text/plain"
        )
        await telegram.wait_for_sent(2)
        for n in range(2):
            telegram.push_image(
                CHAT, USER, jpeg(1568, 1568, (n * 90, 40, 40)), width=1568, height=1568, caption=f"photo {n}"
            )
            await telegram.wait_for_sent(3 + n)
        await asyncio.sleep(0)
    assert trimmed == [False, False, False, True], "the second image no longer fits: trimmed before sending"
    last = emulator.requests[-1]
    images = [
        b
        for m in last.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "image"
    ]
    assert images and "photo 1" in str(last.messages[-1]["content"]), "the newest image is sent"
    assert "earlier messages are left out of this request" in str(last.messages)
    usage = last.usage or {}
    sent = sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    assert sent <= window - answer, "what was sent fits the window as the emulator counts it"
