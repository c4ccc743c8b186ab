"""The whole bot against fakes, for the Discord end-to-end tests: the real discord.py
client inside ``DiscordAdapter`` talks to ``FakeDiscord`` (REST + gateway on 127.0.0.1,
reached through ``DISCORD_API_BASE_URL`` / ``DISCORD_GATEWAY_URL``), the real anthropic
SDK talks to the emulator, and everything between is ``open_app``'s real pipeline.

The server ``home`` has members alice and bob (and another bot, robo) and channels:

    general   one session per member (the default)
    support   thread_reply_channels: a mention starts a thread owned by the bot
    lounge    shared_room_channels: the members share one session
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo.adapters.discord import DiscordAdapter
from mnemo.adapters.discord_routing import restore_discord_defaults
from mnemo.app import App, open_app
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator
from mnemo.gateway.emulator.script import RecordedRequest
from tests.fakes.discord_api import FakeChannel, FakeDiscord, FakeGuild, FakeUser, SentMessage

TIMEOUT = 10.0


@dataclass
class Bot:
    fake: FakeDiscord
    emulator: Emulator
    app: App
    adapter: DiscordAdapter
    alice: FakeUser
    bob: FakeUser
    robo: FakeUser
    guild: FakeGuild
    general: FakeChannel
    support: FakeChannel
    lounge: FakeChannel
    alice_dm: FakeChannel

    @property
    def mention(self) -> str:
        return self.fake.bot_user.mention

    async def say(self, channel: FakeChannel, user: FakeUser, text: str, **kw: Any) -> int:
        return await self.fake.push_message(channel.id, user, text, **kw)

    async def sent(self, n: int) -> list[SentMessage]:
        """The first ``n`` channel messages the bot posted (waits for them)."""
        return (await self.fake.wait_for_sent(n, TIMEOUT))[:n]

    async def settle(self) -> None:
        """Until the gateway has nothing left to do — inbox, lanes and outbox idle. Call
        it after something shows the last message reached the gateway."""

        async def idle() -> bool:
            counts = await self.app.outbox.counts()
            gw = self.app.gateway
            busy = any(gw.lanes.busy(k) or gw.lanes.queued(k) for k in gw.lanes.keys())
            pending = counts.get("queued", 0) + counts.get("sending", 0)
            return not busy and not pending and not await self.app.inbox.unfinished()

        async def wait() -> None:
            while not await idle():
                await asyncio.sleep(0.02)

        await asyncio.wait_for(wait(), TIMEOUT)

    def requests_mentioning(self, marker: str) -> list[RecordedRequest]:
        return [r for r in self.emulator.requests if marker in json.dumps(r.body)]

    def session_key(
        self, channel: FakeChannel, user: FakeUser | None = None, thread: int | None = None
    ) -> str:
        parts = ["discord", "group", str(channel.id)]
        if thread is not None:
            parts.append(str(thread))
        if user is not None:
            parts.append(str(user.id))
        return ":".join(parts)


def build_world(fake: FakeDiscord) -> dict[str, Any]:
    alice = fake.add_user("alice", global_name="Alice")
    bob = fake.add_user("bob", global_name="Bob")
    robo = fake.add_user("robo", bot=True)
    guild = fake.add_guild("home", members=[alice, bob, robo])
    return {
        "alice": alice,
        "bob": bob,
        "robo": robo,
        "guild": guild,
        "general": fake.add_channel(guild, "general"),
        "support": fake.add_channel(guild, "support"),
        "lounge": fake.add_channel(guild, "lounge"),
        "alice_dm": fake.add_dm(alice),
    }


@asynccontextmanager
async def running_bot(home: Path, emulator: Emulator, **overrides: Any) -> AsyncIterator[Bot]:
    """Start the fake Discord and the whole app; on exit check that no message the bot
    posted in the test could ever ping @everyone, @here or a role."""
    fake = FakeDiscord()
    world = build_world(fake)
    async with fake:
        settings = load_settings(
            home,
            environ={},
            overrides={
                "discord.bot_token": fake.token,
                "discord.api_base_url": fake.api_base,
                "discord.gateway_url": fake.gateway_url,
                "discord.thread_reply_channels": (str(world["support"].id),),
                "discord.shared_room_channels": (str(world["lounge"].id),),
                "access.allowed": ("discord:*",),
                "access.rate_limit_per_minute": 0,
                "llm.base_url": emulator.base_url,
                "llm.max_retries": 1,
                "llm.retry_after_cap_s": 0.05,
                "gateway.debounce_s": 0.05,
                **overrides,
            },
        )
        adapter = DiscordAdapter(settings.discord, guild_ready_timeout_s=0.05)
        try:
            async with open_app(
                settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="k", trial=False
            ) as app:
                yield Bot(fake=fake, emulator=emulator, app=app, adapter=adapter, **world)
        finally:
            restore_discord_defaults()
        for message in [*fake.sent, *fake.followups]:
            assert_cannot_mass_ping(message)


def assert_cannot_mass_ping(message: SentMessage) -> None:
    allowed = message.allowed_mentions
    assert allowed is not None, f"sent without allowed_mentions: {message.content[:80]!r}"
    assert allowed["parse"] == [], allowed
    assert not allowed.get("roles"), allowed
    assert len(allowed.get("users", [])) <= 1, allowed
    assert not message.pings.everyone and not message.pings.roles
    assert "@everyone" not in message.content and "@here" not in message.content
