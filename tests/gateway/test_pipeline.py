"""The gateway pipeline end to end: loopback adapter -> gateway -> agent -> real
anthropic SDK -> emulator, and back through the outbox."""

from __future__ import annotations

import asyncio

from mnemo.gateway.emulator import RecordedRequest, Reply, ToolUse
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
        assert adapter.typing_calls == [], "a reply ready at once shows no typing"
        req = emulator.requests[-1]
        assert req.body["messages"][-1]["content"][-1]["text"] == "hi"


async def test_typing_shows_once_the_model_takes_its_time(app_factory, emulator):
    release = asyncio.Event()

    async def slow(_: RecordedRequest) -> Reply:
        await release.wait()
        return Reply(text="Thought about it.")

    emulator.script(slow)
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await adapter.say("a hard question", user="u1")
        await emulator.wait_for_requests(1)
        for _ in range(500):  # AgentTurn's TYPING_DELAY_S after the turn started
            if adapter.typing_calls:
                break
            await asyncio.sleep(0.01)
        assert [c.chat_id for c in adapter.typing_calls] == ["u1"]
        release.set()
        assert (await adapter.wait_sent(1))[0].text == "Thought about it."


async def test_memory_write_reaches_the_next_session_prompt_not_the_current_one(app_factory, emulator):
    emulator.script(
        Reply(
            tool_uses=[
                ToolUse("memory", {"action": "add", "target": "user", "content": "User's name is Ada"})
            ]
        ),
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
    async with app_factory(adapter):
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
    from mnemo.gateway.emulator import Fault

    emulator.script(*[Fault(status=529, retry_after=0.01)] * 3, Reply(text="back again"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
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
    async with app_factory(adapter):
        await adapter.say("hi")
        await adapter.wait_sent(1)
        await adapter.say("/status")
        sent = await adapter.wait_sent(2)
        assert "Tokens:" in sent[1].text and "cache hits" in sent[1].text and "$" in sent[1].text


async def test_conversation_completes_with_20_percent_injected_faults(app_factory, emulator):
    emulator.set_fault_rate(0.2, statuses=(429, 529, 500), seed=7, retry_after=0.01)
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"llm.max_retries": 6}) as app:
        for i in range(15):
            await adapter.say(f"message number {i}")
            await adapter.wait_sent(i + 1, timeout=30)
        assert not any(t.startswith("Sorry") for t in adapter.texts())
        faults = [r for r in emulator.requests if r.response_status != 200]
        assert faults, "faults were injected"
        # Every answered request was validated by the emulator: the stored history stayed valid.
        session = await app.store.active_session("loop:dm:u1")
        rows = await app.store.load_messages(session.id)
        assert [r.role for r in rows] == ["user", "assistant"] * 15


async def test_two_chats_are_ordered_within_and_concurrent_across(app_factory, emulator):
    release_slow = asyncio.Event()
    order: list[str] = []

    async def responder(request):
        text = request.messages[-1]["content"]
        text = text if isinstance(text, str) else text[-1]["text"]
        if text.startswith("slow"):
            await release_slow.wait()
        order.append(text)
        return Reply(text=f"re: {text}")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await adapter.say("slow 1", user="a")
        await adapter.say("slow 2", user="a")
        for i in range(3):
            await adapter.say(f"fast {i}", user="b")
        await adapter.wait_sent(3)
        assert adapter.texts("b") == ["re: fast 0", "re: fast 1", "re: fast 2"], (
            "a slow chat does not block another"
        )
        release_slow.set()
        await adapter.wait_sent(5)
        assert adapter.texts("a") == ["re: slow 1", "re: slow 2"]
        assert order.index("slow 1") < order.index("slow 2")


async def test_nudge_counters_are_rebuilt_from_history_across_restarts(home, emulator):
    """The review is due on the same turn whether or not the process restarted."""
    from mnemo.app import open_app
    from tests.gateway.conftest import make_settings

    settings = make_settings(home, **{"memory.nudge_interval": 3})
    due: list[int] = []

    async def run_turns(texts):
        adapter = LoopbackAdapter()
        async with open_app(
            settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="k", trial=False
        ) as app:

            async def listener(ctx, result):
                if result.review_due:
                    due.append(result.user_turns)

            app.gateway.turn_listeners.append(listener)
            for i, t in enumerate(texts):
                await adapter.say(t)
                await adapter.wait_sent(i + 1)

    emulator.default = lambda req: Reply(text="ok")
    await run_turns(["one", "two"])
    await run_turns(["three", "four"])  # restart in between
    await run_turns(["five", "six", "seven"])
    assert due == [3, 6], "every 3rd user turn without a memory write, counted from history"


async def test_memory_command_never_shows_a_profile_in_a_public_group_reply(app_factory, emulator):
    from mnemo.gateway.events import ChatType

    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await asyncio.to_thread(
            app.files.user(adapter.message("x", user="ann").speaker).add, "Ann is allergic to nuts"
        )
        await adapter.say("/memory", user="ann", chat="room", chat_type=ChatType.GROUP)
        await adapter.say("/memory", user="ann")
        sent = await adapter.wait_sent(2)
        group, dm = sent[0], sent[1]
        assert "allergic" not in group.text and "private" in group.text
        assert "allergic" in dm.text


async def test_submit_reports_what_became_of_a_message(app_factory, emulator):
    from mnemo.gateway.events import Submitted

    emulator.script(Reply(text="hi"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": (), "access.unauthorized_reply": "silent"}):
        msg = adapter.message("hello", user="admin", message_id="a1")
        assert await adapter.sink(msg) is Submitted.ACCEPTED
        assert await adapter.sink(msg) is Submitted.DUPLICATE
        assert await adapter.sink(adapter.message("hello", user="stranger")) is Submitted.DROPPED
        await adapter.wait_sent(1)


async def test_idle_reset_starts_a_new_session_after_the_idle_time_and_not_before(app_factory, emulator):
    """The idle policy reads the session's last activity (it used to fail every turn)."""
    import sqlite3

    emulator.script(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"sessions.idle_reset_minutes": 30}) as app:
        await adapter.say("hi")
        await adapter.say("still here")
        sent = await adapter.wait_sent(2)
        first = await app.store.active_session("loop:dm:u1")
        assert [m.text for m in sent] == ["one", "two"]
        assert first.message_count == 4
        with sqlite3.connect(app.settings.state_db) as db:  # an hour of silence
            db.execute(
                "UPDATE messages SET created_at = '2020-01-01T00:00:00+00:00' WHERE session_id = ?",
                (first.id,),
            )
        await adapter.say("back again")
        sent = await adapter.wait_sent(3)
        second = await app.store.active_session("loop:dm:u1")
        ended = await app.store.get_session(first.id)
    assert sent[2].text == "three"
    assert second.id != first.id
    assert ended.end_reason == "idle"


async def test_a_lone_surrogate_from_a_platform_is_replaced_and_the_message_answered(app_factory, emulator):
    emulator.script(Reply(text="got it"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("caf\ud800 au lait")
        sent = await adapter.wait_sent(1)
        session = await app.store.active_session("loop:dm:u1")
        rows = await app.store.load_messages(session.id)
    assert sent[0].text == "got it"
    assert rows[0].content == "caf\ufffd au lait"


async def test_a_shared_rooms_turns_log_their_own_speaker_not_the_lanes_first(app_factory, emulator):
    """The lane's task is created while the first sender's log context is bound; each
    turn must log its own speaker (structlog's context is what every log line carries)."""
    import structlog

    from mnemo.gateway.events import ChatType

    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    logged: list[str | None] = []
    async with app_factory(adapter, **{"sessions.group_sessions_per_user": False}) as app:

        async def listener(ctx, result):
            logged.append(structlog.contextvars.get_contextvars().get("user"))

        app.gateway.turn_listeners.append(listener)
        await adapter.say("hello from alice", user="alice", chat="room", chat_type=ChatType.GROUP)
        await adapter.wait_sent(1)
        await adapter.say("hello from bob", user="bob", chat="room", chat_type=ChatType.GROUP)
        await adapter.wait_sent(2)
    assert logged == ["alice", "bob"]
