"""Discord end to end: the real discord.py client inside ``DiscordAdapter`` against the
fake Discord, the real anthropic SDK against the emulator, and the whole gateway between
them (``tests/adapters/discord_harness.py``). Every test also checks, on exit, that no
message the bot posted could ping @everyone, @here or a role."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.adapters.discord import NONCE_MAX, DiscordAdapter
from mnemo.adapters.discord_routing import restore_discord_defaults
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from mnemo.gateway.errors import StartupError
from mnemo.gateway.events import ChatRef, InboundMessage, OutboundMessage
from mnemo.gateway.ports import CommandInfo
from mnemo.memory.policy import Groups
from mnemo.memory.scope import UserRef
from tests.adapters.discord_harness import TIMEOUT, Bot, running_bot
from tests.fakes.discord_api import FakeDiscord


@pytest.fixture
async def bot(home: Path, emulator: Emulator) -> AsyncIterator[Bot]:
    async with running_bot(home, emulator) as running:
        yield running


def last_user_text(request) -> str:
    content = request.body["messages"][-1]["content"]
    return "\n".join(block["text"] for block in content if block.get("type") == "text")


# ---- receiving: who the bot answers -----------------------------------------------------


async def test_server_message_without_mention_gets_no_reply_and_no_llm_request(bot: Bot) -> None:
    bot.emulator.script(Reply(text="Hi Alice!"))
    await bot.say(bot.general, bot.bob, "just chatting about lunch")
    await bot.say(bot.general, bot.robo, f"{bot.mention} I am a bot, answer me")
    asked = await bot.say(bot.general, bot.alice, f"{bot.mention} what's up? say hi to {bot.bob.mention}")
    (reply,) = await bot.sent(1)
    await bot.settle()

    # Events arrive in order, so the two earlier messages were seen and dropped.
    assert len(bot.emulator.requests) == 1
    assert last_user_text(bot.emulator.requests[0]) == "what's up? say hi to @Bob"
    assert reply.content == "Hi Alice!"
    assert reply.channel_id == bot.general.id
    assert reply.message_reference is not None and reply.message_reference["message_id"] == asked
    assert reply.allowed_mentions == {"parse": [], "users": [bot.alice.id], "replied_user": True}
    # The bot's own reply came back over the gateway and was not taken as a message.
    assert len(bot.fake.sent) == 1
    assert await bot.app.store.active_session(bot.session_key(bot.general, bot.alice)) is not None


async def test_dm_is_answered_in_the_dm_without_a_quote_and_with_typing(bot: Bot) -> None:
    release = asyncio.Event()

    async def thinking(_: RecordedRequest) -> Reply:
        await release.wait()  # long enough for typing to show
        return Reply(text="Hello back, in private.")

    bot.emulator.script(thinking)
    await bot.say(bot.alice_dm, bot.alice, "hello in private")
    for _ in range(500):
        if bot.fake.typing:
            break
        await asyncio.sleep(0.01)
    release.set()
    (reply,) = await bot.sent(1)
    assert reply.channel_id == bot.alice_dm.id
    assert reply.content == "Hello back, in private."
    assert reply.message_reference is None
    assert bot.fake.typing == [bot.alice_dm.id], "one typing request for a turn shorter than the refresh"
    assert last_user_text(bot.emulator.requests[0]) == "hello in private"
    assert await bot.app.store.active_session(f"discord:dm:{bot.alice_dm.id}") is not None


async def test_reply_to_the_bot_without_a_mention_is_answered_with_the_quote(bot: Bot) -> None:
    bot.emulator.script(Reply(text="The capital is Paris."), Reply(text="Yes, about 2 million people."))
    await bot.say(bot.general, bot.alice, f"{bot.mention} capital of France?")
    (first,) = await bot.sent(1)
    alice_question = await bot.say(bot.general, bot.alice, "a question for bob only")
    # A reply to a member's message, without mentioning the bot: not for the bot.
    await bot.say(bot.general, bot.bob, "answering alice", reference=alice_question)
    await bot.say(bot.general, bot.alice, "is it big?", reference=first.id, reply_ping=False)
    second = (await bot.sent(2))[1]
    await bot.settle()

    assert second.content == "Yes, about 2 million people."
    assert len(bot.emulator.requests) == 2
    assert last_user_text(bot.emulator.requests[1]) == "> The capital is Paris.\nis it big?"


async def test_mention_in_a_thread_reply_channel_moves_the_conversation_into_a_thread(bot: Bot) -> None:
    bot.emulator.script(Reply(text="Let's sort it out here."), Reply(text="Try restarting it."))
    asked = await bot.say(bot.support, bot.alice, f"{bot.mention} my printer is on fire\nsecond line")
    (first,) = await bot.sent(1)
    thread = bot.fake.world.channels[asked]  # a thread started from a message has its id
    assert thread.is_thread and thread.parent_id == bot.support.id
    assert thread.owner_id == bot.fake.bot_user.id and thread.name == "my printer is on fire"
    assert first.channel_id == thread.id
    assert first.message_reference is None  # the thread shows the question at its top

    # In the bot's own thread no mention is needed.
    await bot.say(bot.support, bot.alice, "still burning", thread_id=thread.id)
    second = (await bot.sent(2))[1]
    assert second.channel_id == thread.id and second.content == "Try restarting it."
    key = bot.session_key(bot.support, bot.alice, thread=thread.id)
    session = await bot.app.store.active_session(key)
    assert session is not None
    rows = await bot.app.store.load_messages(session.id)
    assert [r.content for r in rows if r.role == "user"] == [
        "my printer is on fire\nsecond line",
        "still burning",
    ]


async def test_thread_that_cannot_be_created_means_an_answer_in_the_channel(bot: Bot) -> None:
    bot.fake.fail_next("/threads", status=403, code=50001, message="Missing Access")
    bot.emulator.script(Reply(text="Answering here instead."))
    asked = await bot.say(bot.support, bot.alice, f"{bot.mention} help")
    (reply,) = await bot.sent(1)
    assert reply.channel_id == bot.support.id
    assert reply.message_reference is not None and reply.message_reference["message_id"] == asked
    assert await bot.app.store.active_session(bot.session_key(bot.support, bot.alice)) is not None


async def test_thread_started_by_a_member_needs_a_mention(bot: Bot) -> None:
    bot.emulator.script(Reply(text="I'm here."))
    theirs = await bot.fake.create_thread(bot.general.id, "alice's corner", bot.alice)
    await bot.say(bot.general, bot.bob, "chatting in alice's thread", thread_id=theirs.id)
    await bot.say(bot.general, bot.bob, f"{bot.mention} are you there?", thread_id=theirs.id)
    (reply,) = await bot.sent(1)
    await bot.settle()
    assert reply.channel_id == theirs.id
    assert len(bot.emulator.requests) == 1
    assert await bot.app.store.active_session(bot.session_key(bot.general, bot.bob, thread=theirs.id))


# ---- sending ---------------------------------------------------------------------------


async def test_long_reply_is_split_under_2000_chars_with_balanced_code_fences(bot: Bot) -> None:
    code = [f"    print('line {i:03d} of the long script')  # padding" for i in range(120)]
    text = "Here is the script:\n\n```python\n" + "\n".join(code) + "\n```\n\nRun it with python3."
    assert len(text) > 6000
    bot.emulator.script(Reply(text=text))
    await bot.say(bot.general, bot.alice, f"{bot.mention} write me a long script")
    await bot.emulator.wait_for_requests(1)
    await bot.settle()
    chunks = bot.fake.sent
    assert len(chunks) >= 4
    for chunk in chunks:
        assert len(chunk.content) <= 2000
        assert chunk.content.count("```") % 2 == 0, chunk.content[-80:]
    assert all(c.content.lstrip().startswith("```python") for c in chunks[1:-1])
    joined = "\n".join(c.content for c in chunks)
    assert all(joined.count(line) == 1 for line in code)
    assert chunks[-1].content.endswith("Run it with python3.")
    # Only the first chunk quotes the question; every chunk has its own stable nonce.
    assert chunks[0].message_reference is not None
    assert all(c.message_reference is None for c in chunks[1:])
    nonces = [c.body["nonce"] for c in chunks]
    assert len(set(nonces)) == len(nonces) and all(len(n) <= NONCE_MAX for n in nonces)
    assert all(c.body["enforce_nonce"] for c in chunks)


async def test_reply_containing_everyone_pings_only_the_author(bot: Bot) -> None:
    role = f"<@&{bot.guild.id}>"
    bot.emulator.script(
        Reply(text=f"@everyone look! {bot.bob.mention} and {bot.alice.mention}, also @here and {role}")
    )
    await bot.say(bot.general, bot.alice, f"{bot.mention} announce it")
    (reply,) = await bot.sent(1)
    assert reply.allowed_mentions == {"parse": [], "users": [bot.alice.id], "replied_user": True}
    assert reply.pings.users == {bot.alice.id}
    assert not reply.pings.everyone and not reply.pings.roles
    assert reply.content.startswith("@\u200deveryone look!") and "@\u200dhere" in reply.content


async def test_resend_of_the_same_outbox_row_is_deduplicated_by_its_nonce(bot: Bot) -> None:
    bot.emulator.script(Reply(text="Only once, please."))
    await bot.say(bot.general, bot.alice, f"{bot.mention} say it once")
    (first,) = await bot.sent(1)
    await bot.settle()
    row = await bot.app.outbox.get(1)
    assert row is not None and row.state == "sent"
    # As after a crash while the send was in flight: the same row, labelled, again.
    again = dataclasses.replace(row.to_message(), possible_duplicate=True)
    assert await bot.adapter.send(again) == [str(first.id)]
    assert len(bot.fake.sent) == 1

    labelled = OutboundMessage(
        chat=ChatRef("discord", str(bot.general.id)),
        text="daily digest",
        scheduled=True,
        possible_duplicate=True,
        outbox_id=999,
    )
    await bot.adapter.send(labelled)
    assert (
        bot.fake.sent[-1].content
        == "⏰ scheduled · (possible duplicate: re-sent after a restart)\ndaily digest"
    )
    assert bot.fake.sent[-1].allowed_mentions == {"parse": [], "users": []}


async def test_429_on_send_is_retried_by_discord_py_then_by_the_outbox(bot: Bot) -> None:
    route = f"POST /channels/{bot.general.id}/messages"
    bot.emulator.script(Reply(text="after one 429"), Reply(text="after six 429s"))
    bot.fake.fail_next(route, status=429, retry_after=0.05)
    await bot.say(bot.general, bot.alice, f"{bot.mention} first")
    await bot.sent(1)
    assert [c.status for c in bot.fake.calls_to(route)] == [429, 200]

    # More 429s than discord.py retries (5): the outbox takes over and sends it later.
    bot.fake.fail_next(route, status=429, retry_after=0.01, times=5)
    await bot.say(bot.general, bot.alice, f"{bot.mention} second")
    second = (await bot.sent(2))[1]
    await bot.settle()
    assert second.content == "after six 429s"
    assert [c.status for c in bot.fake.calls_to(route)][2:] == [429] * 5 + [200]
    row = await bot.app.outbox.get(2)
    assert row is not None and row.state == "sent" and row.attempts == 2
    assert len(bot.fake.sent) == 2


async def test_503_on_send_is_retried_by_the_outbox(bot: Bot) -> None:
    route = f"POST /channels/{bot.general.id}/messages"
    bot.fake.fail_next(route, status=503)  # discord.py raises a 503 at once
    bot.emulator.script(Reply(text="after an outage"))
    await bot.say(bot.general, bot.alice, f"{bot.mention} anyone?")
    (reply,) = await bot.sent(1)
    await bot.settle()
    assert reply.content == "after an outage"
    assert [c.status for c in bot.fake.calls_to(route)] == [503, 200]
    row = await bot.app.outbox.get(1)
    assert row is not None and row.state == "sent" and row.attempts == 2


async def test_send_refused_with_403_fails_the_outbox_row_and_the_bot_carries_on(bot: Bot) -> None:
    route = f"POST /channels/{bot.general.id}/messages"
    bot.fake.fail_next(route, status=403, code=50013, message="Missing Permissions")
    bot.emulator.script(Reply(text="you will never see this"), Reply(text="but this arrives"))
    await bot.say(bot.general, bot.alice, f"{bot.mention} hello?")
    await bot.emulator.wait_for_requests(1)
    await bot.settle()
    row = await bot.app.outbox.get(1)
    assert row is not None and row.state == "failed" and row.attempts == 1
    assert row.error is not None and "Missing Permissions" in row.error
    assert bot.fake.sent == []

    assert bot.adapter.connected
    await bot.say(bot.alice_dm, bot.alice, "are you alive?")
    (reply,) = await bot.sent(1)
    assert reply.content == "but this arrives"


# ---- application commands --------------------------------------------------------------


async def test_gateway_commands_are_registered_as_application_commands(bot: Bot) -> None:
    registered = {c["name"]: c for c in bot.fake.commands[None]}
    # The application commands are the app's one command registry, /cron included.
    assert list(registered) == [c.name for c in bot.app.commands.infos()]
    assert "cron" in registered and registered["cron"]["options"][0]["name"] == "text"
    assert registered["search"]["options"] == [
        {"type": 3, "name": "text", "description": "what the command acts on", "required": False}
    ]
    # /memory takes history, undo, policy …; /status takes nothing and offers no option.
    assert registered["memory"]["options"] == registered["search"]["options"]
    assert registered["status"]["options"] == []


async def test_memory_command_is_answered_as_an_ephemeral_followup(bot: Bot) -> None:
    await asyncio.to_thread(bot.app.files.user(UserRef("discord", str(bot.alice.id))).add, "Alice keeps bees")
    await bot.fake.push_interaction("memory", bot.alice, bot.general.id)
    await bot.fake.push_interaction("memory", bot.bob, bot.general.id)
    await bot.fake.wait_until(lambda: len(bot.fake.followups) == 2, TIMEOUT)

    assert [r.type for r in bot.fake.interaction_responses] == [5, 5]  # deferred at once
    assert all(r.ephemeral for r in bot.fake.interaction_responses)
    by_user = {f.allowed_mentions["users"][0]: f for f in bot.fake.followups}
    assert "Alice keeps bees" in by_user[bot.alice.id].content
    assert "bees" not in by_user[bot.bob.id].content
    assert by_user[bot.bob.id].content.startswith("Your profile is empty")
    assert all(f.flags & 64 for f in bot.fake.followups)
    assert bot.fake.sent == []  # nothing in the channel
    assert bot.emulator.requests == []


async def test_command_with_text_option_runs_with_its_argument(bot: Bot) -> None:
    await bot.fake.push_interaction("search", bot.alice, bot.alice_dm.id, options={"text": "zeppelins"})
    await bot.fake.wait_until(lambda: len(bot.fake.followups) == 1, TIMEOUT)
    assert bot.fake.followups[0].content == "Nothing found for “zeppelins” in this chat."


async def test_command_whose_interaction_expired_is_answered_by_dm_not_in_the_channel(bot: Bot) -> None:
    await asyncio.to_thread(bot.app.files.user(UserRef("discord", str(bot.alice.id))).add, "Alice keeps bees")
    bot.fake.fail_next("POST /webhooks", status=404, code=10015, message="Unknown Webhook")
    await bot.fake.push_interaction("memory", bot.alice, bot.general.id)
    (dm,) = await bot.sent(1)
    assert dm.channel_id == bot.alice_dm.id
    assert "Alice keeps bees" in dm.content
    assert bot.fake.followups == []


async def test_refusal_of_a_command_stays_private_to_the_caller(home: Path, emulator: Emulator) -> None:
    async with running_bot(home, emulator, **{"access.allowed": ()}) as bot:
        await bot.fake.push_interaction("memory", bot.alice, bot.general.id)
        await bot.fake.wait_until(lambda: len(bot.fake.followups) == 1, TIMEOUT)
        (refusal,) = bot.fake.followups
        assert refusal.content == "Sorry, I'm not available to you here." and refusal.flags & 64
        assert bot.fake.sent == []
        assert await bot.app.inbox.unfinished() == []


# ---- memory isolation between members ---------------------------------------------------


async def test_members_of_one_channel_have_isolated_profiles(bot: Bot) -> None:
    bot.emulator.script(
        Reply(
            tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "Alice keeps bees"})]
        ),
        Reply(text="Noted."),
        Reply(text="Hello Bob."),
        Reply(text="You keep bees."),
        Reply(text="I know nothing about you, Bob."),
    )
    await _share_in_groups(bot, bot.alice.id)  # a profile reaches group prompts only when shared
    await bot.say(bot.general, bot.alice, f"{bot.mention} note my hobby: apiary")
    await bot.sent(1)
    await bot.say(bot.general, bot.bob, f"{bot.mention} hi from bob-1")
    await bot.sent(2)
    await bot.say(bot.general, bot.alice, f"{bot.mention} /reset")  # a typed command works too
    await bot.sent(3)
    await bot.say(bot.general, bot.alice, f"{bot.mention} what is my hobby?")
    await bot.sent(4)
    await bot.say(bot.general, bot.bob, f"{bot.mention} what is my hobby? bob-2")
    sent = await bot.sent(5)
    await bot.settle()

    assert [m.content for m in sent[1:]] == [
        "Hello Bob.",
        "Started a new conversation. I still remember what is in my memory.",
        "You keep bees.",
        "I know nothing about you, Bob.",
    ]
    alices = bot.requests_mentioning('what is my hobby?"')
    # Shared in groups: in her own turn, fenced with the message (never the group's system prompt).
    assert len(alices) == 1 and "Alice keeps bees" not in alices[0].system_text
    assert "Alice keeps bees" in json.dumps(alices[0].body)
    bobs = bot.requests_mentioning("bob-")
    assert len(bobs) == 2
    for request in bobs:
        assert "bees" not in json.dumps(request.body)
    profile = bot.app.settings.memories_dir / "users" / "discord" / str(bot.alice.id) / "USER.md"
    assert "Alice keeps bees" in profile.read_text()
    assert not (bot.app.settings.memories_dir / "users" / "discord" / str(bot.bob.id) / "USER.md").exists()


async def _share_in_groups(bot: Bot, member_id: int) -> None:
    """The person's policy ``groups: shared`` (``/memory policy groups shared`` in a DM)."""
    assert bot.app.policies is not None
    who = str(UserRef("discord", str(member_id)))
    await bot.app.policies.repo.set_person(who, groups=Groups.SHARED, by="test")


async def test_shared_room_puts_the_speakers_profile_only_in_their_newest_turn(bot: Bot) -> None:
    await _share_in_groups(bot, bot.alice.id)
    await asyncio.to_thread(bot.app.files.user(UserRef("discord", str(bot.alice.id))).add, "Alice keeps bees")
    bot.emulator.script(Reply(text="Hi Alice."), Reply(text="Hi Bob."))
    await bot.say(bot.lounge, bot.alice, f"{bot.mention} morning all")
    await bot.sent(1)
    await bot.say(bot.lounge, bot.bob, f"{bot.mention} morning from bob")
    await bot.sent(2)
    await bot.settle()

    alices, bobs = bot.emulator.requests
    assert "bees" not in alices.system_text
    newest = last_user_text(alices)
    assert "<memory-context>" in newest and "Alice keeps bees" in newest
    assert "bees" not in json.dumps(bobs.body)
    assert "morning all" in json.dumps(bobs.body["messages"])  # one shared conversation
    assert await bot.app.store.active_session(bot.session_key(bot.lounge)) is not None


# ---- start-up --------------------------------------------------------------------------


# The commands an app's registry would hand the adapter.
MENU = (CommandInfo("help", "list the commands"), CommandInfo("search", "search", takes_args=True))


async def _start_alone(fake: FakeDiscord, home: Path, token: str) -> DiscordAdapter:
    settings = load_settings(
        home,
        environ={},
        overrides={
            "discord.bot_token": token,
            "discord.api_base_url": fake.api_base,
            "discord.gateway_url": fake.gateway_url,
        },
    )
    received: list[InboundMessage] = []

    async def sink(msg: InboundMessage) -> None:
        received.append(msg)

    adapter = DiscordAdapter(settings.discord, guild_ready_timeout_s=0.05, ready_timeout_s=TIMEOUT)
    try:
        await adapter.start(sink, MENU)
    finally:
        restore_discord_defaults()
    return adapter


async def test_bad_token_is_a_clear_startup_error(home: Path) -> None:
    async with FakeDiscord() as fake:
        with pytest.raises(StartupError, match="DISCORD_BOT_TOKEN"):
            await _start_alone(fake, home, "not-the-token")
        assert [c.status for c in fake.calls] == [401]
        assert fake.connections == []


async def test_message_content_intent_not_enabled_is_a_clear_startup_error(home: Path) -> None:
    async with FakeDiscord(privileged_intents=()) as fake:
        with pytest.raises(StartupError, match="Message Content"):
            await _start_alone(fake, home, fake.token)


async def test_a_registered_command_with_a_subcommand_is_replaced_at_start(home: Path) -> None:
    # Another program registered /search with a subcommand, an option that has no
    # "required": start compares, sees the difference and registers ours (it used to fail).
    async with FakeDiscord() as fake:
        first = await _start_alone(fake, home, fake.token)
        await first.stop()
        (search,) = [c for c in fake.commands[None] if c["name"] == "search"]
        search["options"] = [{"type": 1, "name": "recent", "description": "recent messages", "options": []}]
        second = await _start_alone(fake, home, fake.token)
        assert second.connected
        await second.stop()
    assert [c.route.split(" ")[0] for c in fake.calls_to("/commands")] == ["GET", "PUT", "GET", "PUT"]
    (search,) = [c for c in fake.commands[None] if c["name"] == "search"]
    assert [o["name"] for o in search["options"]] == ["text"]


async def test_restart_does_not_resync_unchanged_commands(home: Path) -> None:
    async with FakeDiscord() as fake:
        first = await _start_alone(fake, home, fake.token)
        assert first.connected
        await first.stop()
        await first.stop()  # idempotent
        assert not first.connected
        second = await _start_alone(fake, home, fake.token)
        await second.stop()
    assert [c.route.split(" ")[0] for c in fake.calls_to("/commands")] == ["GET", "PUT", "GET"]
