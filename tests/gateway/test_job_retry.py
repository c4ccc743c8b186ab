"""``JobQueue.retry``: the dashboard's retry of a failed job — a new row, due at once
(no failure cooldown), with the same kind, session and payload; the failed row keeps
its error. Only a failed job can be retried."""

from __future__ import annotations

import pytest

from mnemo.gateway.jobs.queue import Job, JobRun, JobState
from tests.gateway.test_worker import Clock, db, make_queue, state_of, until  # noqa: F401  (db: fixture)


async def test_a_failed_job_is_queued_again_due_now_and_runs(db) -> None:  # noqa: F811
    clock = Clock()
    attempts: list[dict] = []
    broken = [True]

    async def handler(job: Job, run: JobRun) -> None:
        attempts.append(dict(job.payload))
        if broken[0]:
            raise ConnectionError("provider unreachable")

    queue = make_queue(db, clock, max_attempts=1)
    queue.register("sync", handler, backoff=(600.0,))
    first = await queue.enqueue("sync", "s1", {"turn": 7})
    async with queue:
        await until(lambda: _is(queue, first.id, JobState.FAILED))
        failed = await queue.get(first.id)
        assert failed is not None and "provider unreachable" in (failed.error or "")
        # A plain enqueue now would wait out the 600 s failure cooldown; a retry does not.
        broken[0] = False
        again = await queue.retry(first.id)
        assert again.id != first.id and again.not_before <= clock.now and dict(again.payload) == {"turn": 7}
        await until(lambda: _is(queue, again.id, JobState.DONE))
    assert attempts == [{"turn": 7}, {"turn": 7}]
    assert await state_of(queue, first.id) is JobState.FAILED, "the failed row and its error are kept"
    with pytest.raises(ValueError, match="not failed"):
        await queue.retry(again.id)
    with pytest.raises(ValueError, match="no job"):
        await queue.retry(9999)


async def _is(queue, job_id: int, state: JobState) -> bool:
    return await state_of(queue, job_id) is state
