"""``mnemo run`` as a real process: out of the box it serves the web chat in local trial
mode; a platform token without an LLM key is a start-up error."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from mnemo.gateway.emulator import TRIAL_LABEL
from tests.support.webchat import ChatClient

REPO = Path(__file__).resolve().parents[2]


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Nothing from the host's environment (no API key may leak in)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


async def start(home: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mnemo", "--home", str(home), "run",
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def read_until(
    stream: asyncio.StreamReader, pattern: re.Pattern[str], seen: list[str]
) -> re.Match[str]:
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("mnemo run ended before printing: " + pattern.pattern + "\n" + "".join(seen))
        seen.append(line)
        found = pattern.search(line)
        if found:
            return found


@pytest.mark.slow
async def test_run_with_nothing_configured_serves_the_web_chat_in_trial_mode(
    home: Path, tmp_path: Path
) -> None:
    proc = await start(home, clean_env(tmp_path, MNEMO_WEB_PORT="0"))
    seen: list[str] = []
    try:
        url = (
            await asyncio.wait_for(read_until(proc.stderr, re.compile(r"web chat: (http://\S+)/"), seen), 60)
        )[1]
        await asyncio.wait_for(read_until(proc.stderr, re.compile(r"\*\*\* LOCAL TRIAL MODE"), seen), 10)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":8765")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/") as resp:
                page = await resp.text()
                assert resp.status == 200 and page.lower().count("trial mode") == 1, "the banner says it once"
            chat = await ChatClient.connect(http, url, "cli-run-user-01")
            await chat.say("hello, who are you?")
            reply = await chat.next("reply", timeout=30)
            assert reply["text"].startswith(TRIAL_LABEL), "trial replies are labelled as scripted"
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 200 and (await resp.json())["adapters"] == {"web": True}
            await chat.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.stderr is not None
        seen.append((await proc.stderr.read()).decode())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (home / "state.db").exists()
    assert "".join(seen).count("SCRIPTED model") == 1, "the banner is printed once, not logged again"


async def test_a_platform_token_without_an_llm_key_exits_2_with_one_clear_line(
    home: Path, tmp_path: Path
) -> None:
    token = "4242000001:AAsecretsecretsecretsecretsecret00"
    proc = await start(home, clean_env(tmp_path, TELEGRAM_BOT_TOKEN=token, MNEMO_WEB_PORT="0"))
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("mnemo: ") and "telegram" in lines[0] and "ANTHROPIC_API_KEY" in lines[0]
    assert token not in err.decode() + out.decode()
    assert not (home / "state.db").exists(), "refused before anything started"


async def test_a_public_bind_without_a_token_exits_2(home: Path, tmp_path: Path) -> None:
    proc = await start(home, clean_env(tmp_path, MNEMO_WEB_HOST="0.0.0.0", MNEMO_WEB_PORT="0"))
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "MNEMO_WEB_TOKEN" in err.decode()
