"""A cron run killed with kill -9 mid-run: the next start runs it again (it is still
within the misfire grace) and the chat gets exactly one message.

Real processes: ``mnemo chat`` (the console adapter, platform ``cli``) with a job for
its own chat; the emulator holds the first process's request while it is killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.emulator.script import RecordedRequest

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

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


async def _read_until(stream: asyncio.StreamReader, text: str, timeout: float) -> str:
    seen = ""

    async def read() -> None:
        nonlocal seen
        while text not in seen:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"output ended before {text!r}: {seen!r}")
            seen += line.decode()

    await asyncio.wait_for(read(), timeout)
    return seen


async def test_kill_9_during_a_cron_run_then_restart_delivers_exactly_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    hold = asyncio.Event()
    calls = 0

    async def responder(rec: RecordedRequest) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:
            await hold.wait()  # the first process dies while this request is in flight
        return Reply(text="the one reminder")

    # The job is due before the first process starts: it runs as soon as it is up.
    assert (
        await asyncio.to_thread(
            main, ["--home", str(home), "cron", "add", "--chat", "cli:bob", "--in", "1s", "Remind", "bob"]
        )
        == 0
    )
    await asyncio.sleep(1.1)
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
        await emu.wait_for_requests(1, timeout=60)  # a fresh interpreter on a busy machine
        first.send_signal(signal.SIGKILL)
        await first.wait()

        second = await asyncio.create_subprocess_exec(
            *MNEMO,
            "chat",
            "--user",
            "bob",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(home, emu.base_url),
        )
        assert second.stdout is not None and second.stdin is not None
        out = await _read_until(second.stdout, "the one reminder", 90)
        second.stdin.close()
        rest, _ = await asyncio.wait_for(second.communicate(), 60)
        hold.set()
        assert second.returncode == 0
        assert (out + rest.decode()).count("the one reminder") == 1
        assert "⏰ scheduled the one reminder" in out, "labelled as a scheduled message"
        assert calls == 2

    db = sqlite3.connect(home / "state.db")
    assert db.execute("SELECT state, trigger FROM cron_runs").fetchall() == [("delivered", "schedule")]
    assert db.execute("SELECT state FROM outbox WHERE kind = 'cron'").fetchall() == [("sent",)]
    assert db.execute("SELECT state FROM cron_jobs").fetchall() == [("done",)]
