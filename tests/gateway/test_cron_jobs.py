"""Managing jobs (gateway/cron.py) against a real state.db, with a controlled clock:
who sees and changes what, validation that stores nothing, config.yaml upserts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnemo.gateway.config import CronSettings
from mnemo.gateway.cron.service import MAX_JOBS_PER_CHAT, Caller, CronJobs, parse_chat
from mnemo.gateway.cron.store import CronStore, JobSource, JobState, JobTarget
from mnemo.gateway.cron.tool import parse_add
from mnemo.gateway.delivery.outbox import Outbox
from mnemo.gateway.errors import ConfigError, InvalidJob, JobNotAllowed, JobNotFound
from mnemo.gateway.events import ChatType
from mnemo.gateway.storage import state_database


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def jobs(tmp_path: Path, clock: Clock) -> AsyncIterator[CronJobs]:
    db = state_database(tmp_path / "state.db")
    await db.open()
    try:
        yield CronJobs(
            CronStore(db, Outbox(db)), CronSettings(max_prompt_chars=200), default_timezone="UTC", clock=clock
        )
    finally:
        await db.close()


def dm(user: str) -> Caller:
    return Caller(JobSource.TOOL, JobTarget("telegram", user, ChatType.DM), user)


def member(user: str, chat: str = "g1", thread: str | None = None) -> Caller:
    return Caller(JobSource.COMMAND, JobTarget("discord", chat, ChatType.GROUP, thread), user)


ADMIN = Caller(JobSource.COMMAND, JobTarget("telegram", "999", ChatType.DM), "999", is_admin=True)


async def test_a_job_targets_the_chat_it_was_created_in_and_speaks_for_its_creator(jobs: CronJobs) -> None:
    job = await jobs.create(member("alice", thread="t7"), kind="every", when="1d", prompt="Standup reminder")
    assert job.target == JobTarget("discord", "g1", ChatType.GROUP, "t7")
    assert job.user_id == "alice" and job.created_by == "discord:alice" and job.source is JobSource.COMMAND
    assert job.next_run_at == datetime(2025, 3, 30, 12, 0, tzinfo=UTC)
    assert await jobs.store.get(job.id) == job


async def test_users_see_and_change_only_their_chats_jobs_admins_all(jobs: CronJobs) -> None:
    mine = await jobs.create(dm("1"), kind="cron", when="0 8 * * *", prompt="Morning summary")
    theirs = await jobs.create(dm("2"), kind="cron", when="0 9 * * *", prompt="Their summary")
    assert [j.id for j in await jobs.list(dm("1"))] == [mine.id]
    assert [j.id for j in await jobs.list(dm("2"))] == [theirs.id]
    for action in (jobs.get, jobs.pause, jobs.remove, jobs.resume):
        with pytest.raises(JobNotFound, match="in this chat"):
            await action(dm("1"), theirs.id)
    assert await jobs.store.get(theirs.id) == theirs, "nothing changed"
    assert {j.id for j in await jobs.list(ADMIN)} == {mine.id, theirs.id}
    await jobs.remove(ADMIN, theirs.id)
    assert await jobs.store.get(theirs.id) is None


async def test_in_a_group_members_see_the_channels_jobs_but_change_only_their_own(jobs: CronJobs) -> None:
    job = await jobs.create(member("alice"), kind="every", when="1d", prompt="Water the plants")
    assert [j.id for j in await jobs.list(member("bob"))] == [job.id]
    with pytest.raises(JobNotAllowed):
        await jobs.remove(member("bob"), job.id)
    assert await jobs.list(member("alice", thread="t1")) == [], "another thread is another chat"
    assert await jobs.list(member("alice", chat="g2")) == []
    await jobs.pause(member("alice"), job.id)


async def test_invalid_input_is_refused_and_stores_nothing(jobs: CronJobs, clock: Clock) -> None:
    caller = dm("1")
    cases = [
        ({"kind": "cron", "when": "0 25 * * *"}, "invalid cron expression"),
        ({"kind": "at", "when": "2025-03-29T11:00"}, "in the past"),
        ({"kind": "every", "when": "20s"}, "too frequent"),
        ({"kind": "cron", "when": "0 8 * * *", "timezone": "Mars/Olympus_Mons"}, "unknown time zone"),
        ({"kind": "sometimes", "when": "1h"}, "unknown schedule kind"),
        ({"kind": "every", "when": "1h", "prompt": "x" * 201}, "limit is 200"),
        ({"kind": "every", "when": "1h", "prompt": "   "}, "prompt is empty"),
    ]
    for kwargs, message in cases:
        args = {"prompt": "do it", **kwargs}
        with pytest.raises(InvalidJob, match=message):
            await jobs.create(caller, **args)  # type: ignore[arg-type]  # invalid arguments are the point of the test
    with pytest.raises(InvalidJob, match="chat id"):
        await jobs.create(
            Caller.operator(), kind="every", when="1h", prompt="p", target=JobTarget("x", "a/b")
        )
    assert await jobs.store.all() == []


async def test_pause_and_resume_continue_from_now(jobs: CronJobs, clock: Clock) -> None:
    job = await jobs.create(dm("1"), kind="every", when="1h", prompt="Hourly check")
    paused = await jobs.pause(dm("1"), job.id)
    assert paused.state is JobState.PAUSED and paused.next_run_at is None and paused.rev > job.rev
    with pytest.raises(InvalidJob, match="not active"):
        await jobs.pause(dm("1"), job.id)
    clock.now += timedelta(hours=5, minutes=10)
    resumed = await jobs.resume(dm("1"), job.id)
    # Runs missed while paused are not made up for; the grid of the interval is kept.
    assert resumed.state is JobState.ACTIVE
    assert resumed.next_run_at == datetime(2025, 3, 29, 18, 0, tzinfo=UTC)


async def test_a_one_off_whose_time_passed_while_paused_cannot_be_resumed(
    jobs: CronJobs, clock: Clock
) -> None:
    job = await jobs.create(dm("1"), kind="in", when="10m", prompt="Tea is ready")
    await jobs.pause(dm("1"), job.id)
    clock.now += timedelta(hours=1)
    with pytest.raises(InvalidJob, match="has passed"):
        await jobs.resume(dm("1"), job.id)


async def test_a_chat_holds_a_bounded_number_of_jobs(jobs: CronJobs) -> None:
    for i in range(MAX_JOBS_PER_CHAT):
        await jobs.create(dm("1"), kind="every", when=f"{i + 1}h", prompt=f"job {i}")
    with pytest.raises(InvalidJob, match="remove some first"):
        await jobs.create(dm("1"), kind="every", when="1d", prompt="one too many")
    await jobs.create(dm("2"), kind="every", when="1d", prompt="another chat is not affected")


DECLARED = (
    {
        "id": "standup",
        "chat": "discord:group:555:66",
        "cron": "0 9 * * 1-5",
        "timezone": "Europe/Berlin",
        "prompt": "Post the standup reminder",
    },
    {"id": "backup-check", "chat": "telegram:42", "every": "1d", "prompt": "Check last night's backup"},
)


async def test_declared_jobs_are_upserted_by_id_not_duplicated(jobs: CronJobs, clock: Clock) -> None:
    assert await jobs.sync_declared(DECLARED) == (2, 0, 0)
    first = {j.id: j for j in await jobs.store.all()}
    assert first["standup"].target == JobTarget("discord", "555", ChatType.GROUP, "66")
    assert first["standup"].user_id == "operator" and first["backup-check"].user_id == "42"
    clock.now += timedelta(hours=3)  # a restart later: unchanged entries keep their rows and next runs
    assert await jobs.sync_declared(DECLARED) == (0, 0, 0)
    assert {j.id: j for j in await jobs.store.all()} == first
    changed = ({**DECLARED[0], "prompt": "Post the standup reminder, with the agenda"}, DECLARED[1])
    assert await jobs.sync_declared(changed) == (0, 1, 0)
    redefined = await jobs.store.get("standup")
    assert redefined is not None and redefined.rev > first["standup"].rev and "agenda" in redefined.prompt
    assert await jobs.sync_declared(changed[1:]) == (0, 0, 1)
    assert [j.id for j in await jobs.store.all()] == ["backup-check"]


async def test_declared_jobs_cannot_be_removed_from_chat_but_can_be_paused(jobs: CronJobs) -> None:
    await jobs.sync_declared(DECLARED)
    with pytest.raises(JobNotAllowed, match="config.yaml"):
        await jobs.remove(ADMIN, "standup")
    await jobs.pause(ADMIN, "standup")
    await jobs.sync_declared(DECLARED)
    job = await jobs.store.get("standup")
    assert job is not None and job.state is JobState.PAUSED, "a restart does not undo a pause"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"id": "a", "chat": "telegram:1", "prompt": "p"}, r"cron.jobs\[0\] \(a\): give exactly one of"),
        (
            {"id": "a", "chat": "telegram:1", "prompt": "p", "every": "5s"},
            r"cron.jobs\[0\] \(a\): every 5s is too",
        ),
        ({"id": "a", "chat": "nowhere", "prompt": "p", "every": "1h"}, "invalid chat"),
        ({"id": "a b", "chat": "telegram:1", "prompt": "p", "every": "1h"}, "'id' must be"),
        ({"id": "a", "chat": "telegram:1", "prompt": "p", "every": "1h", "when": "x"}, "unknown key"),
        ({"id": "a", "chat": "telegram:1", "prompt": "p", "at": "08:00"}, "needs a date"),
    ],
)
async def test_bad_declared_jobs_are_configuration_errors(jobs: CronJobs, entry: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        await jobs.sync_declared([entry])
    assert await jobs.store.all() == []


async def test_a_declared_id_cannot_take_over_another_job(jobs: CronJobs) -> None:
    job = await jobs.create(dm("1"), kind="every", when="1h", prompt="mine")
    with pytest.raises(ConfigError, match="taken"):
        await jobs.sync_declared([{"id": job.id, "chat": "telegram:1", "every": "1h", "prompt": "p"}])


ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12).filter(
    lambda s: ".." not in s and s not in (".",)
)


@given(platform=ids, chat=ids, thread=st.none() | ids, group=st.booleans())
def test_chat_addresses_round_trip(platform: str, chat: str, thread: str | None, group: bool) -> None:
    target = JobTarget(platform, chat, ChatType.GROUP if group else ChatType.DM, thread if group else None)
    assert parse_chat(str(target)) == target


@given(
    prompt=st.text(min_size=1, max_size=80).filter(lambda s: s.strip() and s.split()[0][:3].lower() != "tz=")
)
def test_cron_add_arguments(prompt: str) -> None:
    expected = prompt.strip()
    assert parse_add(f"every 2h {prompt}") == ("every", "2h", None, expected)
    berlin = ("cron", "0 8 * * 1-5", "Europe/Berlin", expected)
    assert parse_add(f"cron 0 8 * * 1-5 tz=Europe/Berlin {prompt}") == berlin
    assert parse_add(f"cron '0 8 * * 1-5' {prompt}")[:2] == ("cron", "0 8 * * 1-5")
    assert parse_add(f"cron @daily {prompt}")[:2] == ("cron", "@daily")
