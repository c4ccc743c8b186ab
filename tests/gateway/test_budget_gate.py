"""One gate for every model request (issue 26 item 4): cron runs, background work and a
turn's own tool requests meet the same caps as turns — on SQLite and PostgreSQL, with
a hand-moved clock.

Before the gate moved into the LLM client, a cron job for a capped person's chat made
a model request right after the "daily budget reached" notice, and background work
billed to a capped person ran regardless."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta

from mnemo.app import open_app
from mnemo.cli.main import main
from mnemo.gateway.budgets.ledger import Override
from mnemo.gateway.cron.service import Caller
from mnemo.gateway.cron.store import JobTarget, RunState
from mnemo.gateway.emulator import Reply
from mnemo.gateway.events import ChatType
from tests.conftest import BackendUnderTest
from tests.gateway.conftest import make_settings
from tests.gateway.test_budgets import NO_LIMIT, Clock, say_and_settle
from tests.gateway.test_housekeeping import World
from tests.support.loopback import LoopbackAdapter

OPERATOR = Caller.operator()
PARIS = {"gateway.timezone": "Europe/Paris"}


def app_with_clock(home, emulator, adapter, clock: Clock, *, scheduler: bool = True, **overrides):
    return open_app(
        make_settings(home, **{**NO_LIMIT, **overrides}),
        adapters=[adapter],
        llm_base_url=emulator.base_url,
        api_key="test-key",
        trial=False,
        scheduler=scheduler,
        clock=clock,
    )


async def run_now(app, job_id: str) -> RunState:
    """One run of the job, as `mnemo cron run-now` takes it."""
    run_id = await app.cron.request_run(OPERATOR, job_id)
    claimed = await app.cron.store.claim_run(run_id, RunState.REQUESTED, None, datetime.now(UTC), os.getpid())
    assert claimed is not None
    state = await app.cron_runner.run(claimed)
    await app.gateway.delivery.deliver_due()
    return state


async def test_a_capped_persons_cron_job_is_skipped_with_one_note_and_counted(
    home, emulator, backend: BackendUnderTest, capsys
) -> None:
    emulator.default = lambda req: Reply(text="Your morning summary.")
    adapter = LoopbackAdapter()
    clock = Clock(datetime(2026, 12, 1, 20, 0, tzinfo=UTC))  # 21:00 in Paris
    caps = {**PARIS, "budgets.per_user.daily_usd": 1e-9}
    async with app_with_clock(home, emulator, adapter, clock, scheduler=False, **caps) as app:
        job = await app.cron.create(
            OPERATOR, kind="cron", when="0 8 * * *", prompt="Summarise my day", target=JobTarget("loop", "u1")
        )
        await say_and_settle(app, adapter, "first question")  # spends: u1 is at the cap now
        await say_and_settle(app, adapter, "second question")
        assert len(emulator.requests) == 1 and "daily budget" in adapter.texts()[-1]

        assert await run_now(app, job.id) is RunState.SKIPPED
        assert await run_now(app, job.id) is RunState.SKIPPED
        assert len(emulator.requests) == 1, "no model request for a capped person's cron run"
        notes = [t for t in adapter.texts() if t.startswith("Skipped scheduled job")]
        assert len(notes) == 1, "one note per job and reset, not one per run"
        assert (
            f"Skipped scheduled job {job.id} (cron '0 8 * * *' (Europe/Paris)): "
            "your daily budget ($0.000000001) is used up." in notes[0]
        )
        assert "after the reset: 2026-12-02 00:00 CET (in 3 h)" in notes[0]
        assert await app.cron.store.count_runs(RunState.SKIPPED) == {job.id: 2}

        # Midnight in Paris: the cap lifts and the job runs again.
        clock.now += timedelta(hours=3, minutes=1)
        assert await run_now(app, job.id) is RunState.DELIVERED
        assert len(emulator.requests) == 2 and adapter.texts()[-1].endswith("Your morning summary.")

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--home", str(home), "cron", "list", "--json"]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["id"] == job.id and listed["skipped_runs"] == 2
    assert await asyncio.to_thread(main, ["--home", str(home), "cron", "list"]) == 0
    assert "skipped: 2 (budget)" in capsys.readouterr().out


async def test_background_work_for_a_capped_person_waits_for_the_reset(
    home, emulator, backend: BackendUnderTest
) -> None:
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    clock = Clock(datetime(2026, 12, 1, 22, 59, 59, 500_000, tzinfo=UTC))  # 23:59:59.5 in Paris
    async with app_with_clock(home, emulator, adapter, clock, **PARIS, **{"memory.nudge_interval": 2}) as app:
        await say_and_settle(app, adapter, "hello there")
        # A cap the second turn may start under (it is checked before), and crosses.
        first = (await app.budgets.ledger.spend("loop:u1")).day_usd
        await app.budgets.ledger.set_override("loop:u1", Override(daily_usd=1.01 * first))
        await say_and_settle(app, adapter, "I write haiku at night")
        asked = len(emulator.requests)
        review = await _job(
            app, "review", lambda j: j.error is not None and "waiting for the budget" in j.error
        )
        assert review.state == "queued" and review.attempts == 0, "waiting, its attempt given back"
        assert "daily budget" in review.error
        assert len(emulator.requests) == asked and world.seen["memory"] == [], "no review request"
        clock.now += timedelta(seconds=2)  # midnight in Paris
        done = await _job(app, "review", lambda j: j.state == "done")
        assert done.id == review.id and len(world.seen["memory"]) == 1, "the review ran after the reset"
        assert len(emulator.requests) == asked + 1


async def _job(app, kind: str, ready, timeout: float = 20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        jobs = await app.jobs.jobs(kind=kind)
        if jobs and ready(jobs[-1]):
            return jobs[-1]
        if loop.time() > deadline:
            raise AssertionError(f"{kind} job never got there: {jobs}")
        await asyncio.sleep(0.05)


async def test_the_global_cap_stops_an_operators_group_job_but_no_per_person_cap_does(
    home, emulator, backend: BackendUnderTest
) -> None:
    emulator.default = lambda req: Reply(text="Team digest.")
    adapter = LoopbackAdapter()
    clock = Clock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    async with app_with_clock(
        home, emulator, adapter, clock, scheduler=False, **PARIS, **{"budgets.per_user.daily_usd": 1e-9}
    ) as app:
        job = await app.cron.create(
            OPERATOR,
            kind="cron",
            when="0 9 * * 1-5",
            prompt="Post the team digest",
            target=JobTarget("loop", "team", ChatType.GROUP),
        )
        assert await run_now(app, job.id) is RunState.DELIVERED
        assert await run_now(app, job.id) is RunState.DELIVERED, (
            "the operator speaks for nobody: no personal cap"
        )
    async with app_with_clock(
        home, emulator, adapter, clock, scheduler=False, **PARIS, **{"budgets.global.daily_usd": 1e-9}
    ) as app:
        assert await run_now(app, job.id) is RunState.SKIPPED
        assert len(emulator.requests) == 2
        assert "this bot's daily budget ($0.000000001) is used up" in adapter.texts()[-1]
