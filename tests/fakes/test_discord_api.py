"""The real discord.py 2.7 client against the fake Discord (REST + gateway) — proof that
the fake is faithful enough for the Discord adapter's end-to-end tests, and pins of the
discord.py facts the adapter relies on (routing, retries, intents, echoes).

Clients run the way an adapter runs them: ``await client.login(token)``, ``connect()`` in
a task owned by the test, ``close()`` at the end — never ``client.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import discord
import pytest
import yarl
from discord import app_commands

from mnemo.adapters.discord_routing import (
    DEFAULT_API_BASE,
    DEFAULT_GATEWAY,
    current_routes,
    restore_discord_defaults,
    route_discord,
)
from mnemo.gateway.errors import ConfigError
from tests.fakes.discord_api import FakeChannel, FakeDiscord, FakeGuild, FakeUser

TIMEOUT = 10.0


def mnemo_intents() -> discord.Intents:
    """What the adapter asks for: no privileged members/presences intents."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    return intents


class Bot(discord.Client):
    """A plain discord.py client with a command tree that records what it receives."""

    def __init__(self, intents: discord.Intents | None = None) -> None:
        # guild_ready_timeout: on_ready waits this long after the last GUILD_CREATE (2 s
        # by default); the fake sends them all at once, so a short wait is enough.
        super().__init__(intents=intents or mnemo_intents(), guild_ready_timeout=0.05)
        self.tree = app_commands.CommandTree(self)
        self.ready_event = asyncio.Event()
        self.inbox: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.own_messages: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.threads: asyncio.Queue[discord.Thread] = asyncio.Queue()
        self.interactions: asyncio.Queue[discord.Interaction] = asyncio.Queue()
        self._register_commands()

    def _register_commands(self) -> None:
        @self.tree.command(name="memory", description="Show what I remember about you")
        async def memory(interaction: discord.Interaction) -> None:
            await self.interactions.put(interaction)
            await interaction.response.send_message("nothing yet", ephemeral=True)

        @self.tree.command(name="remember", description="Remember a fact about you")
        @app_commands.describe(fact="what to remember")
        async def remember(interaction: discord.Interaction, fact: str) -> None:
            await self.interactions.put(interaction)
            await interaction.response.defer(ephemeral=True, thinking=True)
            await interaction.followup.send(f"saving {fact}", ephemeral=True)
            await interaction.edit_original_response(content=f"remembered {fact}")

    async def on_ready(self) -> None:
        self.ready_event.set()

    async def on_message(self, message: discord.Message) -> None:
        queue = self.own_messages if message.author == self.user else self.inbox
        await queue.put(message)

    async def on_thread_create(self, thread: discord.Thread) -> None:
        await self.threads.put(thread)

    async def next_message(self) -> discord.Message:
        return await asyncio.wait_for(self.inbox.get(), TIMEOUT)


@dataclass(frozen=True)
class Server:
    fake: FakeDiscord
    alice: FakeUser
    bob: FakeUser
    guild: FakeGuild
    general: FakeChannel
    alice_dm: FakeChannel


@pytest.fixture(autouse=True)
def leave_discord_routing_as_found() -> Iterator[None]:
    yield
    restore_discord_defaults()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    fake = FakeDiscord()
    alice, bob = fake.add_user("alice", global_name="Alice"), fake.add_user("bob")
    guild = fake.add_guild("home", members=[alice, bob])
    general = fake.add_channel(guild, "general")
    fake.add_channel(guild, "random")
    alice_dm = fake.add_dm(alice)
    async with fake:
        route_discord(fake.api_base, fake.gateway_url)
        yield Server(fake, alice, bob, guild, general, alice_dm)


@asynccontextmanager
async def running(client: discord.Client, fake: FakeDiscord) -> AsyncIterator[discord.Client]:
    await client.login(fake.token)
    connection = asyncio.create_task(client.connect(), name="discord-connect")
    try:
        ready = asyncio.create_task(client.wait_until_ready())
        done, _ = await asyncio.wait(
            {ready, connection}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            if connection in done:
                connection.result()  # re-raise the client's failure
            raise TimeoutError("discord.py never became ready")
        yield client
    finally:
        await client.close()
        await connection


@pytest.fixture
async def bot(server: Server) -> AsyncIterator[Bot]:
    async with running(Bot(), server.fake) as client:
        assert isinstance(client, Bot)
        yield client


# ---- connecting -------------------------------------------------------------------------


async def test_login_and_ready_over_zlib_stream_at_the_routed_gateway(server: Server, bot: Bot) -> None:
    fake = server.fake
    assert bot.ready_event.is_set()
    assert bot.user is not None and bot.user.id == fake.bot_user.id
    assert bot.application_id == fake.application_id
    guild = bot.get_guild(server.guild.id)
    assert guild is not None and guild.member_count == 3
    assert [c.name for c in guild.text_channels] == ["general", "random"]
    assert guild.me is not None and guild.me.id == fake.bot_user.id

    assert [c.route for c in fake.calls[:2]] == ["GET /users/@me", "GET /oauth2/applications/@me"]
    # The unsharded client never asks GET /gateway: it connects to DEFAULT_GATEWAY.
    assert not fake.calls_to(" /gateway")
    (connection,) = fake.connections
    assert connection.compression == "zlib-stream"
    assert connection.query["v"] == "10" and connection.query["encoding"] == "json"
    (identify,) = fake.identifies
    assert identify["intents"] == mnemo_intents().value
    assert not identify["intents"] & discord.Intents(members=True).value


async def test_client_also_accepts_an_uncompressed_gateway() -> None:
    fake = FakeDiscord(compress_gateway=False)
    alice = fake.add_user("alice")
    dm = fake.add_dm(alice)
    async with fake:
        route_discord(fake.api_base, fake.gateway_url)
        async with running(Bot(), fake) as client:
            assert isinstance(client, Bot)
            assert fake.connections[0].compression is None
            await fake.push_message(dm.id, alice, "plain text frames")
            assert (await client.next_message()).content == "plain text frames"


async def test_autosharded_client_finds_the_gateway_through_gateway_bot(server: Server) -> None:
    # Only the REST base is routed: the sharded client must learn the websocket URL from
    # GET /gateway/bot, never from DEFAULT_GATEWAY.
    route_discord(server.fake.api_base, None)
    client = discord.AutoShardedClient(intents=mnemo_intents(), guild_ready_timeout=0.05)
    async with running(client, server.fake):
        assert [c.route for c in server.fake.calls_to("/gateway")] == ["GET /gateway/bot"]
        assert client.get_guild(server.guild.id) is not None
        assert server.fake.identifies[0]["shard"] == [0, 1]


async def test_wrong_token_is_a_login_failure(server: Server) -> None:
    client = Bot()
    with pytest.raises(discord.LoginFailure):
        await client.login("not-the-token")
    await client.close()
    assert server.fake.calls[0].status == 401


async def test_members_intent_not_enabled_for_the_app_is_refused_like_discord(server: Server) -> None:
    intents = mnemo_intents()
    intents.members = True
    client = Bot(intents)
    await client.login(server.fake.token)
    try:
        with pytest.raises(discord.PrivilegedIntentsRequired):
            await asyncio.wait_for(client.connect(), TIMEOUT)
    finally:
        await client.close()


async def test_gateway_drop_and_reconnect_request_resume_without_losing_events(
    server: Server, bot: Bot
) -> None:
    fake = server.fake
    await fake.drop_gateway(4000)
    # Dispatched while the client is away: replayed when it resumes.
    await fake.push_message(server.alice_dm.id, server.alice, "sent during the outage")
    assert (await bot.next_message()).content == "sent during the outage"
    await fake.request_reconnect()
    await fake.push_message(server.alice_dm.id, server.alice, "after the reconnect")
    assert (await bot.next_message()).content == "after the reconnect"
    assert len(fake.identifies) == 1
    assert len(fake.resumes) == 2
    assert len(fake.connections) == 3


# ---- receiving --------------------------------------------------------------------------


async def test_guild_message_mentioning_the_bot_has_it_in_mentions(server: Server, bot: Bot) -> None:
    fake = server.fake
    await fake.push_message(server.general.id, server.alice, f"{fake.bot_user.mention} what's up?")
    message = await bot.next_message()
    assert message.content == f"<@{fake.bot_user.id}> what's up?"
    assert bot.user in message.mentions
    assert isinstance(message.channel, discord.TextChannel) and message.channel.id == server.general.id
    assert message.guild is not None and message.guild.id == server.guild.id
    assert isinstance(message.author, discord.Member) and message.author.id == server.alice.id
    assert message.author.display_name == "Alice"

    await fake.push_message(server.general.id, server.bob, "just chatting")
    plain = await bot.next_message()
    assert plain.mentions == [] and plain.reference is None


async def test_reply_to_the_bot_carries_the_reference(server: Server, bot: Bot) -> None:
    fake = server.fake
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    ours = await channel.send("I am the bot")
    await fake.push_message(server.general.id, server.alice, "replying to you", reference=ours.id)
    reply = await bot.next_message()
    assert reply.type is discord.MessageType.reply
    assert reply.reference is not None and reply.reference.message_id == ours.id
    assert isinstance(reply.reference.resolved, discord.Message)
    assert reply.reference.resolved.author == bot.user
    # The Discord client pings the replied-to author by default.
    assert bot.user in reply.mentions

    await fake.push_message(server.general.id, server.bob, "quiet reply", reference=ours.id, reply_ping=False)
    quiet = await bot.next_message()
    assert quiet.reference is not None and bot.user not in quiet.mentions


async def test_dm_arrives_on_a_dm_channel_and_the_answer_goes_back_there(server: Server, bot: Bot) -> None:
    fake = server.fake
    await fake.push_message(server.alice_dm.id, server.alice, "hello in private")
    message = await bot.next_message()
    assert isinstance(message.channel, discord.DMChannel)
    assert message.guild is None and message.author.id == server.alice.id
    await message.channel.send("hello back")
    (sent,) = await fake.wait_for_sent(1)
    assert sent.channel_id == server.alice_dm.id

    dm = await message.author.create_dm()
    assert dm.id == server.alice_dm.id
    assert fake.calls_to("POST /users/@me/channels")[0].body == {"recipient_id": server.alice.id}


async def test_without_message_content_intent_guild_text_is_blank_unless_mentioned(server: Server) -> None:
    fake = server.fake
    intents = mnemo_intents()
    intents.message_content = False
    async with running(Bot(intents), fake) as client:
        assert isinstance(client, Bot)
        await fake.push_message(server.general.id, server.alice, "not for the bot")
        assert (await client.next_message()).content == ""
        await fake.push_message(server.general.id, server.alice, f"{fake.bot_user.mention} for the bot")
        assert (await client.next_message()).content.endswith("for the bot")
        await fake.push_message(server.alice_dm.id, server.alice, "a DM keeps its text")
        assert (await client.next_message()).content == "a DM keeps its text"


# ---- sending ----------------------------------------------------------------------------


async def test_allowed_mentions_are_recorded_and_keep_everyone_unpinged(server: Server, bot: Bot) -> None:
    fake = server.fake
    await fake.push_message(server.general.id, server.alice, f"{fake.bot_user.mention} ping")
    message = await bot.next_message()
    text = f"@everyone <@{server.alice.id}> <@{server.bob.id}> here you go"
    guarded = discord.AllowedMentions(everyone=False, roles=False, users=[message.author])
    ours = await message.channel.send(text, allowed_mentions=guarded)

    (sent,) = await fake.wait_for_sent(1)
    assert sent.content == text
    assert sent.allowed_mentions == {"parse": [], "users": [server.alice.id], "replied_user": True}
    assert not sent.pings.everyone
    assert sent.pings.users == {server.alice.id}
    # Discord echoes the bot's own message over the gateway: an adapter must skip it.
    echoed = await asyncio.wait_for(bot.own_messages.get(), TIMEOUT)
    assert echoed.id == ours.id and echoed.author == bot.user

    await message.channel.send(text)  # no allowed_mentions: Discord's default pings all
    unguarded = (await fake.wait_for_sent(2))[1]
    assert unguarded.pings.everyone and unguarded.pings.users == {server.alice.id, server.bob.id}


async def test_reply_sends_a_message_reference(server: Server, bot: Bot) -> None:
    fake = server.fake
    await fake.push_message(server.general.id, server.alice, f"{fake.bot_user.mention} question")
    message = await bot.next_message()
    await message.reply(
        "answer", allowed_mentions=discord.AllowedMentions(everyone=False, replied_user=False)
    )
    (sent,) = await fake.wait_for_sent(1)
    assert sent.message_reference is not None
    assert sent.message_reference["message_id"] == message.id
    assert sent.pings.users == frozenset()


async def test_content_over_2000_chars_is_a_400_with_code_50035(server: Server, bot: Bot) -> None:
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    with pytest.raises(discord.HTTPException) as caught:
        await channel.send("x" * 2001)
    assert caught.value.status == 400 and caught.value.code == 50035
    assert "2000 or fewer" in caught.value.text
    await channel.send("y" * 2000)
    (sent,) = await server.fake.wait_for_sent(1)
    assert len(sent.content) == 2000


async def test_429_with_retry_after_is_retried_by_discord_py(server: Server, bot: Bot) -> None:
    fake = server.fake
    route = f"POST /channels/{server.general.id}/messages"
    fake.fail_next(route, status=429, retry_after=0.05)
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    message = await channel.send("eventually")
    assert [c.status for c in fake.calls_to(route)] == [429, 200]
    assert [s.id for s in fake.sent] == [message.id]


async def test_500_is_retried_by_discord_py_but_503_raises_at_once(server: Server, bot: Bot) -> None:
    fake = server.fake
    route = f"POST /channels/{server.general.id}/messages"
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    fake.fail_next(route, status=503)
    with pytest.raises(discord.DiscordServerError):
        await channel.send("first")
    fake.fail_next(route, status=500)  # discord.py sleeps 1 s before its retry
    await channel.send("second")
    assert [c.status for c in fake.calls_to(route)] == [503, 500, 200]
    assert [s.content for s in fake.sent] == ["second"]


async def test_repeated_nonce_returns_the_first_message(server: Server, bot: Bot) -> None:
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    first = await channel.send("once", nonce="outbox-17")
    again = await channel.send("once", nonce="outbox-17")
    assert again.id == first.id
    assert len(server.fake.sent) == 1
    with pytest.raises(discord.HTTPException) as caught:
        await channel.send("too long a nonce", nonce="x" * 26)
    assert caught.value.code == 50035


async def test_typing_context_posts_a_typing_call(server: Server, bot: Bot) -> None:
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    async with channel.typing():
        pass
    assert server.fake.typing == [server.general.id]


async def test_edit_and_delete_of_a_bot_message(server: Server, bot: Bot) -> None:
    channel = bot.get_channel(server.general.id)
    assert isinstance(channel, discord.TextChannel)
    ours = await channel.send("draft")
    edited = await ours.edit(content="final")
    assert edited.content == "final" and edited.edited_at is not None
    await ours.delete()
    assert [e.body["content"] for e in server.fake.edits] == ["final"]
    assert server.fake.deleted == [ours.id]


# ---- threads ----------------------------------------------------------------------------


async def test_thread_started_from_a_message_is_owned_by_the_bot(server: Server, bot: Bot) -> None:
    fake = server.fake
    await fake.push_message(server.general.id, server.alice, f"{fake.bot_user.mention} long topic")
    message = await bot.next_message()
    thread = await message.create_thread(name="long topic")
    assert thread.id == message.id and thread.owner_id == fake.bot_user.id
    announced = await asyncio.wait_for(bot.threads.get(), TIMEOUT)
    assert announced.id == thread.id
    assert isinstance(bot.get_channel(thread.id), discord.Thread)

    await thread.send("let's talk here")
    (sent,) = await fake.wait_for_sent(1)
    assert sent.channel_id == thread.id

    await fake.push_message(server.general.id, server.alice, "follow-up", thread_id=thread.id)
    in_thread = await bot.next_message()
    assert isinstance(in_thread.channel, discord.Thread)
    assert in_thread.channel.id == thread.id and in_thread.channel.parent_id == server.general.id
    assert in_thread.channel.owner_id == fake.bot_user.id


async def test_thread_started_by_a_member_is_owned_by_the_member(server: Server, bot: Bot) -> None:
    fake = server.fake
    theirs = await fake.create_thread(server.general.id, "alice's corner", server.alice)
    announced = await asyncio.wait_for(bot.threads.get(), TIMEOUT)
    assert announced.id == theirs.id and announced.owner_id == server.alice.id
    await fake.push_message(server.general.id, server.bob, "chatting", thread_id=theirs.id)
    message = await bot.next_message()
    assert isinstance(message.channel, discord.Thread) and message.channel.owner_id == server.alice.id


# ---- application commands ---------------------------------------------------------------


async def test_synced_command_runs_and_answers_ephemerally(server: Server, bot: Bot) -> None:
    fake = server.fake
    with pytest.raises(LookupError):
        await fake.push_interaction("memory", server.alice, server.general.id)
    synced = await bot.tree.sync()
    assert sorted(c.name for c in synced) == ["memory", "remember"]
    assert sorted(c["name"] for c in fake.commands[None]) == ["memory", "remember"]

    await fake.push_interaction("memory", server.alice, server.general.id)
    interaction = await asyncio.wait_for(bot.interactions.get(), TIMEOUT)
    assert interaction.user.id == server.alice.id
    assert interaction.guild_id == server.guild.id and interaction.channel_id == server.general.id
    (response,) = await fake.wait_for_interaction_responses(1)
    assert response.type == 4 and response.content == "nothing yet"
    assert response.flags == 64 and response.ephemeral

    # Re-syncing keeps command ids stable, as Discord does.
    ids = {c["name"]: c["id"] for c in fake.commands[None]}
    await bot.tree.sync()
    assert {c["name"]: c["id"] for c in fake.commands[None]} == ids


async def test_deferred_command_with_option_followup_and_edit(server: Server, bot: Bot) -> None:
    fake = server.fake
    await bot.tree.sync()
    await fake.push_interaction("remember", server.bob, server.alice_dm.id, options={"fact": "likes tea"})
    interaction = await asyncio.wait_for(bot.interactions.get(), TIMEOUT)
    assert interaction.guild_id is None and interaction.namespace.fact == "likes tea"
    (response,) = await fake.wait_for_interaction_responses(1)
    assert response.type == 5 and response.ephemeral
    await fake.wait_until(lambda: len(fake.edits) == 1, TIMEOUT)
    (followup,) = fake.followups
    assert followup.content == "saving likes tea" and followup.flags & 64
    assert fake.edits[0].body["content"] == "remembered likes tea"


async def test_guild_scoped_sync_is_recorded_under_the_guild(server: Server, bot: Bot) -> None:
    guild = discord.Object(server.guild.id)
    bot.tree.copy_global_to(guild=guild)
    await bot.tree.sync(guild=guild)
    assert sorted(c["name"] for c in server.fake.commands[server.guild.id]) == ["memory", "remember"]
    assert None not in server.fake.commands


# ---- routing ----------------------------------------------------------------------------


def test_route_discord_sets_both_class_attributes_and_restores_defaults() -> None:
    route_discord("http://127.0.0.1:9/api/v10/", "ws://127.0.0.1:9/gateway?v=9")
    routes = current_routes()
    assert discord.http.Route.BASE == routes.api_base == "http://127.0.0.1:9/api/v10"
    gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    assert isinstance(gateway, yarl.URL) and str(gateway) == "ws://127.0.0.1:9/gateway"
    assert discord.http.Route("GET", "/users/@me").url == "http://127.0.0.1:9/api/v10/users/@me"
    route_discord(None, None)
    assert current_routes().api_base == DEFAULT_API_BASE == "https://discord.com/api/v10"
    assert current_routes().gateway == DEFAULT_GATEWAY == yarl.URL("wss://gateway.discord.gg/")


@pytest.mark.parametrize(
    ("api", "gateway"),
    [
        ("http://127.0.0.1:9", None),  # no version path: every route would 404
        ("ftp://127.0.0.1:9/api/v10", None),
        ("http://127.0.0.1:9/api/v10?x=1", None),
        (None, "http://127.0.0.1:9/gateway"),
        (None, "ws:///gateway"),
    ],
)
def test_route_discord_refuses_malformed_urls(api: str | None, gateway: str | None) -> None:
    with pytest.raises(ConfigError):
        route_discord(api, gateway)
    assert current_routes().api_base == DEFAULT_API_BASE
