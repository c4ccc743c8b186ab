"""The persisted worker queue: single flight, retries with backoff then failure, crash
recovery, bounded concurrency, drain on shutdown, depth/status/metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from mnemo.gateway.config import WorkerSettings
from mnemo.gateway.jobs.queue import Job, JobQueue, JobRun, JobState
from mnemo.gateway.jobs.store import JobStore
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.storage import state_database
from mnemo.memory.db import Database


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = state_database(tmp_path / "state.db")
    await database.open()
    yield database
    await database.close()


def make_queue(
    db: Database, clock: Clock | None = None, metrics: Metrics | None = None, **settings
) -> JobQueue:
    cfg = WorkerSettings(**{"concurrency": 2, "max_attempts": 3, "drain_timeout_s": 1.0, **settings})
    return JobQueue(JobStore(db), cfg, clock=clock or Clock(), poll_s=0.05, metrics=metrics)


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def _true(items: list) -> bool:
    return bool(items)


async def state_of(queue: JobQueue, job_id: int) -> JobState:
    job = await queue.get(job_id)
    assert job is not None
    return job.state


async def test_enqueue_while_queued_or_running_is_merged(db):
    release = asyncio.Event()
    calls: list[int] = []

    async def handler(job: Job, run: JobRun) -> None:
        calls.append(job.id)
        await release.wait()

    queue = make_queue(db)
    queue.register("compress", handler)
    first = await queue.enqueue("compress", "s1", {"prompt_tokens": 10})
    assert (await queue.enqueue("compress", "s1")).id == first.id, "merged while queued"
    other_kind = await queue.enqueue("review", "s1")
    other_session = await queue.enqueue("compress", "s2")
    assert len({first.id, other_kind.id, other_session.id}) == 3
    async with queue:
        await until(lambda: _is(queue, first.id, JobState.RUNNING))
        merged = await queue.enqueue("compress", "s1")
        assert merged.id == first.id and merged.state is JobState.RUNNING, "merged while running"
        release.set()
        await until(lambda: _is(queue, first.id, JobState.DONE))
        again = await queue.enqueue("compress", "s1")
        assert again.id != first.id, "after completion a new request is a new job"
        await queue.wait_idle()
    assert calls.count(first.id) == 1
    assert (await queue.get(first.id)).payload == {"prompt_tokens": 10}


async def _is(queue: JobQueue, job_id: int, state: JobState) -> bool:
    return await state_of(queue, job_id) is state


async def test_failures_retry_on_the_backoff_schedule_then_fail_with_the_error(db):
    clock = Clock()
    attempts: list[float] = []

    async def handler(job: Job, run: JobRun) -> None:
        attempts.append(clock.now)
        raise ValueError(f"boom {job.attempts}")

    queue = make_queue(db, clock)
    queue.register("compress", handler, backoff=(60, 300, 900))
    job = await queue.enqueue("compress", "s1")
    async with queue:
        await until(lambda: _attempts(queue, job.id, 1))
        row = await queue.get(job.id)
        assert (
            row.state is JobState.QUEUED
            and row.not_before == clock.now + 60
            and row.error == "ValueError: boom 1"
        )
        await asyncio.sleep(0.2)
        assert len(attempts) == 1, "not retried before its time"
        clock.now += 60
        queue.wake()
        await until(lambda: _attempts(queue, job.id, 2))
        assert (await queue.get(job.id)).not_before == clock.now + 300
        clock.now += 300
        queue.wake()
        await until(lambda: _is(queue, job.id, JobState.FAILED))
    failed = await queue.get(job.id)
    assert failed.attempts == 3 and failed.error == "ValueError: boom 3" and failed.finished_at == clock.now
    assert attempts == [1_000.0, 1_060.0, 1_360.0]
    # The cooldown after a failure is persisted: a new request waits the last backoff step.
    fresh = await queue.enqueue("compress", "s1")
    assert fresh.id != job.id and fresh.not_before == failed.updated_at + 900


async def _attempts(queue: JobQueue, job_id: int, n: int) -> bool:
    job = await queue.get(job_id)
    return job is not None and job.attempts >= n and job.state is not JobState.RUNNING


async def test_a_retry_sees_the_checkpoint_of_the_failed_attempt(db):
    seen: list[dict] = []

    async def handler(job: Job, run: JobRun) -> None:
        seen.append(dict(run.checkpoint))
        if not run.checkpoint.get("step_one"):
            await run.save(step_one=True)
            raise RuntimeError("transient")

    queue = make_queue(db)
    queue.register("compress", handler, backoff=(0,))
    job = await queue.enqueue("compress", "s1")
    async with queue:
        await until(lambda: _is(queue, job.id, JobState.DONE))
    assert seen == [{}, {"step_one": True}]
    assert (await queue.get(job.id)).checkpoint == {"step_one": True}


async def test_restart_requeues_running_jobs_resumes_queued_and_never_reruns_done(db):
    ran: list[str] = []

    async def handler(job: Job, run: JobRun) -> None:
        ran.append(job.session_id)

    before = make_queue(db)
    crashed = await before.enqueue("review", "was-running")
    waiting = await before.enqueue("review", "was-queued")
    finished = await before.enqueue("review", "was-done")
    hopeless = await before.enqueue("review", "kept-crashing")
    # What a process killed mid-job leaves behind (the real kill -9 is in the e2e test).
    await db.write(
        lambda c: c.execute("UPDATE jobs SET state='running', attempts=1 WHERE id=?", (crashed.id,))
    )
    await db.write(lambda c: c.execute("UPDATE jobs SET state='done', attempts=1 WHERE id=?", (finished.id,)))
    await db.write(
        lambda c: c.execute("UPDATE jobs SET state='running', attempts=3 WHERE id=?", (hopeless.id,))
    )

    after = make_queue(db)
    after.register("review", handler)
    async with after:
        await until(lambda: _is(after, waiting.id, JobState.DONE))
        await until(lambda: _is(after, crashed.id, JobState.DONE))
        await after.wait_idle()
    assert sorted(ran) == ["was-queued", "was-running"]
    assert (await after.get(crashed.id)).attempts == 2
    gave_up = await after.get(hopeless.id)
    assert gave_up.state is JobState.FAILED and "restart" in gave_up.error


async def test_stop_drains_running_jobs_and_takes_no_new_ones(db):
    started: list[str] = []

    async def slow(job: Job, run: JobRun) -> None:
        started.append(job.session_id)
        await asyncio.sleep(0.3)

    queue = make_queue(db, concurrency=1)
    queue.register("review", slow)
    first = await queue.enqueue("review", "a")
    second = await queue.enqueue("review", "b")
    await queue.start()
    await until(lambda: _true(started))
    await queue.stop()
    assert await state_of(queue, first.id) is JobState.DONE, "the running job finished within the drain time"
    assert await state_of(queue, second.id) is JobState.QUEUED, "no new job is taken while stopping"
    assert started == ["a"]
    await queue.stop()  # idempotent


async def test_a_job_still_running_after_the_drain_time_is_cancelled_and_requeued(db):
    entered: list[int] = []

    async def stuck(job: Job, run: JobRun) -> None:
        entered.append(job.id)
        await asyncio.Event().wait()

    queue = make_queue(db, drain_timeout_s=0.1)
    queue.register("compress", stuck)
    job = await queue.enqueue("compress", "s1")
    await queue.start()
    await until(lambda: _true(entered))
    await queue.stop()
    row = await queue.get(job.id)
    assert row.state is JobState.QUEUED and row.attempts == 0, "the interrupted attempt is given back"


async def test_concurrency_is_bounded_and_a_session_runs_one_job_at_a_time(db):
    running: set[str] = set()
    peak = 0
    overlap: list[str] = []

    async def handler(job: Job, run: JobRun) -> None:
        nonlocal peak
        key = f"{job.session_id}"
        if any(r.startswith(key + "/") for r in running):
            overlap.append(key)
        running.add(f"{key}/{job.kind}")
        peak = max(peak, len(running))
        await asyncio.sleep(0.05)
        running.discard(f"{key}/{job.kind}")

    queue = make_queue(db, concurrency=2)
    for kind in ("compress", "review", "session_end"):
        queue.register(kind, handler)
    for s in range(4):
        for kind in ("compress", "review", "session_end"):
            await queue.enqueue(kind, f"s{s}")
    async with queue:
        await queue.wait_idle()
    assert peak == 2
    assert overlap == [], "jobs of one session never overlap"
    assert (await queue.counts()) == {"done": 12}


async def test_jobs_of_an_unknown_kind_wait_and_count_in_the_depth(db):
    queue = make_queue(db)
    queue.register("review", lambda job, run: asyncio.sleep(0))
    await queue.enqueue("future_kind", "s1")
    done = await queue.enqueue("review", "s1")
    async with queue:
        await until(lambda: _is(queue, done.id, JobState.DONE))
        await queue.wait_idle()
    assert await queue.depth() == 1
    assert (await queue.jobs(kind="future_kind"))[0].state is JobState.QUEUED


async def test_status_line_and_metrics_report_depth_durations_and_failures(db):
    metrics = Metrics()

    async def ok(job: Job, run: JobRun) -> None:
        return None

    async def bad(job: Job, run: JobRun) -> None:
        raise RuntimeError("nope")

    queue = make_queue(db, metrics=metrics, max_attempts=1)
    queue.register("review", ok)
    queue.register("compress", bad)
    await queue.enqueue("review", "s1")
    await queue.enqueue("compress", "s2")
    await queue.enqueue("review", "s3")
    async with queue:
        await queue.wait_idle()
    line = await queue.status_line()
    assert line.startswith("Background jobs: 0 queued, 0 running, 1 failed")
    assert "review 2 done, avg" in line and "compress 0 done, 1 failed" in line
    text = (await metrics.render()).decode()
    assert 'mnemo_job_duration_seconds_count{kind="review"} 2.0' in text
    assert 'mnemo_jobs_total{kind="compress",outcome="failed"} 1.0' in text
