"""The housekeeping jobs through the whole app (real SDK against the emulator):
compression = flush + summary + rollover, failure handling, memory review, session end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mnemo.gateway.emulator import Fault, RecordedRequest, Reply, ToolUse, trial_reply
from mnemo.memory.compressor import SUMMARY_END, SUMMARY_KEY, is_summary
from mnemo.memory.flush import BACKGROUND_TAG, MemoryPass, instruction
from tests.support.loopback import LoopbackAdapter

# With an 8k window the threshold is 4,096 tokens; the system prompt and tool schemas
# take ~1,000, so ten turns of ~300 tokens cross it.
SMALL = {
    "llm.context_window": 8192,
    "llm.max_tokens": 1024,
    "memory.nudge_interval": 0,
    "access.rate_limit_per_minute": 0,
}
MAIN = "claude-sonnet-4-6"  # the conversation's model: background passes read its cache


def last_text(request: RecordedRequest) -> str:
    content = request.messages[-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def kind_of(request: RecordedRequest) -> str:
    """Background passes are sent after the conversation itself, their instruction
    tagged in the last user turn."""
    text = last_text(request)
    if BACKGROUND_TAG not in text:
        return "chat"
    return "summary" if re.search(r"^## Goal", text, re.M) else "memory"


Hook = Callable[[RecordedRequest], "Reply | Fault | Awaitable[Reply | Fault] | None"]


class World:
    """The emulator's responder for these tests: long chat replies, and per kind of
    background request a hook (default: the scripted trial model)."""

    def __init__(self) -> None:
        self.hooks: dict[str, Hook] = {}
        self.seen: dict[str, list[RecordedRequest]] = {"chat": [], "memory": [], "summary": []}

    async def __call__(self, request: RecordedRequest) -> Reply | Fault:
        kind = kind_of(request)
        self.seen[kind].append(request)
        hook = self.hooks.get(kind)
        if hook is not None:
            result = hook(request)
            if asyncio.iscoroutine(result):
                result = await result
            if result is not None:
                return result
        if kind == "chat":
            return Reply(text=f"reply to {last_text(request)[:24]!r} " + "w" * 360)
        return trial_reply(request)


async def converse(adapter: LoopbackAdapter, texts: list[str], *, already: int = 0, user: str = "u1") -> int:
    for i, text in enumerate(texts):
        await adapter.say(text, user=user)
        await adapter.wait_sent(already + i + 1, timeout=30)
    return already + len(texts)


async def settle(app) -> None:
    """Turns finished (their jobs enqueued), then every due job done."""
    await app.gateway.lanes.drain(30)
    await app.jobs.wait_idle()


async def converse_until_rollover(
    app, adapter: LoopbackAdapter, texts: list[str], *, already: int = 0
) -> int:
    """One message at a time, each followed by its jobs, until a compression rolled the
    chat over (so exactly one rollover happens, however fast the machine is)."""
    before = max(1, len(await chain(app)))  # the first message creates the first session
    n = already
    for text in texts:
        n = await converse(adapter, [text], already=n)
        await settle(app)
        if len(await chain(app)) > before:
            return n
    raise AssertionError("the conversation never rolled over")


def filler(n: int, start: int = 0) -> list[str]:
    return [f"message {start + i}: " + "tell me more about the harbour. " * 24 for i in range(n)]


async def chain(app, key: str = "loop:dm:u1") -> list:
    sessions = await app.store.list_sessions(key, limit=50)
    return sorted(sessions, key=lambda s: s.started_at)


async def test_compression_flushes_summarises_and_rolls_over(app_factory, emulator):
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        n = await converse_until_rollover(app, adapter, ["Hi! I prefer green tea over coffee.", *filler(20)])
        sessions = await chain(app)
        assert len(sessions) == 2, "one rollover"
        old, new = sessions
        assert old.end_reason == "compression" and old.ended_at is not None
        assert new.parent_session_id == old.id and new.source == "chat" and new.ended_at is None
        assert (await app.store.active_session("loop:dm:u1")).id == new.id

        # Flush first: after the conversation (its model, tools and system prompt), the
        # current memory shown.
        flush, summary = world.seen["memory"][0], world.seen["summary"][0]
        chat = world.seen["chat"][-1]
        assert emulator.requests.index(flush) < emulator.requests.index(summary)
        assert flush.model == MAIN and summary.model == MAIN
        assert flush.tool_names == summary.tool_names == chat.tool_names
        assert flush.system_text == summary.system_text == old.system_prompt
        assert instruction(MemoryPass.COMPRESSION) in last_text(flush)
        assert "(this user's profile is empty)" in last_text(flush)
        profile = (app.settings.memories_dir / "users" / "loop" / "u1" / "USER.md").read_text()
        assert "User prefers green tea over coffee." in profile

        # The new session: fresh system prompt (memory written meanwhile is in it), head + summary + tail.
        assert (
            "green tea" not in old.system_prompt
            and "User prefers green tea over coffee." in new.system_prompt
        )
        old_rows = await app.store.load_messages(old.id)
        new_rows = await app.store.load_messages(new.id)
        summaries = [r for r in new_rows if is_summary(r)]
        assert len(summaries) == 1 and new_rows[3] is summaries[0]
        assert summaries[0].content.endswith(SUMMARY_END) and "## Goal" in summaries[0].content
        assert [r.content for r in new_rows[:3]] == [r.content for r in old_rows[:3]]
        tail = [r for r in new_rows[4:] if "carried_from" in r.meta]
        assert tail == new_rows[4 : 4 + len(tail)], "carried rows come first, then the new session's own"
        assert [r.content for r in tail] == [r.content for r in old_rows[len(old_rows) - len(tail) :]]
        assert [r.meta["carried_from"] for r in tail] == [r.id for r in old_rows[len(old_rows) - len(tail) :]]

        # The conversation goes on in the new session with a valid request.
        await converse(adapter, ["and now?"], already=n)
        last = world.seen["chat"][-1]
        assert last.system_text == new.system_prompt and last.response_status == 200
        job = (await app.jobs.jobs(kind="compress"))[0]
        assert job.state == "done" and job.checkpoint["flushed"] is True
        await converse(adapter, ["/status"], already=n + 1)
        status = adapter.texts()[-1]
        assert "Background jobs: 0 queued, 0 running, 0 failed" in status and "compress 1 done" in status


async def test_flush_leaves_no_trace_in_the_stored_or_the_next_request(app_factory, emulator):
    world = World()
    world.hooks["memory"] = lambda req: Reply(
        text="FLUSH-REPLY",
        tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "User sails."})],
    )
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        n = await converse(adapter, filler(13))
        await settle(app)
        await converse(adapter, ["one more"], already=n)
        stored = [r for s in await chain(app) for r in await app.store.load_messages(s.id)]
        for r in stored:
            assert "[System:" not in r.content and "FLUSH-REPLY" not in r.content
            assert all(call.name != "memory" for call in r.tool_calls)
            assert r.role != "tool"
        body = str(world.seen["chat"][-1].body["messages"])
        assert "[System:" not in body and "FLUSH-REPLY" not in body and "User sails." not in body
        assert "User sails." in world.seen["chat"][-1].system_text, "the flush wrote to memory"


async def test_transient_summary_failure_keeps_the_transcript_and_retries_after_a_cooldown(
    app_factory, emulator
):
    world = World()
    world.hooks["summary"] = lambda req: Fault(529, retry_after=0)
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        await converse(adapter, filler(13))
        (job,) = await app.jobs.jobs(kind="compress")
        for _ in range(500):
            job = await app.jobs.get(job.id)
            if job.attempts == 1 and job.state == "queued":
                break
            await asyncio.sleep(0.02)
        assert job.state == "queued" and "RateLimited" in job.error
        assert 55 <= job.not_before - job.updated_at <= 61, "60 s cooldown, persisted on the row"
        assert len(await chain(app)) == 1 and (await chain(app))[0].ended_at is None, "transcript kept"
        flushes = len(world.seen["memory"])

        del world.hooks["summary"]
        await app.db.write(lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE id = ?", (job.id,)))
        app.jobs.wake()
        await settle(app)
        job = await app.jobs.get(job.id)
        assert job.state == "done" and job.attempts == 2
        assert len(world.seen["memory"]) == flushes == 1, "the retry did not flush again"
        assert len(await chain(app)) == 2


async def test_non_transient_summary_failure_uses_the_deterministic_fallback(app_factory, emulator):
    world = World()
    world.hooks["summary"] = lambda req: Fault(400, body="this request is not acceptable")
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        await converse_until_rollover(app, adapter, filler(20))
        old, new = await chain(app)
        summary = next(r for r in await app.store.load_messages(new.id) if is_summary(r))
        assert summary.meta["fallback"] is True
        assert "## Goal" in summary.content and "message 3:" in summary.content
        models = [r.model for r in world.seen["summary"]]
        assert models == [MAIN], "one request on the conversation's model, then the fallback"


async def test_reset_while_compressing_abandons_the_rollover(app_factory, emulator):
    world = World()
    release = asyncio.Event()

    async def held(req: RecordedRequest) -> None:
        await release.wait()

    world.hooks["summary"] = held
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        n = await converse(adapter, filler(13))
        while not world.seen["summary"]:
            await asyncio.sleep(0.02)
        await converse(adapter, ["/reset"], already=n)
        release.set()
        await settle(app)
        sessions = await chain(app)
        assert [s.end_reason for s in sessions] == ["reset"], "no compression child after a reset"
        assert (await app.jobs.jobs(kind="compress"))[0].state == "done"


async def test_review_saves_after_the_conversation_add_only_and_the_user_sees_nothing(app_factory, emulator):
    world = World()
    world.hooks["memory"] = lambda req: Reply(
        text="reviewing",
        tool_uses=[
            ToolUse("memory", {"action": "replace", "target": "user", "old_text": "Ada", "content": "Bob"}),
            ToolUse("memory", {"action": "add", "target": "user", "content": "User writes haiku."}),
        ],
    )
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"memory.nudge_interval": 2}) as app:
        home_memories = app.settings.memories_dir / "users" / "loop" / "u1"
        home_memories.mkdir(parents=True)
        (home_memories / "USER.md").write_text("User's name is Ada.")
        await converse(adapter, ["hello there", "I write haiku at night"])
        await settle(app)
        (job,) = await app.jobs.jobs(kind="review")
        assert job.state == "done" and job.checkpoint == {
            "reviewed": True,
            "writes": 1,
            "after_user": 3,
            "covered": [1, 3],
        }
        (review,) = world.seen["memory"]
        assert review.model == MAIN and "memory" in review.tool_names
        assert "I write haiku at night" in str(review.messages[-2]["content"]), "the conversation itself"
        assert "last 2 user turns" in last_text(review)
        assert "User's name is Ada." in last_text(review), "the current memory is shown"
        profile = (home_memories / "USER.md").read_text()
        assert "User's name is Ada." in profile and "Bob" not in profile, "replace is refused in a review"
        assert "User writes haiku." in profile
        assert len(adapter.texts()) == 2 and all(t.startswith("reply to") for t in adapter.texts())
        rows = await app.store.load_messages((await chain(app))[0].id)
        assert [r.role for r in rows] == ["user", "assistant"] * 2


async def test_session_end_flushes_long_sessions_once_and_calls_the_hook(app_factory, emulator):
    world = World()
    emulator.default = world
    ended: list[tuple[str, int]] = []

    class RecordingHooks:
        """The providers' hooks, recording each session end before passing it on."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def session_end(self, session: Any, rows: Any) -> None:
            ended.append((session.end_reason, len(rows)))
            await self.inner.session_end(session, rows)

        async def session_switch(self, old: Any, new: Any) -> None:
            await self.inner.session_switch(old, new)

        async def pre_compress(self, session: Any, rows: Any) -> bool:
            return await self.inner.pre_compress(session, rows)

    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        app.housekeeping.hooks = RecordingHooks(app.housekeeping.hooks)
        n = await converse(adapter, [f"turn {i}" for i in range(6)])
        n = await converse(adapter, ["/reset"], already=n)
        await settle(app)
        assert len(world.seen["memory"]) == 1, "six user turns: flushed"
        assert instruction(MemoryPass.SESSION_END) in last_text(world.seen["memory"][0])
        n = await converse(adapter, ["short one", "/reset"], already=n)
        await settle(app)
        assert len(world.seen["memory"]) == 1, "one user turn: no flush"
        assert ended == [("reset", 12), ("reset", 2)]
        jobs = await app.jobs.jobs(kind="session_end")
        assert [j.checkpoint.get("hooked") for j in jobs] == [True, True]
        assert jobs[0].checkpoint["flushed"] is True and "flushed" not in jobs[1].checkpoint


async def test_summary_meta_marks_the_summary_row(app_factory, emulator):
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        await converse_until_rollover(app, adapter, filler(20))
        old, new = await chain(app)
        (summary,) = [r for r in await app.store.load_messages(new.id) if r.meta.get(SUMMARY_KEY)]
        assert summary.meta["source_session"] == old.id and summary.meta["summarised_messages"] > 0
        outcome = app.housekeeping.compressions[-1]
        assert outcome.new_session_id == new.id and outcome.tokens_after < outcome.tokens_before
