"""``mnemo run`` as a real process stays up when its platform is unreachable at boot
(``deploy/mnemo.service`` does not restart on exit 2, so exiting would leave the bot
down for good): it serves ``/healthz`` as "degraded" while it retries, connects when
the platform comes back, and stops cleanly on SIGTERM during the retries. A token the
platform refuses is a configuration error: exit 2 with one clear line."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.adapters.telegram_harness import free_port
from tests.fakes.telegram_api import FakeTelegram
from tests.gateway.test_cli_run import clean_env, read_until, start

TIMEOUT = 60.0
HEALTH = re.compile(r"health: (http://\S+)/healthz")


async def healthz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(f"{url}/healthz") as resp:
        return resp.status, await resp.json()


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), TIMEOUT)


@pytest.mark.slow
async def test_telegram_down_at_boot_keeps_the_bot_up_degraded_then_it_connects(
    home: Path, tmp_path: Path
) -> None:
    port = free_port()
    fake = FakeTelegram(port=port)  # not started yet: the port is closed
    env = clean_env(
        tmp_path, ANTHROPIC_API_KEY="x", TELEGRAM_BOT_TOKEN=fake.token,
        TELEGRAM_API_BASE_URL=f"http://127.0.0.1:{port}", MNEMO_WEB_PORT="0",
    )  # fmt: skip
    proc = await start(home, env)
    seen: list[str] = []
    try:
        url = (await asyncio.wait_for(read_until(proc.stderr, HEALTH, seen), TIMEOUT))[1]
        async with aiohttp.ClientSession() as http:
            status, body = await healthz(http, url)
            assert (status, body["status"], body["adapters"]) == (
                503,
                "degraded",
                {"telegram": False, "web": True},
            )
            await asyncio.sleep(2.0)  # a few retries' worth
            assert proc.returncode is None, "".join(seen)
            assert (await healthz(http, url))[1]["status"] == "degraded"
            async with fake:
                await fake.wait_for_poll(TIMEOUT)  # connected and polling
                status, body = await healthz(http, url)
                assert (status, body["status"], body["adapters"]) == (
                    200,
                    "ok",
                    {"telegram": True, "web": True},
                )
                assert await stop(proc) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert fake.calls_to("getMe"), "the adapter started once the Bot API was up"


async def test_sigterm_while_retrying_stops_cleanly(home: Path, tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        tmp_path, ANTHROPIC_API_KEY="x", TELEGRAM_BOT_TOKEN="1:x",
        TELEGRAM_API_BASE_URL=f"http://127.0.0.1:{port}", MNEMO_WEB_PORT="0",
    )  # fmt: skip
    proc = await start(home, env)
    seen: list[str] = []
    try:
        await asyncio.wait_for(read_until(proc.stderr, HEALTH, seen), TIMEOUT)
        assert await stop(proc) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_token_the_platform_refuses_exits_2_with_one_clear_line(home: Path, tmp_path: Path) -> None:
    async with FakeTelegram() as fake:
        token = "4242000001:" + "z" * 35  # well-formed, not the fake's: 401 Unauthorized
        env = clean_env(
            tmp_path, ANTHROPIC_API_KEY="x", TELEGRAM_BOT_TOKEN=token,
            TELEGRAM_API_BASE_URL=fake.root, MNEMO_WEB_PORT="0", MNEMO_LOG_LEVEL="error",
        )  # fmt: skip
        proc = await start(home, env)
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 2, err.decode()
    lines = [line for line in err.decode().splitlines() if line.startswith("mnemo: ")]
    assert len(lines) == 1 and "TELEGRAM_BOT_TOKEN" in lines[0], err.decode()
    assert token not in err.decode() + out.decode()


def test_the_systemd_unit_restarts_on_everything_but_a_configuration_error() -> None:
    unit = (Path(__file__).resolve().parents[2] / "deploy" / "mnemo.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.lstrip().startswith("#")
    )
    assert settings["Restart"] == "on-failure"  # exit 1 (profile in use) and crashes restart
    assert settings["RestartPreventExitStatus"] == "2"
