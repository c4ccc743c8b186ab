"""``mnemo doctor`` against local fakes: the emulator for the LLM endpoint, the fake
Telegram Bot API and the fake Discord REST API."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from mnemo.cli.doctor import Check, Status, render, run_checks
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.emulator import Emulator
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import FakeTelegram

REPO = Path(__file__).resolve().parents[2]


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def settings_for(home: Path, **env: str) -> Settings:
    return load_settings(home, environ={"MNEMO_WEB_PORT": "0", **env})


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator() as emu:
        yield emu


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        yield fake


async def test_a_fresh_profile_passes_with_the_llm_check_skipped_in_trial_mode(home: Path) -> None:
    home.chmod(0o700)
    checks = await run_checks(settings_for(home))
    assert [c.name for c in checks] == [
        "config",
        "home",
        ".env",
        "memories",
        "state.db",
        "search index",
        "llm",
        "web",
    ]
    got = by_name(checks)
    assert got["llm"].status is Status.SKIP and "trial mode" in got["llm"].detail
    assert got[".env"].status is Status.SKIP
    assert got["state.db"].status is Status.PASS and "schema version" in got["state.db"].detail
    assert all(c.status is not Status.FAIL for c in checks)
    assert (home / "state.db").exists(), "the database was opened and migrated"
    assert got["search index"].status is Status.PASS and got["search index"].detail == "word index complete"


async def test_every_configured_endpoint_is_checked_through_its_base_url(
    home: Path, emulator: Emulator, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    settings = settings_for(
        home,
        ANTHROPIC_API_KEY="sk-ant-test-key",
        ANTHROPIC_BASE_URL=emulator.base_url,
        TELEGRAM_BOT_TOKEN=telegram.token,
        TELEGRAM_API_BASE_URL=telegram.root,
        DISCORD_BOT_TOKEN=discord.token,
        DISCORD_API_BASE_URL=discord.api_base,
    )
    got = by_name(await run_checks(settings))
    assert got["llm"].status is Status.PASS, got["llm"]
    # The emulator has no /v1/models: the doctor fell back to a one-token message.
    paths = [(r.method, r.path) for r in emulator.requests]
    assert paths == [("GET", "/v1/models"), ("POST", "/v1/messages")]
    assert emulator.requests[-1].body["max_tokens"] == 1
    assert emulator.requests[-1].headers["x-api-key"] == "sk-ant-test-key"
    assert got["telegram"].status is Status.PASS and "@mnemo_test_bot" in got["telegram"].detail
    assert got["discord"].status is Status.PASS and str(discord.bot_user.id) in got["discord"].detail


async def test_rejected_tokens_fail_without_showing_them(
    home: Path, telegram: FakeTelegram, discord: FakeDiscord, emulator: Emulator
) -> None:
    bad_telegram = telegram.token.split(":")[0] + ":" + "B" * 35
    settings = settings_for(
        home,
        ANTHROPIC_API_KEY="sk-ant-test-key",
        ANTHROPIC_BASE_URL=emulator.base_url,
        TELEGRAM_BOT_TOKEN=bad_telegram,
        TELEGRAM_API_BASE_URL=telegram.root,
        DISCORD_BOT_TOKEN="not-the-right-token",
        DISCORD_API_BASE_URL=discord.api_base,
    )
    got = by_name(await run_checks(settings))
    assert got["telegram"].status is Status.FAIL and "401" in got["telegram"].detail
    assert got["discord"].status is Status.FAIL and "401" in got["discord"].detail
    lines = [render(c, settings.secret_values()) for c in got.values()]
    assert not any(bad_telegram in line or "not-the-right-token" in line for line in lines)


def test_render_scrubs_every_secret_even_inside_a_url() -> None:
    check = Check("telegram", Status.FAIL, "unreachable: http://host/bot123:SECRETSECRET/getMe")
    assert render(check, ("123:SECRETSECRET",)) == "✗ telegram: unreachable: http://host/bot***/getMe"
    assert render(check, (), unicode=False).startswith("FAIL telegram:")


async def test_an_llm_key_rejected_or_an_endpoint_down_fails(home: Path) -> None:
    async def unauthorized(_: web.Request) -> web.Response:
        body = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
        return web.json_response(body, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", unauthorized)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    settings = settings_for(home, ANTHROPIC_API_KEY="sk-x", ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}")
    try:
        got = by_name(await run_checks(settings))
        assert got["llm"].status is Status.FAIL
        assert "API key rejected (HTTP 401) invalid x-api-key" == got["llm"].detail
    finally:
        await runner.cleanup()
    got = by_name(await run_checks(settings))  # the same endpoint, now gone
    assert got["llm"].status is Status.FAIL and got["llm"].detail.startswith("unreachable")


async def test_loose_file_permissions_fail(home: Path) -> None:
    home.chmod(0o777)
    (home / ".env").write_text("ANTHROPIC_API_KEY=sk-from-dotenv\n")
    (home / ".env").chmod(0o644)
    got = by_name(await run_checks(settings_for(home)))
    assert got["home"].status is Status.FAIL and "chmod go-w" in got["home"].detail
    assert got[".env"].status is Status.FAIL and "chmod 600" in got[".env"].detail
    home.chmod(0o700)
    (home / ".env").chmod(0o600)
    got = by_name(await run_checks(settings_for(home, ANTHROPIC_BASE_URL="http://127.0.0.1:9")))
    assert got["home"].status is Status.PASS and got[".env"].status is Status.PASS


async def test_unreadable_memory_and_a_broken_database_fail(home: Path) -> None:
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_bytes(b"\xff\xfe not utf-8 \xc3")
    (home / "state.db").write_bytes(b"this is not a sqlite database at all" * 100)
    got = by_name(await run_checks(settings_for(home)))
    assert got["memories"].status is Status.FAIL and "MEMORY.md" in got["memories"].detail
    assert got["state.db"].status is Status.FAIL


async def test_the_web_port_in_use_by_another_program_fails_but_by_a_running_mnemo_passes(home: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        # It accepts connections but never answers /healthz: the probe times out.
        got = by_name(await run_checks(settings_for(home, MNEMO_WEB_PORT=str(port)), timeout_s=0.5))
        assert got["web"].status is Status.FAIL and "in use by another program" in got["web"].detail

    server = WebServer(settings_for(home).web.model_copy(update={"port": 0}), Metrics())

    async def probe() -> dict:
        return {"status": "ok", "adapters": {"web": True}}

    server.set_health_probe(probe)
    await server.start()
    try:
        got = by_name(await run_checks(settings_for(home, MNEMO_WEB_PORT=str(server.port))))
        assert got["web"].status is Status.PASS and "running mnemo" in got["web"].detail
    finally:
        await server.stop()
    got = by_name(await run_checks(settings_for(home, MNEMO_WEB_HOST="0.0.0.0")))
    assert got["web"].status is Status.FAIL and "MNEMO_WEB_TOKEN" in got["web"].detail


async def test_the_command_prints_one_line_per_check_and_exits_1_on_a_failure(
    home: Path, tmp_path: Path, telegram: FakeTelegram
) -> None:
    async def doctor(**env: str) -> tuple[int, str]:
        base = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "MNEMO_WEB_PORT": "0",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mnemo", "--home", str(home), "doctor", "--timeout", "5",
            env={**base, **env}, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode()

    home.chmod(0o700)
    code, out = await doctor()
    assert code == 0, out
    lines = out.splitlines()
    assert [line.split(" ")[1].rstrip(":") for line in lines[:-1]] == [
        "config", "home", ".env", "memories", "state.db", "search", "llm", "web",
    ]  # fmt: skip
    assert all(line[0] in "✓–" for line in lines[:-1]) and lines[-1] == "all checks passed"

    bad = telegram.token.split(":")[0] + ":" + "C" * 35
    code, out = await doctor(
        TELEGRAM_BOT_TOKEN=bad, TELEGRAM_API_BASE_URL=telegram.root, ANTHROPIC_BASE_URL="http://127.0.0.1:9"
    )
    assert code == 1
    assert any(line.startswith("✗ telegram: bot token rejected (HTTP 401)") for line in out.splitlines()), out
    assert bad not in out
    assert out.splitlines()[-1] == "2 check(s) failed: llm, telegram"
