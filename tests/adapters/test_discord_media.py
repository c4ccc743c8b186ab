"""Discord attachments end to end (issue 18): an image attachment, read from its CDN URL
through discord.py's HTTP client, reaches the model as an image block."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

from mnemo.gateway.emulator import Emulator, Reply
from tests.adapters.discord_harness import running_bot
from tests.fakes.telegram_world import jpeg


async def test_an_image_attachment_in_a_dm_reaches_the_model(home: Path, emulator: Emulator) -> None:
    emulator.default = lambda request: Reply(text="a small picture")
    picture = jpeg(30, 20)
    async with running_bot(home, emulator) as bot:
        await bot.say(bot.alice_dm, bot.alice, "what is this?", files=[("pic.jpg", "image/jpeg", picture)])
        [sent] = await bot.sent(1)
    assert sent.body["content"] == "a small picture"
    [request] = emulator.requests
    last = request.messages[-1]["content"]
    assert [b["type"] for b in last] == ["image", "text"]
    assert base64.b64decode(last[0]["source"]["data"]) == picture  # small: sent as it came
    assert last[1]["text"] == "what is this?"


async def test_a_file_name_is_stored_and_shown_without_nul_or_path(home: Path, emulator: Emulator) -> None:
    emulator.default = lambda request: Reply(text="read")
    async with running_bot(home, emulator) as bot:
        await bot.say(
            bot.alice_dm, bot.alice, "read this", files=[("../../x\x00evil.txt", "text/plain", b"file words")]
        )
        await bot.sent(1)
    text = str(emulator.requests[-1].messages[-1]["content"])
    assert "[file xevil.txt]" in text and "file words" in text
    with sqlite3.connect(home / "state.db") as db:
        inbox = "\n".join(row[0] for row in db.execute("SELECT payload FROM inbox"))
    for where in (text, inbox):
        assert "\x00" not in where and "../" not in where
    assert '"name": "xevil.txt"' in inbox
