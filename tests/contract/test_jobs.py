"""JobStorage: single flight per (session, kind) or per dedupe key, a claim that skips busy
sessions (a keyed job neither waits for nor holds its session) and respects not_before,
settle/give back, checkpoints, recovery after a crash."""

from __future__ import annotations

from mnemo.gateway.jobs.store import JobState
from tests.contract.conftest import Backend

KINDS = ["compress", "review"]


async def test_enqueue_is_single_flight_per_session_and_kind(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    first, created = await jobs.add("compress", "s1", {"n": 1}, cooldown_s=0, now=now)
    same, again = await jobs.add("compress", "s1", {"n": 2}, cooldown_s=0, now=now)
    other, other_created = await jobs.add("review", "s1", {}, cooldown_s=0, now=now)
    assert created and not again and other_created
    assert same.id == first.id and same.payload == {"n": 1}
    assert [j.id for j in await jobs.find(session_id="s1")] == [first.id, other.id]
    assert [j.id for j in await jobs.find(kind="review")] == [other.id]
    assert await jobs.counts() == {"queued": 2}


async def test_claim_takes_one_job_per_session_and_complete_frees_it(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    a, _ = await jobs.add("compress", "s1", {}, cooldown_s=0, now=now)
    b, _ = await jobs.add("review", "s1", {}, cooldown_s=0, now=now)
    c, _ = await jobs.add("review", "s2", {}, cooldown_s=0, now=now)
    first = await jobs.claim(KINDS, now)
    second = await jobs.claim(KINDS, now)
    assert first is not None and second is not None
    assert (first.id, first.state, first.attempts) == (a.id, JobState.RUNNING, 1)
    assert second.id == c.id  # s1 is busy
    assert await jobs.claim(KINDS, now) is None
    assert await jobs.outstanding(KINDS, now) == 3
    await jobs.settle(a.id, JobState.DONE, now=now)
    third = await jobs.claim(KINDS, now)
    assert third is not None and third.id == b.id
    done = await jobs.get(a.id)
    assert done is not None and done.state is JobState.DONE and done.finished_at == now
    assert await jobs.claim(["other"], now) is None


async def test_a_retry_waits_for_not_before_and_keeps_its_error(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    job, _ = await jobs.add("compress", "s1", {}, cooldown_s=0, now=now)
    assert await jobs.claim(KINDS, now) is not None
    await jobs.settle(job.id, JobState.QUEUED, now=now, error="boom", not_before=now + 60)
    assert await jobs.claim(KINDS, now + 59) is None
    assert await jobs.next_due(KINDS) == now + 60
    retried = await jobs.claim(KINDS, now + 60)
    assert retried is not None and (retried.attempts, retried.error) == (2, "boom")
    await jobs.settle(job.id, JobState.FAILED, now=now + 61)
    failed = await jobs.get(job.id)
    assert failed is not None and (failed.state, failed.error) == (JobState.FAILED, "boom")
    # After a failure, a new job of the same (session, kind) waits out the cooldown.
    fresh, created = await jobs.add("compress", "s1", {}, cooldown_s=300, now=now + 62)
    assert created and fresh.not_before == now + 61 + 300


async def test_lease_recovery_give_back_and_checkpoint(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    crashed, _ = await jobs.add("compress", "s1", {}, cooldown_s=0, now=now)
    cancelled, _ = await jobs.add("compress", "s2", {}, cooldown_s=0, now=now)
    assert await jobs.claim(KINDS, now) is not None and await jobs.claim(KINDS, now) is not None
    await jobs.save_checkpoint(crashed.id, {"step": 2}, now)
    await jobs.give_back(cancelled.id, now)
    back = await jobs.get(cancelled.id)
    assert back is not None and (back.state, back.attempts) == (JobState.QUEUED, 0)
    # A restart: the job left running is queued again with its checkpoint.
    assert await jobs.recover(now + 1, max_attempts=3, retention_s=86_400) == (1, 0)
    again = await jobs.get(crashed.id)
    assert again is not None and again.state is JobState.QUEUED and again.checkpoint == {"step": 2}
    # One that has used up its attempts (each start counted) is failed instead.
    hopeless, _ = await jobs.add("review", "s3", {}, cooldown_s=0, now=now)
    for t in (2, 3, 4):
        claimed = await jobs.claim(["review"], now + t)
        assert claimed is not None and claimed.attempts == t - 1
        outcome = await jobs.recover(now + t, max_attempts=3, retention_s=86_400)
        assert outcome == ((1, 0) if t < 4 else (0, 1))
    dead = await jobs.get(hopeless.id)
    assert dead is not None and dead.state is JobState.FAILED and dead.error


# --- the dedupe key (provider writes: independent, idempotent jobs of a session) -----------
KEYED = ["provider_write", *KINDS]


async def test_a_dedupe_key_is_single_flight_per_key_instead_of_per_session(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    first, created = await jobs.add(
        "provider_write", "s1", {"n": 1}, cooldown_s=0, now=now, dedupe_key="p:k1"
    )
    same, again = await jobs.add("provider_write", "s1", {"n": 2}, cooldown_s=0, now=now, dedupe_key="p:k1")
    other, other_created = await jobs.add(
        "provider_write", "s1", {}, cooldown_s=0, now=now, dedupe_key="p:k2"
    )
    session, session_created = await jobs.add("compress", "s1", {}, cooldown_s=0, now=now)
    assert created and not again and other_created and session_created
    assert same.id == first.id and same.payload == {"n": 1}
    assert (first.session_id, first.dedupe_key, session.dedupe_key) == ("s1", "p:k1", None)
    assert [j.id for j in await jobs.find(session_id="s1")] == [first.id, other.id, session.id]
    assert [j.id for j in await jobs.find(dedupe_key="p:k2")] == [other.id]
    assert [j.id for j in await jobs.find(kind="provider_write", dedupe_key="p:k1")] == [first.id]
    # A key is single flight while queued or running only: once done it may be queued again
    # (erasing a person twice sends the delete twice; the provider-write sink skips done keys).
    assert await jobs.claim(["provider_write"], now) is not None
    await jobs.settle(first.id, JobState.DONE, now=now)
    redo, redo_created = await jobs.add("provider_write", "s1", {}, cooldown_s=0, now=now, dedupe_key="p:k1")
    assert redo_created and redo.id != first.id


async def test_a_keyed_job_neither_waits_for_nor_holds_its_session(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    compress, _ = await jobs.add("compress", "s1", {}, cooldown_s=0, now=now)
    write1, _ = await jobs.add("provider_write", "s1", {}, cooldown_s=0, now=now, dedupe_key="p:k1")
    write2, _ = await jobs.add("provider_write", "s1", {}, cooldown_s=0, now=now, dedupe_key="p:k2")
    review, _ = await jobs.add("review", "s1", {}, cooldown_s=0, now=now)
    claimed = [await jobs.claim(KEYED, now) for _ in range(4)]
    # s1's compression runs; both writes of s1 run beside it; s1's review waits its turn.
    assert [j.id if j else None for j in claimed] == [compress.id, write1.id, write2.id, None]
    await jobs.settle(compress.id, JobState.DONE, now=now)
    nxt = await jobs.claim(KEYED, now)  # the writes still running do not hold s1
    assert nxt is not None and nxt.id == review.id
    assert await jobs.outstanding(KEYED, now) == 3


async def test_after_a_failure_a_new_job_of_the_key_waits_out_the_cooldown(backend: Backend) -> None:
    jobs, now = backend.jobs, backend.clock.ts()
    job, _ = await jobs.add("provider_write", "s1", {}, cooldown_s=0, now=now, dedupe_key="p:k1")
    assert await jobs.claim(["provider_write"], now) is not None
    await jobs.settle(job.id, JobState.FAILED, now=now + 1, error="down")
    fresh, created = await jobs.add(
        "provider_write", "s1", {}, cooldown_s=300, now=now + 2, dedupe_key="p:k1"
    )
    assert created and fresh.not_before == now + 1 + 300
    # Another key of the same session is not held back by that failure.
    other, _ = await jobs.add("provider_write", "s1", {}, cooldown_s=300, now=now + 2, dedupe_key="p:k2")
    assert other.not_before == now + 2
