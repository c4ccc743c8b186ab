"""Crash safety with real processes: kill -9 during a turn, restart, the message is
answered exactly once; a restart never asks the model again for a stored reply."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mnemo.gateway.emulator import Emulator, Reply
from tests.gateway.conftest import make_settings
from tests.support.loopback import LoopbackAdapter

MNEMO = [sys.executable, "-m", "mnemo"]


def _env(home: Path, base_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(
        MNEMO_HOME=str(home),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="test-key",
        MNEMO_LOG_LEVEL="warning",
    )
    return env


@pytest.mark.slow
async def test_kill_9_during_a_turn_then_restart_answers_exactly_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    hold = asyncio.Event()
    calls = 0

    async def responder(request):
        nonlocal calls
        calls += 1
        if calls == 1:
            await hold.wait()  # the first process dies while this request is in flight
        return Reply(text="the one and only answer")

    async with Emulator(responder=responder) as emu:
        first = await asyncio.create_subprocess_exec(
            *MNEMO,
            "chat",
            "--user",
            "bob",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(home, emu.base_url),
        )
        assert first.stdin is not None
        first.stdin.write(b"hello, are you there?\n")
        await first.stdin.drain()
        await emu.wait_for_requests(1, timeout=60)  # a fresh interpreter on a busy machine
        first.send_signal(signal.SIGKILL)
        await first.wait()
        out_first = await first.stdout.read() if first.stdout else b""
        assert b"the one and only answer" not in out_first

        second = await asyncio.create_subprocess_exec(
            *MNEMO,
            "chat",
            "--user",
            "bob",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(home, emu.base_url),
        )
        out, err = await asyncio.wait_for(second.communicate(), 90)
        hold.set()
        assert second.returncode == 0, err.decode()
        assert out.decode().count("the one and only answer") == 1
        retry = emu.requests[-1].body["messages"]
        user_texts = [
            m["content"] if isinstance(m["content"], str) else m["content"][-1]["text"]
            for m in retry
            if m["role"] == "user"
        ]
        assert user_texts == ["hello, are you there?"], "the stored user message is not duplicated"

    db = sqlite3.connect(home / "state.db")
    roles = [r[0] for r in db.execute("SELECT role FROM messages ORDER BY id")]
    assert roles == ["user", "assistant"]
    assert db.execute("SELECT state FROM inbox").fetchall() == [("done",)]
    assert db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall() == [("sent", 1)]


async def test_restart_never_asks_the_model_again_for_a_stored_reply(home: Path) -> None:
    from mnemo.app import open_app

    settings = make_settings(home)
    async with Emulator() as emu:
        emu.script(Reply(text="stored answer"))
        adapter = LoopbackAdapter()
        async with open_app(
            settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
        ) as app:
            await adapter.say("question", message_id="q1")
            await adapter.wait_sent(1)
            # The process "died" after the reply was stored but before it was queued:
            # the inbox row is still processing and the outbox has no row for it.
            await app.db.write(lambda c: c.execute("UPDATE inbox SET state = 'processing'"))
            await app.db.write(lambda c: c.execute("DELETE FROM outbox"))
        requests_before = len(emu.requests)
        adapter2 = LoopbackAdapter()
        async with open_app(
            settings, adapters=[adapter2], llm_base_url=emu.base_url, api_key="k", trial=False
        ):
            sent = await adapter2.wait_sent(1)
            await asyncio.sleep(0.2)
        assert [m.text for m in sent] == ["stored answer"]
        assert len(emu.requests) == requests_before, "no new LLM request for a reply already stored"


async def test_reply_in_flight_at_crash_is_resent_labelled(home: Path) -> None:
    from mnemo.app import open_app

    settings = make_settings(home)
    async with Emulator() as emu:
        emu.script(Reply(text="answer"))
        adapter = LoopbackAdapter()
        adapter.down = True  # the first send fails; the row stays queued
        async with open_app(
            settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
        ) as app:
            await adapter.say("question")
            for _ in range(100):
                if (await app.outbox.counts()).get("queued"):
                    break
                await asyncio.sleep(0.02)
            # Simulate a death mid-send: the row is left 'sending'.
            await app.db.write(lambda c: c.execute("UPDATE outbox SET state = 'sending'"))
            await app.gateway.delivery.stop()
        adapter2 = LoopbackAdapter()
        async with open_app(
            settings, adapters=[adapter2], llm_base_url=emu.base_url, api_key="k", trial=False
        ):
            sent = await adapter2.wait_sent(1)
        assert sent[0].text == "answer" and sent[0].possible_duplicate
