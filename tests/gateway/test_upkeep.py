"""Upkeep end to end (loopback adapter → gateway → jobs → real SDK → emulator):
background passes are sent after the conversation's own cached prefix, byte for byte;
``memory.upkeep``'s daily cap holds background work until the next local day (a
hand-moved clock); the repeat guard stops a job kind that runs again with nothing new
said; ``/usage`` shows upkeep apart from the conversation."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from mnemo.gateway.emulator import RecordedRequest
from mnemo.memory.flush import BACKGROUND_TAG
from mnemo.memory.tokens import estimate_json_tokens
from tests.conftest import BackendUnderTest
from tests.gateway.test_budgets import Clock, app_with_clock, say_and_settle
from tests.gateway.test_housekeeping import World, converse, filler, last_text, settle
from tests.support.loopback import LoopbackAdapter

NO_LIMIT = {"access.rate_limit_per_minute": 0}


def canonical(blocks: Any) -> Any:
    """The prompt as the cache keys it: ``cache_control`` markers left out, a string
    content as its one text block (the API treats both forms alike)."""
    if isinstance(blocks, list):
        return [canonical(b) for b in blocks]
    if isinstance(blocks, dict):
        out = {k: canonical(v) for k, v in blocks.items() if k != "cache_control"}
        if isinstance(out.get("content"), str):
            out["content"] = [{"type": "text", "text": out["content"]}]
        return out
    return blocks


def as_bytes(value: Any) -> bytes:
    return json.dumps(canonical(value), ensure_ascii=False, sort_keys=True).encode()


def breakpoints(request: RecordedRequest) -> list[int]:
    """Indexes of the messages that carry a cache breakpoint."""
    out = []
    for i, m in enumerate(request.messages):
        content = m["content"]
        if isinstance(content, list) and any("cache_control" in b for b in content):
            out.append(i)
    return out


def background(world: World) -> list[RecordedRequest]:
    return world.seen["memory"] + world.seen["summary"]


async def test_a_review_sends_the_conversations_cached_prefix_byte_for_byte(
    app_factory, emulator, backend: BackendUnderTest
) -> None:
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "memory.nudge_interval": 4}) as app:
        await converse(adapter, filler(4))
        await settle(app)
        (review,) = world.seen["memory"]
        chat = world.seen["chat"][-1]  # the conversation's last request before the review
        assert emulator.requests.index(chat) < emulator.requests.index(review)

        # Tools, system prompt and every message the conversation sent: the same bytes.
        assert as_bytes(review.body["tools"]) == as_bytes(chat.body["tools"])
        assert as_bytes(review.body["system"]) == as_bytes(chat.body["system"])
        n = len(chat.messages)
        assert as_bytes(review.messages[:n]) == as_bytes(chat.messages)
        assert review.model == chat.model, "a prompt cache belongs to one model"
        # The instruction comes after the prefix, never inside it.
        assert BACKGROUND_TAG in last_text(review) and BACKGROUND_TAG not in json.dumps(review.messages[:n])
        # The conversation's breakpoints all lie in the shared part; the review reads it.
        assert breakpoints(chat) and max(breakpoints(chat)) < n
        prefix_tokens = estimate_json_tokens(chat.body["tools"]) + estimate_json_tokens(chat.body["system"])
        assert review.usage["cache_read_input_tokens"] >= prefix_tokens
        read = review.usage["cache_read_input_tokens"]
        total = read + review.usage["input_tokens"] + review.usage["cache_creation_input_tokens"]
        assert read / total >= 0.7, review.usage
        assert review.response_status == 200


async def test_the_compression_flush_and_summary_read_the_cached_prefix(app_factory, emulator) -> None:
    from tests.gateway.test_housekeeping import SMALL, converse_until_rollover

    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**SMALL, **NO_LIMIT}) as app:
        await converse_until_rollover(app, adapter, filler(20))
        flush, summary = world.seen["memory"][0], world.seen["summary"][0]
        chat = [r for r in world.seen["chat"] if emulator.requests.index(r) < emulator.requests.index(flush)][
            -1
        ]
        n = len(chat.messages)
        for request in (flush, summary):
            assert as_bytes(request.messages[:n]) == as_bytes(chat.messages)
            assert as_bytes(request.body["tools"]) == as_bytes(chat.body["tools"])
            usage = request.usage
            prompt = (
                usage["input_tokens"]
                + usage["cache_read_input_tokens"]
                + usage["cache_creation_input_tokens"]
            )
            assert usage["cache_read_input_tokens"] / prompt >= 0.7, usage
        # The compression reports what it saves against what it spent.
        outcome = app.housekeeping.compressions[-1]
        assert outcome.tokens_saved > 0 and outcome.spent.cache_read_tokens > 0
        assert outcome.spent.cost_usd > 0
        # Upkeep's own account has them, by kind.
        spent = await app.budgets.upkeep.spend(None)
        assert {k.kind for k in spent.kinds} >= {"flush", "summary"}
        assert all(k.cache_read_share >= 0.7 for k in spent.kinds)


async def test_at_the_upkeep_cap_background_work_waits_for_the_next_day(home, emulator) -> None:
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    clock = Clock(datetime(2026, 12, 1, 22, 30, tzinfo=UTC))  # 23:30 in Paris
    overrides = {
        "memory.nudge_interval": 2,
        "memory.upkeep.daily_tokens_per_person": 1,  # one background request uses it up
        "gateway.timezone": "Europe/Paris",
    }
    async with app_with_clock(home, emulator, adapter, clock, **overrides) as app:
        await converse(adapter, ["hello there", "I write haiku at night"])
        await settle(app)
        assert len(world.seen["memory"]) == 1, "the first review is under the cap"
        spent = await app.budgets.upkeep.spend(None)
        assert spent.day_tokens > 1 and [k.kind for k in spent.kinds] == ["review"]

        await converse(adapter, ["and tomorrow", "I also paint"], already=2)
        await settle(app)
        assert len(world.seen["memory"]) == 1, "at the cap: no background request"
        assert len(adapter.texts()) == 4, "the conversation itself goes on"
        (first, waiting) = await app.jobs.jobs(kind="review")
        assert first.state == "done" and waiting.state == "queued" and waiting.attempts == 0
        assert 1_700 <= waiting.not_before - waiting.updated_at <= 1_801, "queued for Paris midnight"

        # Still the same day: due again, it waits again without a request.
        await app.db.write(lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE id = ?", (waiting.id,)))
        app.jobs.wake()
        await settle(app)
        assert len(world.seen["memory"]) == 1

        clock.now += timedelta(minutes=31)  # 00:01 in Paris: a new day
        await app.db.write(lambda c: c.execute("UPDATE jobs SET not_before = 0 WHERE id = ?", (waiting.id,)))
        app.jobs.wake()
        await settle(app)
        assert len(world.seen["memory"]) == 2, "the review ran after the reset"
        assert (await app.jobs.get(waiting.id)).state == "done"


async def test_the_repeat_guard_stops_a_job_that_runs_again_with_nothing_new_said(
    app_factory, emulator, backend: BackendUnderTest
) -> None:
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "memory.nudge_interval": 0}) as app:
        n = await converse(adapter, ["hello there", "I write haiku at night"])
        session = (await app.store.list_sessions("loop:dm:u1"))[0]
        for _ in range(6):  # a job that keeps enqueueing itself
            await app.jobs.enqueue("review", session.id)
            await settle(app)
        limit = app.settings.memory.upkeep.max_runs_without_message
        assert len(world.seen["memory"]) == limit == 3
        assert all(j.state == "done" for j in await app.jobs.jobs(kind="review"))

        await converse(adapter, ["something new"], already=n)  # a new user message: allowed again
        await app.jobs.enqueue("review", session.id)
        await settle(app)
        assert len(world.seen["memory"]) == limit + 1


async def test_usage_shows_upkeep_apart_from_the_conversation(
    app_factory, emulator, backend: BackendUnderTest
) -> None:
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "memory.nudge_interval": 2}) as app:
        await converse(adapter, ["hello there", "I write haiku at night"])
        await settle(app)
        await say_and_settle(app, adapter, "/usage")
        report = adapter.texts()[-1]
        upkeep = await app.budgets.upkeep.spend(None)
        spend = await app.budgets.ledger.spend("loop:u1")
        assert f"Upkeep today (background memory work): ${upkeep.day_usd:.4f}" in report
        assert f"Conversation today: ${spend.day_usd - upkeep.day_usd:.4f}" in report
        assert "review 1×" in report and "from cache" in report


async def test_a_compression_whose_turns_were_all_reviewed_sends_no_flush(app_factory, emulator) -> None:
    from tests.gateway.test_housekeeping import SMALL, converse_until_rollover

    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**SMALL, **NO_LIMIT, "memory.nudge_interval": 2}) as app:
        await converse_until_rollover(app, adapter, filler(20))
        (job,) = await app.jobs.jobs(kind="compress")
        assert job.checkpoint["flush_skipped"] is True and job.checkpoint["flushed"] is True
        passes = [last_text(r) for r in world.seen["memory"]]
        assert passes and all("Review the recent turns" in t for t in passes), "reviews only, no flush"
        assert len(world.seen["summary"]) == 1


async def test_without_reviews_the_compression_flushes_first(app_factory, emulator) -> None:
    from tests.gateway.test_housekeeping import SMALL, converse_until_rollover

    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**SMALL, **NO_LIMIT}) as app:  # nudge_interval 0: no reviews
        await converse_until_rollover(app, adapter, filler(20))
        (job,) = await app.jobs.jobs(kind="compress")
        assert "flush_skipped" not in job.checkpoint and job.checkpoint["covered"][0] > 0
        (flush,) = world.seen["memory"]
        assert "being compressed" in last_text(flush)
