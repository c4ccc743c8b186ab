"""Discord sharding across replicas (issue 17, item 3): ``discord.shard_count`` and each
replica's ``discord.shard_ids`` reach discord.py, whose IDENTIFY frames to the fake
gateway carry exactly the configured shards; bad shard settings are one clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mnemo.adapters.discord import DiscordAdapter
from mnemo.adapters.discord_routing import restore_discord_defaults
from mnemo.gateway.config import load_settings
from mnemo.gateway.errors import ConfigError
from mnemo.gateway.events import InboundMessage
from tests.fakes.discord_api import FakeDiscord

TIMEOUT = 10.0


def adapter(home: Path, fake: FakeDiscord, **env: str) -> DiscordAdapter:
    settings = load_settings(
        home,
        environ=env,
        overrides={
            "discord.bot_token": fake.token,
            "discord.api_base_url": fake.api_base,
            "discord.gateway_url": fake.gateway_url,
        },
    )
    return DiscordAdapter(settings.discord, guild_ready_timeout_s=0.05, ready_timeout_s=TIMEOUT)


async def sink(message: InboundMessage) -> None:
    raise AssertionError(f"no message was expected: {message}")


def shards(identifies: list[Any]) -> list[Any]:
    return sorted(tuple(i["shard"]) if "shard" in i else None for i in identifies)


async def test_each_replica_identifies_with_its_own_shards(home: Path) -> None:
    async with FakeDiscord() as fake:
        fake.add_guild("home", members=[fake.add_user("alice")])
        first = adapter(home, fake, DISCORD_SHARD_COUNT="3", DISCORD_SHARD_IDS="0,2")
        second = adapter(home, fake, DISCORD_SHARD_COUNT="3", DISCORD_SHARD_IDS="1")
        try:
            await first.start(sink)
            assert first.connected
            assert shards(fake.identifies) == [(0, 3), (2, 3)]
            await second.start(sink)
            assert second.connected
            assert shards(fake.identifies) == [(0, 3), (1, 3), (2, 3)]
        finally:
            await first.stop()
            await second.stop()
            restore_discord_defaults()


async def test_a_count_without_ids_connects_every_shard_and_no_count_means_unsharded(home: Path) -> None:
    async with FakeDiscord() as fake:
        every = adapter(home, fake, DISCORD_SHARD_COUNT="2")
        try:
            await every.start(sink)
            assert every.connected and shards(fake.identifies) == [(0, 2), (1, 2)]
        finally:
            await every.stop()
        plain = adapter(home, fake)
        try:
            await plain.start(sink)
            assert plain.connected
            assert shards(fake.identifies[2:]) == [None], "one connection, no shard field"
        finally:
            await plain.stop()
            restore_discord_defaults()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"DISCORD_SHARD_COUNT": "4", "DISCORD_SHARD_IDS": "1,4"}, "shard ids run from 0 to 3"),
        ({"DISCORD_SHARD_COUNT": "4", "DISCORD_SHARD_IDS": "-1"}, "outside that: -1"),
        ({"DISCORD_SHARD_IDS": "0"}, "needs discord.shard_count"),
        ({"DISCORD_SHARD_COUNT": "2", "DISCORD_SHARD_IDS": "1,1"}, "lists a shard twice"),
        ({"DISCORD_SHARD_COUNT": "0"}, "discord.shard_count"),
    ],
)
def test_bad_shard_settings_are_a_clear_configuration_error(
    home: Path, env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError, match="discord.shard") as err:
        load_settings(home, environ=env)
    assert needle in str(err.value)


def test_shard_settings_from_config_yaml(home: Path) -> None:
    (home / "config.yaml").write_text("discord:\n  shard_count: 8\n  shard_ids: [5, 4]\n")
    settings = load_settings(home, environ={})
    assert settings.discord.shard_count == 8 and settings.discord.shard_ids == (4, 5)
