"""BudgetRepository: spend counted in the session store's usage write, exact under
concurrency; days and months in the configured timezone; overrides; one notice per
reset; erase. Run on both backends (``SqliteBudgets``, ``PgBudgets``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.gateway.budgets.ledger import BudgetRepository, Override, SqliteBudgets
from mnemo.gateway.storage import state_database
from mnemo.memory.sessions import SessionStore
from mnemo.memory.usage import Usage
from tests.contract.conftest import BACKENDS


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Ledger:
    budgets: BudgetRepository
    sessions: SessionStore
    clock: Clock


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    clock = Clock(datetime(2026, 1, 31, 22, 30, tzinfo=UTC))  # 23:30 in Paris, last day of January
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        budgets = SqliteBudgets(db, timezone="Europe/Paris", clock=clock)
        sessions = SessionStore(db)
        sessions.record_usage_in(budgets.record_within)
        yield Ledger(budgets, sessions, clock)
        await db.close()
        return
    from mnemo.gateway.storage_pg.budgets import PgBudgets
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.sessions import PgSessionStore

    cluster = request.getfixturevalue("pg_cluster")
    pg = PgDatabase(cluster.fresh_database(), migrations=PG_MIGRATIONS, max_size=8)
    await pg.open()
    pg_budgets = PgBudgets(pg, timezone="Europe/Paris", clock=clock)
    pg_sessions = PgSessionStore(pg)
    pg_sessions.record_usage_in(pg_budgets.record_within)
    yield Ledger(pg_budgets, pg_sessions, clock)
    await pg.close()


async def new_session(sessions: SessionStore, user: str) -> str:
    row = await sessions.create_session(
        chat_key=f"t:dm:{user}",
        platform="t",
        chat_id=user,
        thread_id=None,
        user_id=user,
        agent_context="primary",
        source="test",
        model="m",
        system_prompt="s",
    )
    return row.id


async def test_concurrent_usage_writes_are_counted_exactly_once(ledger: Ledger) -> None:
    sid = await new_session(ledger.sessions, "1")
    usage = Usage(
        input_tokens=10, output_tokens=5, cache_read_tokens=100, cache_write_tokens=1, cost_usd=0.25
    )
    await asyncio.gather(*(ledger.sessions.add_usage(sid, usage, payer="t:1") for _ in range(200)))
    spend = await ledger.budgets.spend("t:1")
    assert (spend.requests_today, spend.day_tokens, spend.day_usd) == (200, 200 * 116, 50.0)
    assert (await ledger.budgets.spend("*")).requests_today == 200
    session = await ledger.sessions.get_session(sid)
    assert session is not None


async def test_unbilled_usage_counts_only_for_the_whole_bot(ledger: Ledger) -> None:
    sid = await new_session(ledger.sessions, "room")
    await ledger.sessions.add_usage(sid, Usage(cost_usd=1.0), payer=None)
    assert (await ledger.budgets.spend("*")).day_usd == 1.0
    assert await ledger.budgets.everyone() == []


async def test_days_and_months_follow_the_configured_timezone(ledger: Ledger) -> None:
    sid = await new_session(ledger.sessions, "1")
    await ledger.sessions.add_usage(sid, Usage(cost_usd=1.0), payer="t:1")  # 31 Jan in Paris
    ledger.clock.now += timedelta(hours=1)  # 00:30 on 1 Feb in Paris, still 31 Jan in UTC
    s = await ledger.budgets.spend("t:1")
    assert (s.day_usd, s.month_usd) == (0.0, 0.0), "a new day and a new month"
    await ledger.sessions.add_usage(sid, Usage(cost_usd=2.0), payer="t:1")
    ledger.clock.now += timedelta(days=1)
    s = await ledger.budgets.spend("t:1")
    assert (s.day_usd, s.month_usd) == (0.0, 2.0)


async def test_everyone_is_sorted_by_spend(ledger: Ledger) -> None:
    for user, cost in (("a", 1.0), ("b", 3.0), ("c", 2.0)):
        sid = await new_session(ledger.sessions, user)
        await ledger.sessions.add_usage(sid, Usage(cost_usd=cost), payer=f"t:{user}")
    assert [p.payer for p in await ledger.budgets.everyone()] == ["t:b", "t:c", "t:a"]


async def test_overrides_set_replace_and_clear(ledger: Ledger) -> None:
    b = ledger.budgets
    assert await b.override("t:1") is None
    await b.set_override("t:1", Override(daily_usd=2.0))
    await b.set_override("t:1", Override(daily_usd=3.0, daily_tokens=10))
    assert await b.override("t:1") == Override(daily_usd=3.0, daily_tokens=10)
    await b.set_override("t:1", None)
    assert await b.override("t:1") is None


async def test_a_notice_is_claimed_once_per_reset_and_erase_forgets_the_person(ledger: Ledger) -> None:
    b = ledger.budgets
    reset = datetime(2026, 2, 1, tzinfo=UTC)
    assert await b.claim_notice("t:1|daily_usd", reset)
    assert not await b.claim_notice("t:1|daily_usd", reset)
    assert await b.claim_notice("t:1|daily_usd", reset + timedelta(days=1))
    sid = await new_session(ledger.sessions, "1")
    await ledger.sessions.add_usage(sid, Usage(cost_usd=1.0), payer="t:1")
    await b.set_override("t:1", Override(daily_usd=1.0))
    assert await b.erase("t:1") >= 2
    assert (await b.spend("t:1")).requests_today == 0 and await b.override("t:1") is None
    assert await b.claim_notice("t:1|daily_usd", reset), "its notices are gone too"
    assert (await b.spend("*")).day_usd == 1.0, "the bot's total keeps what was spent"


# --- upkeep's own account (gateway/budgets/upkeep.py) ----------------------------------


async def test_upkeep_rows_count_per_kind_and_day_and_erase_with_the_person(ledger: Ledger) -> None:
    b = ledger.budgets
    u = Usage(input_tokens=10, cache_read_tokens=900, cache_write_tokens=90, cost_usd=0.01)
    await b.record_upkeep("s1", "review", "t:1", u)
    await b.record_upkeep("s1", "flush", "t:1", u)
    await b.record_upkeep("s1", "flush", "t:1", u)
    await b.record_upkeep("s2", "summary", None, u)  # a shared room's: nobody's
    mine = await b.upkeep_spend("t:1")
    assert [(k.kind, k.requests) for k in mine.kinds] == [("flush", 2), ("review", 1)]
    assert mine.day_tokens == 3 * 1000 and mine.requests_today == 3
    assert mine.kinds[0].cache_read_share == 0.9
    assert mine.day_usd == pytest.approx(0.03) and mine.month_usd == pytest.approx(0.03)
    everyone = await b.upkeep_spend(None)
    assert everyone.requests_today == 4 and everyone.day_tokens == 4000
    assert await b.upkeep_requests_since("s1", 0) == [ledger.clock.now.timestamp()] * 3
    assert await b.upkeep_requests_since("s1", ledger.clock.now.timestamp()) == [], "after, not at"

    ledger.clock.now += timedelta(hours=1)  # 00:30 in Paris: a new day and month
    today = await b.upkeep_spend("t:1")
    assert today.kinds == () and today.day_tokens == 0 and today.month_usd == 0
    assert await b.upkeep_requests_since("s1", ledger.clock.now.timestamp() - 1800) == []

    assert await b.erase("t:1") >= 3
    assert (await b.upkeep_spend(None)).month_usd == 0
    ledger.clock.now -= timedelta(hours=1)
    assert (await b.upkeep_spend(None)).requests_today == 1, "nobody's row stays"


async def test_the_upkeep_caps_and_the_hourly_limit_on_a_controlled_clock(ledger: Ledger) -> None:
    from mnemo.gateway.budgets.charge import Charge, RequestKind
    from mnemo.gateway.budgets.upkeep import Upkeep
    from mnemo.gateway.config import UpkeepSettings
    from mnemo.gateway.errors import OverBudget
    from mnemo.memory.scope import UserRef

    b = ledger.budgets
    settings = UpkeepSettings(
        daily_tokens_per_person=1500, global_daily_tokens=2500, session_passes_per_hour=2
    )
    upkeep = Upkeep(settings, b)
    ada, bob = UserRef("t", "1"), UserRef("t", "2")
    review = Charge(RequestKind.REVIEW, ada, admin=True)  # admins are not exempt
    u = Usage(input_tokens=1000)
    assert await upkeep.check(review) is None
    await upkeep.record("s1", RequestKind.REVIEW, ada, u)
    assert await upkeep.check(review) is None
    await upkeep.record("s1", RequestKind.FLUSH, ada, u)
    stop = await upkeep.check(review)
    assert isinstance(stop, OverBudget) and stop.cap == "upkeep_daily_tokens"
    assert stop.retry_after_s == 30 * 60, "until midnight in Paris"
    assert await upkeep.check(Charge(RequestKind.TURN, ada)) is None, "conversation is not upkeep"
    assert await upkeep.check(Charge(RequestKind.SUMMARY, bob)) is None
    await upkeep.record("s2", RequestKind.SUMMARY, bob, u)
    stop = await upkeep.check(Charge(RequestKind.SUMMARY, bob))
    assert isinstance(stop, OverBudget) and stop.cap == "upkeep_global_daily_tokens"

    # Two background requests of s1 in the last hour: the third waits for the first to age.
    with pytest.raises(OverBudget) as held:
        await upkeep.before_request("s1", RequestKind.REVIEW)
    assert held.value.retry_after_s == 3600
    await upkeep.before_request("s2", RequestKind.REVIEW)  # another session
    ledger.clock.now += timedelta(minutes=40)
    with pytest.raises(OverBudget) as held:
        await upkeep.before_request("s1", RequestKind.REVIEW)
    assert held.value.retry_after_s == 20 * 60
    ledger.clock.now += timedelta(minutes=20)  # 00:30 in Paris: a new day, the hour passed
    await upkeep.before_request("s1", RequestKind.REVIEW)
    assert await upkeep.check(review) is None and await upkeep.check(Charge(RequestKind.SUMMARY, bob)) is None
