"""Cron end to end: the real AsyncIOScheduler in open_app, the loopback adapter, the
real anthropic SDK against the emulator.

Time is controlled, never slept through: jobs are due within a second (``in 1s``), or
their stored next run is moved to where a test needs it while the app is stopped — the
same thing a bot that was down for a while finds at start-up.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from structlog.testing import capture_logs

from mnemo.gateway.cron.service import Caller
from mnemo.gateway.cron.store import CronJob, JobSource, JobState, JobTarget, RunState
from mnemo.gateway.emulator import Reply, ToolUse
from mnemo.gateway.emulator.script import RecordedRequest
from mnemo.gateway.events import ChatType
from mnemo.gateway.turns.prompt import CRON_HINT
from mnemo.memory.scope import UserRef
from tests.support.loopback import LoopbackAdapter

T = TypeVar("T")
BERLIN = ZoneInfo("Europe/Berlin")


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 20.0) -> T:
    """Poll until ``check()`` is truthy; the timeout only stops a broken test from hanging."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)


def system_text(rec: RecordedRequest) -> str:
    return "".join(block["text"] for block in rec.body["system"])


def tool_names(rec: RecordedRequest) -> list[str]:
    return [t["name"] for t in rec.body.get("tools", [])]


def is_cron(rec: RecordedRequest) -> bool:
    return CRON_HINT in system_text(rec)


def tool_results(rec: RecordedRequest) -> list[str]:
    out = []
    for message in rec.body["messages"]:
        if message["role"] == "user" and isinstance(message["content"], list):
            out += [b["content"] for b in message["content"] if b.get("type") == "tool_result"]
    return out


def in_chat(user: str = "u1") -> Caller:
    return Caller(JobSource.COMMAND, JobTarget("loop", user, ChatType.DM), user)


def move_next_run(home: Path, job_id: str, next_run: datetime, start: datetime | None = None) -> None:
    """Edit a stopped profile's job as if its time had come and gone while the bot was down."""
    with sqlite3.connect(home / "state.db") as db:
        db.execute(
            "UPDATE cron_jobs SET next_run_at = ?, start_at = COALESCE(?, start_at) WHERE id = ?",
            (next_run.timestamp(), start.timestamp() if start else None, job_id),
        )


async def runs_of(app: Any, job_id: str) -> list[Any]:
    return await app.cron.store.runs(job_id)


async def test_a_job_fires_at_its_time_in_a_cron_context_and_reaches_its_chat_labelled_scheduled(
    app_factory, emulator
):
    async def responder(rec: RecordedRequest) -> Reply:
        if is_cron(rec):
            return Reply(text="Time to stretch!")
        if len(tool_results(rec)) == 0:
            return Reply(
                tool_uses=[
                    ToolUse(
                        "cronjob", {"action": "create", "in": "1s", "prompt": "Tell the user to stretch."}
                    )
                ]
            )
        return Reply(text="I'll remind you in a second.")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("remind me to stretch in a second", user="u1")
        sent = await adapter.wait_sent(2)
        assert [(m.text, m.scheduled, m.chat.chat_id) for m in sent] == [
            ("I'll remind you in a second.", False, "u1"),
            ("Time to stretch!", True, "u1"),
        ]
        [job] = await app.cron.store.all()
        assert job.target == JobTarget("loop", "u1", ChatType.DM) and job.user_id == "u1"
        assert job.state is JobState.DONE, "a one-off job is done after its run"
        [run] = await runs_of(app, job.id)
        assert (
            run.state is RunState.DELIVERED and run.scheduled_for is not None and run.started_at is not None
        )
        assert run.started_at >= run.scheduled_for, "not before its time"

        chat_request = emulator.requests[0]
        cron_request = next(r for r in emulator.requests if is_cron(r))
        assert "cronjob" in tool_names(chat_request)
        assert "cronjob" not in tool_names(cron_request), "no scheduling from inside a scheduled run"
        assert "memory" in tool_names(cron_request)
        assert CRON_HINT in system_text(cron_request) and CRON_HINT not in system_text(chat_request)
        assert "Tell the user to stretch." in str(cron_request.body["messages"][-1]["content"])

        # A fresh session of its own, not mirrored into the chat's conversation.
        cron_session = await app.store.get_session(run.session_id)
        assert (
            cron_session.source == "cron" and cron_session.agent_context == "cron" and cron_session.is_ended
        )
        chat_session = await app.store.active_session("loop:dm:u1")
        texts = [m.content for m in await app.store.load_messages(chat_session.id)]
        assert "Time to stretch!" not in texts


async def test_a_cron_job_fires_and_its_next_run_is_the_next_time_of_its_expression(
    app_factory, emulator, home
):
    emulator.default = lambda rec: Reply(text="Good morning!")
    async with app_factory(LoopbackAdapter()) as app:
        job = await app.cron.create(
            in_chat(), kind="cron", when="0 8 * * 1-5", prompt="Morning summary", timezone="Europe/Berlin"
        )
        assert job.next_run_at.astimezone(BERLIN).strftime("%H:%M %a") in {
            f"08:00 {d}" for d in ("Mon", "Tue", "Wed", "Thu", "Fri")
        }
    # Its time comes (the bot restarted just after it): it runs, and the next run is the
    # next weekday 08:00 in Berlin.
    move_next_run(home, job.id, datetime.now(UTC) - timedelta(seconds=5))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        sent = await adapter.wait_sent(1)
        assert sent[0].text == "Good morning!" and sent[0].scheduled
        stored = await eventually(lambda: app.cron.store.get(job.id))
        local = stored.next_run_at.astimezone(BERLIN)
        assert stored.next_run_at > datetime.now(UTC) and local.hour == 8 and local.weekday() < 5
        assert app.scheduler.scheduled()[job.id] == stored.next_run_at


async def test_a_cron_run_cannot_write_user_md_and_the_tool_result_says_why(app_factory, emulator, home):
    async def responder(rec: RecordedRequest) -> Reply:
        if not tool_results(rec):
            return Reply(
                tool_uses=[
                    ToolUse(
                        "memory",
                        {"action": "add", "target": "user", "content": "User has stopped drinking tea"},
                    )
                ]
            )
        return Reply(text="Tea time reminder sent.")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        app.files.user(UserRef("loop", "u1")).add("User loves green tea")
        profile = app.settings.memories_dir / "users" / "loop" / "u1" / "USER.md"
        before = profile.read_bytes()
        await adapter.say("/cron add in 1s Remind me about tea", user="u1")
        sent = await adapter.wait_sent(2)
        assert sent[0].text.startswith("Scheduled ") and sent[1].text == "Tea time reminder sent."
        assert profile.read_bytes() == before, "USER.md untouched"
        first, second = emulator.requests[0], emulator.requests[1]
        assert "User loves green tea" in system_text(first), "a DM job reads its user's profile"
        [result] = tool_results(second)
        assert '"success": false' in result and "cron run cannot write the user's profile" in result


async def test_silent_delivers_nothing(app_factory, emulator):
    emulator.default = lambda rec: Reply(text="[SILENT]")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        job = await app.cron.create(
            in_chat(), kind="in", when="1s", prompt="Anything new? Say [SILENT] if not."
        )
        [run] = await eventually(lambda: _finished_runs(app, job.id))
        assert run.state is RunState.SILENT and run.outbox_id is None
        await app.gateway.delivery.deliver_due()
        assert adapter.sent == [] and (await app.outbox.counts()) == {}


async def _finished_runs(app: Any, job_id: str) -> list[Any]:
    runs = await runs_of(app, job_id)
    return runs if runs and all(r.state not in (RunState.RUNNING, RunState.REQUESTED) for r in runs) else []


async def _scheduled_exactly(app: Any, ids: set[str]) -> bool:
    return set(app.scheduler.scheduled()) == ids


DECLARED = {"id": "weekly-review", "chat": "loop:u1", "cron": "0 18 * * 5", "prompt": "Weekly review"}


async def test_jobs_persist_across_restarts_and_are_not_duplicated(app_factory, emulator):
    overrides = {"cron.jobs": (DECLARED,)}
    async with app_factory(LoopbackAdapter(), **overrides) as app:
        created = await app.cron.create(in_chat(), kind="every", when="1d", prompt="Daily digest")
        first = {j.id: j for j in await app.cron.store.all()}
        assert set(first) == {created.id, "weekly-review"}
        await eventually(lambda: _scheduled_exactly(app, set(first)))
    for _ in range(2):
        async with app_factory(LoopbackAdapter(), **overrides) as app:
            again = {j.id: j for j in await app.cron.store.all()}
            assert again == first, "same rows, same next runs: nothing re-added or recomputed"
            assert app.scheduler.scheduled() == {i: j.next_run_at for i, j in first.items()}
    assert emulator.requests == []


async def test_a_run_missed_while_down_runs_once_at_start_when_within_the_grace(app_factory, emulator, home):
    emulator.default = lambda rec: Reply(text="Hourly check done.")
    async with app_factory(LoopbackAdapter()) as app:
        job = await app.cron.create(in_chat(), kind="every", when="1h", prompt="Hourly check")
    # Down for a bit over two hours: three runs were missed, the latest 100 s ago.
    now = datetime.now(UTC)
    start = now - timedelta(hours=2, seconds=100)
    move_next_run(home, job.id, start, start=start)
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        sent = await adapter.wait_sent(1)
        [run] = await eventually(lambda: _finished_runs(app, job.id))
        await asyncio.sleep(0.3)
        assert [m.text for m in adapter.sent] == ["Hourly check done."], "coalesced: once, not three times"
        assert sent[0].scheduled and run.state is RunState.DELIVERED
        stored = await app.cron.store.get(job.id)
        assert stored.next_run_at == start + timedelta(hours=3), "then on its grid again"
        assert len(emulator.requests) == 1


async def test_a_run_missed_by_more_than_the_grace_is_skipped_and_logged(app_factory, emulator, home):
    async with app_factory(LoopbackAdapter()) as app:
        recurring = await app.cron.create(in_chat(), kind="every", when="1h", prompt="Hourly check")
        one_off = await app.cron.create(in_chat(), kind="in", when="1h", prompt="Call the plumber")
    now = datetime.now(UTC)
    start = now - timedelta(seconds=1000)  # grace is 300 s
    move_next_run(home, recurring.id, start, start=start)
    move_next_run(home, one_off.id, start)
    adapter = LoopbackAdapter()
    with capture_logs() as logs:
        async with app_factory(adapter) as app:
            for job in (recurring, one_off):
                [run] = await eventually(lambda job=job: runs_of(app, job.id))
                assert run.state is RunState.MISSED and "misfire grace of 300 s" in run.detail
            kept = await app.cron.store.get(recurring.id)
            assert kept.state is JobState.ACTIVE and kept.next_run_at == start + timedelta(hours=1)
            done = await app.cron.store.get(one_off.id)
            assert done.state is JobState.DONE and done.last_result.startswith("missed")
    missed = [e for e in logs if e["event"] == "cron_run_missed"]
    assert {e["job"] for e in missed} == {recurring.id, one_off.id}
    assert all(e["late_s"] >= 1000 and e["grace_s"] == 300 for e in missed)
    assert adapter.sent == [] and emulator.requests == []


async def test_delivery_while_the_adapter_fails_is_retried_until_it_succeeds_exactly_once(
    app_factory, emulator
):
    emulator.default = lambda rec: Reply(text="Your reminder.")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        adapter.down = True  # sends raise PlatformUnavailable
        job = await app.cron.create(in_chat(), kind="in", when="1s", prompt="Remind me")

        async def failed_twice() -> bool:
            row = await app.db.read(
                lambda c: c.execute("SELECT attempts, state FROM outbox WHERE kind = 'cron'").fetchone()
            )
            return row is not None and row[0] >= 2 and row[1] == "queued"

        await eventually(failed_twice)
        adapter.down = False
        sent = await adapter.wait_sent(1)
        await asyncio.sleep(0.3)
        await app.gateway.delivery.deliver_due()
        assert [m.text for m in adapter.sent] == ["Your reminder."] and sent[0].scheduled
        assert await app.outbox.counts() == {"sent": 1}
        assert len(await runs_of(app, job.id)) == 1 and len(emulator.requests) == 1


async def test_a_result_waits_while_the_adapter_is_disconnected(app_factory, emulator):
    emulator.default = lambda rec: Reply(text="Delivered after reconnecting.")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.stop()  # not connected: the delivery loop leaves its rows alone
        job = await app.cron.create(in_chat(), kind="in", when="1s", prompt="Remind me")
        [run] = await eventually(lambda: _finished_runs(app, job.id))
        assert run.state is RunState.DELIVERED and await app.outbox.counts() == {"queued": 1}
        await adapter.start(app.gateway.submit)
        app.gateway.delivery.wake()
        await adapter.wait_sent(1)
        assert [m.text for m in adapter.sent] == ["Delivered after reconnecting."]


async def test_a_user_cannot_list_or_remove_another_chats_jobs_but_an_admin_can(app_factory, emulator):
    async def responder(rec: RecordedRequest) -> Reply:
        if not tool_results(rec):
            return Reply(
                tool_uses=[
                    ToolUse("cronjob", {"action": "list"}),
                    ToolUse("cronjob", {"action": "remove", "job_id": job_id}),
                ]
            )
        return Reply(text="done")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await adapter.say("/cron add every 1d Water the plants", user="u1")
        reply = (await adapter.wait_sent(1))[0].text
        job_id = reply.split()[1].rstrip(":")
        await adapter.say("/cron list", user="u2")
        await adapter.say(f"/cron remove {job_id}", user="u2")
        await adapter.say("what jobs are there? remove that one", user="u2")
        sent = await adapter.wait_sent(4)
        assert sent[1].text.startswith("No scheduled jobs here.")
        assert sent[2].text == f"Sorry: no scheduled job '{job_id}' in this chat (list them to see the ids)"
        listed, removed = tool_results(emulator.requests[-1])
        assert '"count": 0' in listed and '"success": false' in removed
        assert await app.cron.store.get(job_id) is not None

        await adapter.say("/cron list", user="u1")
        await adapter.say("/cron list", user="admin")
        sent = await adapter.wait_sent(6)
        assert job_id in sent[4].text and "Water the plants" in sent[4].text
        assert job_id in sent[5].text and "loop:u1" in sent[5].text, "admins see every chat's jobs"
        await adapter.say(f"/cron remove {job_id}", user="admin")
        assert (await adapter.wait_sent(7))[6].text == f"Removed {job_id}."
        assert await app.cron.store.all() == []


async def test_bad_input_is_a_clear_error_and_stores_nothing(app_factory, emulator):
    attempts = [
        {"action": "create", "cron": "0 25 * * *", "prompt": "x"},
        {"action": "create", "at": "2001-01-01T00:00", "prompt": "x"},
        {"action": "create", "every": "10s", "prompt": "x"},
        {"action": "create", "every": "1h", "prompt": "x" * 101},
        {"action": "create", "every": "1h", "timezone": "Europe/Atlantis", "prompt": "x"},
        {"action": "create", "every": "1h", "in": "5m", "prompt": "x"},
        {"action": "pause"},
    ]

    async def responder(rec: RecordedRequest) -> Reply:
        if not tool_results(rec):
            return Reply(tool_uses=[ToolUse("cronjob", a) for a in attempts])
        return Reply(text="none of that worked")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"cron.max_prompt_chars": 100}) as app:
        await adapter.say("schedule some nonsense")
        await adapter.say("/cron add every 5s too often")
        await adapter.say("/cron add cron 0 8 * * 9 bad weekday")
        sent = await adapter.wait_sent(3)
        errors = tool_results(emulator.requests[-1])
        for error, expected in zip(
            errors,
            [
                "invalid cron expression",
                "in the past",
                "too frequent",
                "limit is 100",
                "unknown time zone",
                "exactly one of",
                "needs job_id",
            ],
            strict=True,
        ):
            assert '"success": false' in error and expected in error
        texts = sorted(m.text for m in sent)
        assert any("too frequent" in t for t in texts) and any("bad day-of-week field" in t for t in texts)
        assert await app.cron.store.all() == []


async def test_a_job_whose_chat_is_no_longer_authorized_is_paused_with_a_note_to_admins(
    app_factory, emulator, home
):
    async with app_factory(LoopbackAdapter()) as app:
        job = await app.cron.create(in_chat("u2"), kind="every", when="1d", prompt="Daily digest")
    move_next_run(home, job.id, datetime.now(UTC) - timedelta(seconds=10))
    adapter = LoopbackAdapter()
    with capture_logs() as logs:
        async with app_factory(adapter, **{"access.allowed": ()}) as app:  # u2 is no longer allowed
            [note] = await adapter.wait_sent(1)
            assert (
                note.chat.chat_id == "admin" and job.id in note.text and "no longer authorized" in note.text
            )
            paused = await eventually(lambda: _paused(app, job.id))
            assert paused.next_run_at is None and "no longer authorized" in paused.last_result
            await eventually(lambda: _scheduled_exactly(app, set()))
    assert any(e["event"] == "cron_job_paused_unauthorized" and e["job"] == job.id for e in logs)
    assert emulator.requests == [], "the model is never asked"


async def _paused(app: Any, job_id: str) -> CronJob | None:
    job = await app.cron.store.get(job_id)
    return job if job is not None and job.state is JobState.PAUSED else None


async def test_a_group_job_posts_in_its_thread_without_anyones_profile(app_factory, emulator):
    async def responder(rec: RecordedRequest) -> Reply:
        if is_cron(rec):
            return Reply(text="Standup in 5 minutes.")
        if not tool_results(rec):
            return Reply(
                tool_uses=[
                    ToolUse("cronjob", {"action": "create", "in": "1s", "prompt": "Announce the standup."})
                ]
            )
        return Reply(text="Scheduled.")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        app.files.user(UserRef("loop", "u1")).add("User's secret nickname is Bumblebee")
        await adapter.say(
            "announce the standup", user="u1", chat="team", chat_type=ChatType.GROUP, thread_id="t9"
        )
        sent = await adapter.wait_sent(2)
        assert (sent[1].chat.chat_id, sent[1].chat.thread_id, sent[1].scheduled) == ("team", "t9", True)
        cron_request = next(r for r in emulator.requests if is_cron(r))
        assert "Bumblebee" not in system_text(cron_request), "a channel reads what a group job writes"


async def test_an_interrupted_run_runs_again_after_a_restart_and_is_delivered_once(app_factory, emulator):
    release = asyncio.Event()
    calls = 0

    async def responder(rec: RecordedRequest) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()  # the bot stops while this request is in flight
        return Reply(text="The one reminder.")

    emulator.default = responder
    overrides = {"worker.drain_timeout_s": 0.2}
    async with app_factory(LoopbackAdapter(), **overrides) as app:
        job = await app.cron.create(in_chat(), kind="in", when="1s", prompt="Remind me once")
        await emulator.wait_for_requests(1, timeout=20)
    release.set()
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **overrides) as app:
        await adapter.wait_sent(1)
        [run] = await eventually(lambda: _finished_runs(app, job.id))
        await asyncio.sleep(0.3)
        await app.gateway.delivery.deliver_due()
        assert [m.text for m in adapter.sent] == ["The one reminder."]
        assert run.state is RunState.DELIVERED and calls == 2
        assert (await app.cron.store.get(job.id)).state is JobState.DONE
