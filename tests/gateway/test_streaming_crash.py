"""Crash safety of streamed replies with real processes: ``mnemo run`` against the fake
Telegram Bot API and the Anthropic emulator is killed with SIGKILL while a reply is
being streamed into a Telegram message; after a restart the answer is completed once —
the half-written message is first marked as interrupted, then becomes the answer — and
no second copy of the answer is ever sent."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnemo.adapters.telegram_format import render_chunks
from mnemo.adapters.telegram_html import parse_telegram_html
from mnemo.gateway.delivery.streams import INTERRUPTED
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.adapters.telegram_harness import wait_until
from tests.fakes.telegram_api import FakeTelegram

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

MNEMO = [sys.executable, "-m", "mnemo"]
CHAT = 1001
ANSWER = "The **complete** answer, written slowly so it streams for a while. " * 30


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def _env(home: Path, fake: FakeTelegram, emulator: Emulator) -> dict[str, str]:
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


async def _run(home: Path, fake: FakeTelegram, emulator: Emulator) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *MNEMO, "run", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=_env(home, fake, emulator),
    )  # fmt: skip


async def _end(proc: asyncio.subprocess.Process, sig: int) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)
    await asyncio.wait_for(proc.wait(), 60)


def bot_messages(fake: FakeTelegram) -> list[dict[str, Any]]:
    found = [
        m for (cid, _), m in fake.world.messages.items() if cid == CHAT and m["from"]["id"] == fake.bot_id
    ]
    return sorted(found, key=lambda m: m["message_id"])


async def test_kill_9_mid_stream_then_restart_completes_the_answer_once(
    fake: FakeTelegram, emulator: Emulator, home: Path
) -> None:
    (home / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "access": {"allowed": ["telegram:*"], "rate_limit_per_minute": 0},
                "web": {"enabled": False, "port": 0},
                "gateway": {"debounce_s": 0},
                "streaming": {"enabled": True, "min_interval_s": 1.0},
            }
        )
    )
    calls = 0

    def responder(request: RecordedRequest) -> Reply:
        nonlocal calls
        calls += 1
        # The first run streams slowly enough (~30 s) to be killed half-way; the re-run is quick.
        return Reply(text=ANSWER, chunk_delay=0.35 if calls == 1 else 0.004)

    emulator.default = responder
    first = await _run(home, fake, emulator)
    try:
        fake.push_text(CHAT, CHAT, "please explain at length")
        await fake.wait_for_call("editMessageText", 2, timeout=60)  # shown, and edited twice
        first.send_signal(signal.SIGKILL)
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    [half] = bot_messages(fake)
    assert half["text"] != to_visible(ANSWER), "killed half-way"
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("SELECT message_id FROM streams").fetchall() == [(str(half["message_id"]),)]
        assert db.execute("SELECT COUNT(*) FROM outbox").fetchone() == (0,)
        roles = [r[0] for r in db.execute("SELECT role FROM messages ORDER BY id")]
    assert roles == ["user"], "the partial answer was never stored"
    edits_before = len(fake.edits)

    second = await _run(home, fake, emulator)
    try:
        chunks = render_chunks(ANSWER, 4096)

        def completed() -> bool:
            return any(e.parse_mode == "HTML" and e.message_id == half["message_id"] for e in fake.edits)

        await wait_until(completed, timeout=60)

        def settled() -> bool:
            with sqlite3.connect(home / "state.db") as db:
                return (
                    db.execute("SELECT state FROM outbox").fetchall() == [("sent",)]
                    and not db.execute("SELECT 1 FROM streams").fetchall()
                )

        await wait_until(settled, timeout=30)
        await asyncio.sleep(0.5)  # anything else it would send, it sends now
    finally:
        await _end(second, signal.SIGTERM)
    assert calls == 2, "asked once before the crash (never answered) and once after"
    after = [e for e in fake.edits[edits_before:] if e.message_id == half["message_id"]]
    assert after[0].plain_text == INTERRUPTED, "the half-written message is marked first"
    assert after[-1].text == chunks[0].html and after[-1].parse_mode == "HTML"
    messages = bot_messages(fake)
    assert [m["message_id"] for m in messages] == [half["message_id"]], "no second copy of the answer"
    assert messages[0]["text"] == to_visible(ANSWER)
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("SELECT DISTINCT state FROM inbox").fetchall() == [("done",)]
        assert [r[0] for r in db.execute("SELECT role FROM messages ORDER BY id")] == ["user", "assistant"]


def to_visible(markdown: str) -> str:
    """What Telegram shows for the reply sent without streaming (its one HTML chunk)."""
    [chunk] = render_chunks(markdown, 4096)
    return parse_telegram_html(chunk.html).text
