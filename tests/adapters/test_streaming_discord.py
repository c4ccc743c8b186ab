"""Streaming replies on Discord: the real discord.py client inside ``DiscordAdapter``
against the fake Discord, the real anthropic SDK streaming from the emulator. A long
DM reply is one message edited while it is written (paced, on the fake's timestamps),
which then becomes the reply exactly as it is split without streaming; server channels
do not stream by default; streaming off is today's behaviour."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from mnemo.adapters.discord import neutralise_mass_mentions
from mnemo.adapters.splitting import split_message
from mnemo.gateway.emulator import Emulator, Reply
from tests.adapters.discord_harness import Bot, running_bot
from tests.adapters.telegram_harness import wait_until

INTERVAL = 1.0  # the adapter's default pace (Discord: about five edits per five seconds)
TEXT = "A **long** answer for Discord, streamed while it is written, @everyone stays quiet. " * 30


def shown(bot: Bot, channel_id: int) -> list[str]:
    """The bot's messages in a channel as they read now (after every edit), oldest first."""
    ids = sorted({m.id for m in bot.fake.sent if m.channel_id == channel_id})
    return [bot.fake.message(i)["content"] for i in ids]


async def test_a_long_dm_reply_is_edited_while_written_then_split_like_today(
    home: Path, emulator: Emulator
) -> None:
    chunks = split_message(neutralise_mass_mentions(TEXT), 2000)
    assert len(chunks) == 2
    emulator.script(Reply(text=TEXT, chunk_delay=0.05), Reply(text=TEXT))
    async with running_bot(home, emulator) as bot:
        dm = bot.alice_dm.id
        await bot.say(bot.alice_dm, bot.alice, "tell me at length")
        await wait_until(lambda: len([m for m in bot.fake.sent if m.channel_id == dm]) == 2, 60)
        await bot.settle()
        streamed_first, *rest = [m for m in bot.fake.sent if m.channel_id == dm]
        edits = [e for e in bot.fake.edits if e.message_id == streamed_first.id]
        assert emulator.requests[0].stream
        live, final = edits[:-1], edits[-1]
        assert len(live) >= 2, f"at least two edits before the final text, got {len(live)}"
        assert all(e.body["content"].endswith("…") for e in live)
        assert final.body["content"] == chunks[0]
        assert [m.content for m in rest] == chunks[1:]
        times = [streamed_first.at] + [e.at for e in edits]
        gaps = [b - a for a, b in pairwise(times)]
        assert all(g >= INTERVAL for g in gaps), f"edits closer than {INTERVAL}s: {gaps}"
        assert streamed_first.body["allowed_mentions"] == {"parse": []}, "the live message pings nobody"
        assert all(e.body["allowed_mentions"]["parse"] == [] for e in live)
        streamed = shown(bot, dm)
    # The same reply with streaming off: the user ends up reading exactly the same.
    async with running_bot(home, emulator, **{"streaming.platforms": {"discord": False}}) as bot:
        await bot.say(bot.alice_dm, bot.alice, "tell me at length")
        await wait_until(lambda: len(bot.fake.sent) == 2, 60)
        await bot.settle()
        assert bot.fake.edits == [], "streaming off: no edits"
        assert not emulator.requests[1].stream
        assert shown(bot, bot.alice_dm.id) == streamed == chunks


async def test_server_channels_do_not_stream_by_default(home: Path, emulator: Emulator) -> None:
    emulator.script(Reply(text=TEXT[:1500], chunk_delay=0.02))
    async with running_bot(home, emulator) as bot:
        await bot.say(bot.general, bot.alice, f"{bot.mention} tell me")
        await bot.sent(1)
        await bot.settle()
        assert not emulator.requests[0].stream
        assert bot.fake.edits == []
