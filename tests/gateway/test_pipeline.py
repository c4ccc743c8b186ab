"""The gateway pipeline end to end: loopback adapter -> gateway -> agent -> real
anthropic SDK -> emulator, and back through the outbox."""

from __future__ import annotations

import asyncio

from gateway.emulator import Reply, ToolUse
from tests.support.loopback import LoopbackAdapter


async def test_a_dm_gets_a_reply_and_is_stored(app_factory, emulator):
    emulator.script(Reply(text="Hello there!"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("hi", user="u1")
        sent = await adapter.wait_sent(1)
        assert sent[0].text == "Hello there!"
        session = await app.store.active_session("loop:dm:u1")
        rows = await app.store.load_messages(session.id)
        assert [(r.role, r.content) for r in rows] == [("user", "hi"), ("assistant", "Hello there!")]
        assert adapter.typing_calls, "typing is shown while the agent works"
        req = emulator.requests[-1]
        assert req.body["messages"][-1]["content"][-1]["text"] == "hi"


async def test_memory_write_reaches_the_next_session_prompt_not_the_current_one(app_factory, emulator):
    emulator.script(
        Reply(tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "User's name is Ada"})]),
        Reply(text="Noted."),
        Reply(text="Second reply."),
        Reply(text="New session reply."),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("call me Ada")
        await adapter.wait_sent(1)
        await adapter.say("and again")
        await adapter.wait_sent(2)
        systems = [r.body["system"][0]["text"] for r in emulator.requests]
        assert len(set(systems)) == 1, "every request of a session sends the identical system prompt"
        assert "Ada" not in systems[0]
        await adapter.say("/reset")
        await adapter.wait_sent(3)
        await adapter.say("who am I?")
        await adapter.wait_sent(4)
        assert "User's name is Ada" in emulator.requests[-1].body["system"][0]["text"]
        profile = (app.settings.memories_dir / "users" / "loop" / "u1" / "USER.md").read_text()
        assert "Ada" in profile


async def test_redelivered_message_is_answered_once(app_factory, emulator):
    emulator.script(Reply(text="one"), Reply(text="two"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        msg = adapter.message("hello", message_id="same")
        await adapter.sink(msg)
        await adapter.sink(msg)
        await adapter.wait_sent(1)
        await asyncio.sleep(0.2)
        assert adapter.texts() == ["one"]
        assert len(emulator.requests) == 1


async def test_unknown_user_is_refused_and_nothing_is_stored(app_factory, emulator):
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ()}) as app:
        await adapter.say("let me in", user="stranger")
        sent = await adapter.wait_sent(1)
        assert "pairing code" in sent[0].text
        assert await app.inbox.unfinished() == []
        assert await app.store.list_sessions(None) == []
        assert emulator.requests == []


async def test_llm_failure_gives_an_apology_and_a_valid_history(app_factory, emulator):
    from gateway.emulator import Fault

    emulator.script(*[Fault(status=529, retry_after=0.01)] * 3, Reply(text="back again"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("hello?")
        sent = await adapter.wait_sent(1)
        assert sent[0].text.startswith("Sorry")
        await adapter.say("still there?")
        await adapter.wait_sent(2)
        assert adapter.texts()[-1] == "back again"
        assert emulator.requests[-1].response_status == 200  # the emulator validated the history


async def test_status_reports_tokens_cache_and_cost(app_factory, emulator):
    emulator.script(Reply(text="x" * 10))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("hi")
        await adapter.wait_sent(1)
        await adapter.say("/status")
        sent = await adapter.wait_sent(2)
        assert "Tokens:" in sent[1].text and "cache hits" in sent[1].text and "$" in sent[1].text
