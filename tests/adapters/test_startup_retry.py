"""A platform that cannot be reached at start is retried in the background
(``gateway.supervisor``), with the real python-telegram-bot / discord.py clients
against the local fakes; a platform that refuses the token is a configuration error.

The supervisors here back off in hundredths of a second; ``mnemo run``'s own (1 s → 60 s)
is exercised as a real process in ``tests/cli/test_run_startup_retry.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from mnemo.adapters.discord import DiscordAdapter
from mnemo.adapters.discord_routing import restore_discord_defaults
from mnemo.adapters.telegram import TelegramAdapter
from mnemo.gateway.config import load_settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.events import InboundMessage, Submitted
from mnemo.gateway.supervisor import AdapterSupervisor, Begin, backoff_delays
from tests.adapters.telegram_harness import wait_until
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import FakeTelegram

TIMEOUT = 10.0


class Inbox:
    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []

    async def __call__(self, msg: InboundMessage) -> Submitted:
        self.messages.append(msg)
        return Submitted.ACCEPTED


def fast_supervisor(**kw: float) -> AdapterSupervisor:
    return AdapterSupervisor(min_backoff_s=kw.get("min_s", 0.01), max_backoff_s=kw.get("max_s", 0.05))


def start_with(inbox: Inbox) -> Begin:
    return lambda adapter: adapter.start(inbox)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def telegram_adapter(home: Path, fake: FakeTelegram, token: str | None = None) -> TelegramAdapter:
    settings = load_settings(
        home,
        environ={},
        overrides={"telegram.bot_token": token or fake.token, "telegram.api_base_url": fake.root},
    )
    return TelegramAdapter(settings.telegram, poll_timeout_s=1.0, reconnect_backoff_s=(0.05, 0.2))


async def test_telegram_unreachable_at_start_is_retried_until_it_answers(
    home: Path, telegram: FakeTelegram
) -> None:
    telegram.fail_next("getMe", drop=True, times=3)  # connection closed without an answer
    adapter, inbox, supervisor = telegram_adapter(home, telegram), Inbox(), fast_supervisor()
    try:
        with capture_logs() as logs:
            await supervisor.start([adapter], start_with(inbox))  # does not raise: retried behind
            assert not adapter.connected
            await wait_until(lambda: adapter.connected, TIMEOUT, "telegram connected after the outage")
        telegram.push_text(chat_id=42, user_id=42, text="hello after the outage")
        await wait_until(lambda: bool(inbox.messages), TIMEOUT, "the message reached the gateway")
    finally:
        await supervisor.stop()
        await adapter.stop()
    assert [c.status for c in telegram.calls_to("getMe")] == [0, 0, 0, 200]
    failed = [e for e in logs if e["event"] == "adapter_start_failed"]
    assert [e["attempt"] for e in failed] == [1, 2, 3], "one line per failed attempt"
    assert all("getMe" in e["error"] and e["adapter"] == "telegram" for e in failed), failed
    assert [e["attempt"] for e in logs if e["event"] == "adapter_started"] == [4]
    assert inbox.messages[0].text == "hello after the outage"


async def test_telegram_deletewebhook_failing_at_start_is_retried(home: Path, telegram: FakeTelegram) -> None:
    telegram.fail_next("deleteWebhook", status=502, times=1)
    adapter, supervisor = telegram_adapter(home, telegram), fast_supervisor()
    try:
        await supervisor.start([adapter], start_with(Inbox()))
        await wait_until(lambda: adapter.connected, TIMEOUT, "telegram connected")
    finally:
        await supervisor.stop()
        await adapter.stop()
    assert [c.status for c in telegram.calls_to("deleteWebhook")] == [502, 200]
    assert len(telegram.calls_to("getMe")) == 2, "the failed start was undone and begun afresh"


async def test_a_token_telegram_rejects_at_the_first_attempt_is_a_configuration_error(
    home: Path, telegram: FakeTelegram
) -> None:
    token = "4242000001:" + "y" * 35
    adapter, supervisor = telegram_adapter(home, telegram, token), fast_supervisor()
    try:
        with pytest.raises(StartupError, match="TELEGRAM_BOT_TOKEN") as caught:
            await supervisor.start([adapter], start_with(Inbox()))
    finally:
        await supervisor.stop()
        await adapter.stop()
    assert token not in str(caught.value)
    assert [c.status for c in telegram.calls_to("getMe")] == [401], "a refused token is not retried"


async def test_a_token_rejected_once_the_network_is_back_is_reported_as_a_configuration_error(
    home: Path, telegram: FakeTelegram
) -> None:
    telegram.fail_next("getMe", drop=True, times=1)
    telegram.fail_next("getMe", status=401, description="Unauthorized", times=1)
    adapter, supervisor = telegram_adapter(home, telegram), fast_supervisor()
    try:
        await supervisor.start([adapter], start_with(Inbox()))
        error = await asyncio.wait_for(supervisor.failure(), TIMEOUT)
    finally:
        await supervisor.stop()
        await adapter.stop()
    assert isinstance(error, StartupError) and "TELEGRAM_BOT_TOKEN" in str(error)
    assert not adapter.connected
    assert [c.status for c in telegram.calls_to("getMe")] == [0, 401], "no retry after the refusal"


async def test_stop_during_the_backoff_ends_the_retries(home: Path, telegram: FakeTelegram) -> None:
    telegram.fail_next("getMe", drop=True, times=100)
    adapter, supervisor = telegram_adapter(home, telegram), fast_supervisor(min_s=600.0, max_s=600.0)
    await supervisor.start([adapter], start_with(Inbox()))
    await asyncio.wait_for(supervisor.stop(), TIMEOUT)  # the 5-10 minute wait is cancelled
    await adapter.stop()
    assert len(telegram.calls_to("getMe")) == 1
    assert not adapter.connected


async def test_an_adapter_that_starts_does_not_wait_for_one_that_cannot(
    home: Path, telegram: FakeTelegram
) -> None:
    down = telegram_adapter(home, telegram)
    telegram.fail_next("getMe", drop=True, times=1000)
    async with FakeTelegram() as other:
        up = telegram_adapter(home, other)
        up.name = "telegram-2"  # a second platform, as far as the supervisor cares
        supervisor = fast_supervisor()
        try:
            await supervisor.start([down, up], start_with(Inbox()))
            assert up.connected and not down.connected
        finally:
            await supervisor.stop()
            await up.stop()
            await down.stop()


def test_backoff_is_jittered_exponential_and_capped() -> None:
    low = backoff_delays(1.0, 60.0, rng=lambda: 0.0)
    high = backoff_delays(1.0, 60.0, rng=lambda: 1.0 - 1e-12)
    assert [low(n) for n in (1, 2, 3, 4, 7, 8, 50)] == [0.5, 1.0, 2.0, 4.0, 30.0, 30.0, 30.0]
    assert [round(high(n), 6) for n in (1, 2, 3, 7, 50)] == [1.0, 2.0, 4.0, 60.0, 60.0]


# ---- Discord ---------------------------------------------------------------------------


def discord_adapter(home: Path, fake: FakeDiscord, token: str) -> DiscordAdapter:
    settings = load_settings(
        home,
        environ={},
        overrides={
            "discord.bot_token": token,
            "discord.api_base_url": fake.api_base,
            "discord.gateway_url": fake.gateway_url,
        },
    )
    return DiscordAdapter(settings.discord, guild_ready_timeout_s=0.05, ready_timeout_s=TIMEOUT)


async def test_discord_unreachable_at_login_is_retried_until_it_answers(home: Path) -> None:
    async with FakeDiscord() as fake:
        fake.fail_next("GET /users/@me", status=503, times=2)
        adapter, supervisor = discord_adapter(home, fake, fake.token), fast_supervisor()
        try:
            await supervisor.start([adapter], start_with(Inbox()))
            assert not adapter.connected
            await wait_until(lambda: adapter.connected, TIMEOUT, "discord connected after the outage")
        finally:
            await supervisor.stop()
            await adapter.stop()
            restore_discord_defaults()
        assert [c.status for c in fake.calls_to("/users/@me")][:3] == [503, 503, 200]
        assert len(fake.identifies) == 1


async def test_a_token_discord_refuses_is_a_configuration_error(home: Path) -> None:
    async with FakeDiscord() as fake:
        adapter, supervisor = discord_adapter(home, fake, "not-the-token"), fast_supervisor()
        try:
            with pytest.raises(StartupError, match="DISCORD_BOT_TOKEN"):
                await supervisor.start([adapter], start_with(Inbox()))
        finally:
            await supervisor.stop()
            await adapter.stop()
            restore_discord_defaults()
        assert [c.status for c in fake.calls] == [401]
