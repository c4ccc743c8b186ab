"""Budgets end to end: loopback adapter → gateway → budget gate → emulator, with the
spend counted in state.db beside the sessions' usage and a hand-moved clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.app import open_app
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.events import ChatType
from tests.gateway.conftest import make_settings
from tests.gateway.test_housekeeping import World, settle
from tests.support.loopback import LoopbackAdapter

NO_LIMIT = {"access.rate_limit_per_minute": 0}


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


def app_with_clock(home: Path, emulator: Emulator, adapter: LoopbackAdapter, clock: Clock, **overrides):
    settings = make_settings(home, **{**NO_LIMIT, **overrides})
    return open_app(
        settings,
        adapters=[adapter],
        llm_base_url=emulator.base_url,
        api_key="test-key",
        trial=False,
        clock=clock,
    )


async def say_and_settle(app, adapter: LoopbackAdapter, text: str, **kw) -> None:
    await adapter.say(text, **kw)
    await app.gateway.lanes.drain(30)
    await app.gateway.delivery.deliver_due()


async def session_costs(app) -> float:
    def q(conn):
        return conn.execute("SELECT COALESCE(SUM(estimated_cost_usd), 0) FROM sessions").fetchone()[0]

    return await app.db.read(q)


async def turn_costs(app, user: str = "u1") -> list[float]:
    def q(conn):
        rows = conn.execute(
            "SELECT estimated_cost_usd FROM sessions WHERE estimated_cost_usd > 0 AND user_id = ?", (user,)
        )
        return [r[0] for r in rows]

    return await app.db.read(q)


async def test_at_the_cap_no_request_is_sent_and_the_user_is_told_once_when_it_resets(home, emulator) -> None:
    emulator.default = lambda req: Reply(text="sure")
    adapter = LoopbackAdapter()
    clock = Clock(datetime(2026, 12, 1, 22, 59, tzinfo=UTC))  # 23:59 in Paris
    overrides = {"budgets.per_user.daily_usd": 1e-9, "gateway.timezone": "Europe/Paris"}
    async with app_with_clock(home, emulator, adapter, clock, **overrides) as app:
        await say_and_settle(app, adapter, "first question")
        assert len(emulator.requests) == 1
        spend = await app.budgets.ledger.spend("loop:u1")
        assert spend.day_usd > 1e-9 and spend.day_usd == pytest.approx(await session_costs(app), rel=1e-9)
        await say_and_settle(app, adapter, "second question")
        await say_and_settle(app, adapter, "third question")
        assert len(emulator.requests) == 1, "no request once the cap is reached"
        texts = adapter.texts()
        assert texts[0] == "sure"
        assert len(texts) == 2, "one notice, not one per message"
        assert "daily budget ($0.000000001)" in texts[1] and "2026-12-02 00:00 CET (in 1 min)" in texts[1], (
            texts[1]
        )
        assert not await app.inbox.unfinished()
        # An admin is exempt from the per-user caps.
        await say_and_settle(app, adapter, "admin question", user="admin")
        assert len(emulator.requests) == 2
    # The counters survive a restart; midnight in Paris lifts the cap.
    async with app_with_clock(home, emulator, adapter, clock, **overrides) as app:
        await say_and_settle(app, adapter, "still capped")
        assert len(emulator.requests) == 2
        clock.now += timedelta(minutes=2)
        await say_and_settle(app, adapter, "a new day")
        assert len(emulator.requests) == 3
        spend = await app.budgets.ledger.spend("loop:u1")
        assert spend.requests_today == 1 and spend.month_usd > spend.day_usd


async def test_a_running_turn_finishes_even_when_it_crosses_the_cap(app_factory, emulator) -> None:
    emulator.script(
        Reply(
            text="noting",
            tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "Likes tea."})],
        ),
        Reply(text="Noted."),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "budgets.per_user.daily_usd": 1e-9}) as app:
        await say_and_settle(app, adapter, "remember I like tea")
        assert len(emulator.requests) == 2 and adapter.texts() == ["Noted."]
        assert (await app.budgets.ledger.spend("loop:u1")).requests_today == 2


async def test_background_work_for_the_users_session_is_counted(app_factory, emulator) -> None:
    emulator.default = World()
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "memory.nudge_interval": 2}) as app:
        await say_and_settle(app, adapter, "hello there")
        await say_and_settle(app, adapter, "I write haiku at night")
        await settle(app)
        (job,) = await app.jobs.jobs(kind="review")
        assert job.state == "done"
        spend = await app.budgets.ledger.spend("loop:u1")
        assert spend.requests_today == len(emulator.requests) == 3, "two turns and the review"
        assert spend.day_usd == pytest.approx(await session_costs(app), rel=1e-9)
        assert (await app.budgets.ledger.spend("*")).day_usd == pytest.approx(spend.day_usd, rel=1e-9)


async def test_ten_chats_at_once_stay_within_one_turn_of_the_cap(app_factory, emulator) -> None:
    emulator.default = lambda req: Reply(text="an answer of a few words")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await say_and_settle(app, adapter, "warm up", user="probe")
        one_turn = (await app.budgets.ledger.spend("loop:probe")).day_usd
    emulator.reset()
    emulator.default = lambda req: Reply(text="an answer of a few words")
    cap = 1.2 * one_turn
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "budgets.per_user.daily_usd": cap}) as app:
        await asyncio.gather(
            *(adapter.say(f"question {i}", chat=f"room{i}", chat_type=ChatType.GROUP) for i in range(10))
        )
        await app.gateway.lanes.drain(60)
        await app.gateway.delivery.deliver_due()
        spent = (await app.budgets.ledger.spend("loop:u1")).day_usd
        turns = await turn_costs(app)
        # Every turn started below the cap, so only the last one may cross it.
        assert spent - max(turns) < cap <= spent, (spent, cap, turns)
        assert spent == pytest.approx(sum(turns), rel=1e-9), "no count lost or doubled"
        assert 2 <= len(turns) == len(emulator.requests) < 10, "the cap was crossed and held"
        notices = [t for t in adapter.texts() if "budget" in t]
        assert len(notices) == 1 and len(adapter.texts()) == len(turns) + 1


async def test_usage_command_shows_spend_against_the_caps(app_factory, emulator) -> None:
    emulator.default = lambda req: Reply(text="hi")
    adapter = LoopbackAdapter()
    caps = {
        "budgets.per_user.daily_usd": 2,
        "budgets.per_user.monthly_usd": 20,
        "budgets.per_user.daily_tokens": 100000,
    }
    async with app_factory(adapter, **{**NO_LIMIT, **caps}) as app:
        await say_and_settle(app, adapter, "hello")
        await say_and_settle(app, adapter, "/usage")
        await say_and_settle(app, adapter, "/usage", user="admin")
        report, admin = adapter.texts()[1:]
        spend = await app.budgets.ledger.spend("loop:u1")
        assert f"Today: ${spend.day_usd:.4f} of $2.00 · {spend.day_tokens:,} tokens of 100,000" in report
        assert f"This month: ${spend.month_usd:.4f} of $20.00" in report
        assert "No personal cap (admin)." in admin
        assert len(emulator.requests) == 1


async def test_the_search_digest_a_turn_asks_for_is_counted_against_its_person(app_factory, emulator) -> None:
    emulator.script(
        Reply(text="Lisbon sounds lovely."),
        Reply(tool_uses=[ToolUse("session_search", {"query": "Lisbon"})]),
        Reply(text="- The user plans to visit Lisbon in May."),  # the digest
        Reply(text="You told me about Lisbon."),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "search.digest": True}) as app:
        await say_and_settle(app, adapter, "I plan to visit Lisbon in May")
        await say_and_settle(app, adapter, "/reset")
        await say_and_settle(app, adapter, "what did I say about my trip?")
        assert adapter.texts()[-1] == "You told me about Lisbon."
        spend = await app.budgets.ledger.spend("loop:u1")
        assert spend.requests_today == len(emulator.requests) == 4
        assert spend.day_usd == pytest.approx(await session_costs(app), rel=1e-9)


async def test_the_global_cap_stops_everyone_including_admins(app_factory, emulator) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{**NO_LIMIT, "budgets.global.daily_usd": 1e-9}) as app:
        await say_and_settle(app, adapter, "first", user="ann")
        await say_and_settle(app, adapter, "second", user="bea")
        await say_and_settle(app, adapter, "third", user="admin")
        assert len(emulator.requests) == 1
        ann, bea, admin = adapter.texts()
        assert ann == "ok" and "this bot's daily budget" in bea and "this bot's daily budget" in admin
