"""CronRepository: create/list/edit jobs, claim a slot by compare-and-swap, and finish
a run together with its outbox delivery."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from mnemo.gateway.cron.schedules import Schedule, ScheduleKind
from mnemo.gateway.cron.store import CronJob, JobSource, JobState, JobTarget, RunState
from mnemo.gateway.events import ChatRef, OutboundMessage
from tests.contract.conftest import Backend

TARGET = JobTarget("telegram", "100")


def make_job(backend: Backend, job_id: str = "j1") -> CronJob:
    now = backend.clock.dt()
    return CronJob(
        id=job_id,
        target=TARGET,
        user_id="42",
        source=JobSource.TOOL,
        created_by="telegram:42",
        prompt="water the plants",
        schedule=Schedule(ScheduleKind.EVERY, "3600", "UTC", now),
        state=JobState.ACTIVE,
        next_run_at=now + timedelta(hours=1),
        last_run_at=None,
        last_result=None,
        rev=1,
        created_at=now,
    )


async def test_create_is_insert_if_absent_and_edits_bump_rev(backend: Backend) -> None:
    cron, now = backend.cron, backend.clock.dt()
    job = make_job(backend)
    assert await cron.insert(job) is True
    assert await cron.insert(replace(job, prompt="other")) is False
    stored = await cron.get("j1")
    assert stored is not None and stored.prompt == "water the plants" and stored.rev == 1
    assert [j.id for j in await cron.in_chat(TARGET)] == ["j1"]
    assert await cron.in_chat(JobTarget("telegram", "101")) == []
    await cron.redefine(replace(job, prompt="feed the cat"), now)
    assert await cron.set_state("j1", JobState.PAUSED, None, now) is True
    edited = await cron.get("j1")
    assert edited is not None and (edited.prompt, edited.state, edited.rev) == (
        "feed the cat",
        JobState.PAUSED,
        3,
    )
    assert await cron.delete("j1") is True and await cron.all() == []
    assert await cron.set_state("j1", JobState.ACTIVE, None, now) is False


async def test_a_slot_is_claimed_once_and_a_stale_view_loses(backend: Backend) -> None:
    cron, now = backend.cron, backend.clock.dt()
    job = make_job(backend)
    await cron.insert(job)
    slot, following = job.next_run_at, job.next_run_at + timedelta(hours=1)
    claimed = await cron.claim_scheduled("j1", job.rev, slot, following, now, pid=1)
    assert claimed is not None and claimed.job.next_run_at == following and not claimed.manual
    # A second scheduler that saw the same slot loses the compare-and-swap.
    assert await cron.claim_scheduled("j1", job.rev, slot, following, now, pid=2) is None
    # So does one that saw an older definition.
    assert await cron.claim_scheduled("j1", job.rev + 1, following, None, now, pid=2) is None
    (run,) = await cron.open_runs()
    assert (run.id, run.state, run.pid, run.scheduled_for) == (claimed.run_id, RunState.RUNNING, 1, slot)


async def test_finishing_a_run_queues_its_delivery_in_the_outbox(backend: Backend) -> None:
    cron, now = backend.cron, backend.clock.dt()
    job = make_job(backend)
    await cron.insert(job)
    claimed = await cron.claim_scheduled("j1", 1, job.next_run_at, None, now, pid=1)
    assert claimed is not None
    delivery = OutboundMessage(chat=ChatRef("telegram", "100"), text="time to water")
    outbox_id = await cron.finish_run(
        claimed.run_id, RunState.DELIVERED, now, session_id="s9", delivery=delivery, job_done=True
    )
    assert outbox_id is not None
    row = await backend.outbox.get(outbox_id)
    assert row is not None and (row.kind, row.text, row.session_id) == ("cron", "time to water", "s9")
    assert row.to_message().scheduled
    run = await cron.get_run(claimed.run_id)
    assert run is not None and (run.state, run.outbox_id) == (RunState.DELIVERED, outbox_id)
    finished = await cron.get("j1")
    assert finished is not None and finished.state is JobState.DONE and finished.last_result == "delivered"
    assert await cron.open_runs() == []


async def test_a_requested_run_is_claimed_by_one_process(backend: Backend) -> None:
    cron, now = backend.cron, backend.clock.dt()
    await cron.insert(make_job(backend))
    run_id = await cron.request_run("j1", now)
    claimed = await cron.claim_run(run_id, RunState.REQUESTED, None, now, pid=7)
    assert claimed is not None and claimed.manual and claimed.job.id == "j1"
    assert await cron.claim_run(run_id, RunState.REQUESTED, None, now, pid=8) is None
    await cron.mark_run(run_id, RunState.INTERRUPTED, now, "stopped")
    assert [(r.id, r.state) for r in await cron.runs("j1")] == [(run_id, RunState.INTERRUPTED)]
    # Nothing was delivered for a run finished without a delivery.
    assert await cron.finish_run(run_id, RunState.SILENT, now) is None
    assert await backend.outbox.counts() == {}


async def test_runs_are_counted_by_how_they_ended(backend: Backend) -> None:
    cron, now = backend.cron, backend.clock.dt()
    await cron.insert(make_job(backend, "j1"))
    await cron.insert(make_job(backend, "j2"))
    for job_id, state in (("j1", RunState.SKIPPED), ("j1", RunState.SKIPPED), ("j2", RunState.DELIVERED)):
        run_id = await cron.request_run(job_id, now)
        await cron.finish_run(run_id, state, now, detail="over budget (daily_usd)")
    assert await cron.count_runs(RunState.SKIPPED) == {"j1": 2}
    assert await cron.count_runs(RunState.DELIVERED) == {"j2": 1}
    assert await cron.count_runs(RunState.MISSED) == {}
