"""The background worker queue: jobs persisted in ``state.db``, run by asyncio tasks.

The gateway hands work here (``JobSink``): compression after a reply that crossed the
threshold, a memory review when a nudge is due, the end-of-session flush. A job row
moves through::

    queued ──claim──▶ running ──▶ done
       ▲                 │
       └── retry later ◀─┴──▶ failed (attempts exhausted; the error is kept)

* **Single flight.** At most one queued or running job per (session, kind) — a partial
  unique index enforces it; ``enqueue`` of a duplicate returns the existing job (a
  second compression request while one runs is merged: the running one picks up
  whatever arrived meanwhile).
* **One job per session at a time.** The claim skips sessions that already have a job
  running, so flush, review and compression of one conversation never overlap.
* **Independent writes** (provider writes, ``provider_writes.py``) carry a
  ``dedupe_key``: single flight per key instead of per (session, kind), and they neither
  wait for their session's running job nor hold the session while they run.
* **Bounded concurrency** (``worker.concurrency``) over sessions.
* **Retries** with a per-kind backoff schedule (compression: 60 → 300 → 900 s) kept in
  the row's ``not_before``, so a cooldown survives a restart; after
  ``worker.max_attempts`` the job is failed with its error. A new job of a kind whose
  last job for the session failed starts after the same cooldown.
* **Crash recovery.** On start, jobs left ``running`` by a dead process are queued
  again (handlers are idempotent and record progress in the row's ``checkpoint``);
  ``done`` is recorded in the same row, so a finished job never runs twice.
* **Budgets.** A handler whose model request the budget gate refused (``OverBudget``:
  its person, or the whole bot, is at a cap) is queued again for the reset, with its
  attempt given back: background work waits for the cap, it is not lost.
* **Graceful shutdown.** ``stop`` takes no new job, lets running ones finish for
  ``worker.drain_timeout_s``, then cancels them (they are queued again, without using
  an attempt).

Handlers are registered by kind; a job of a kind with no handler waits in the queue
(a newer version may have written it). All tasks belong to the queue. The rows are
kept by a ``JobStorage`` (``store.py``; ``JobStore`` on ``state.db``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram

from mnemo.gateway.config import WorkerSettings
from mnemo.gateway.errors import OverBudget
from mnemo.gateway.jobs.store import Job, JobState, JobStorage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics

__all__ = ["DEFAULT_BACKOFF", "Handler", "Job", "JobQueue", "JobRun", "JobState"]

log = get_logger(__name__)

DEFAULT_BACKOFF: tuple[float, ...] = (10.0, 60.0, 300.0, 900.0)
DONE_RETENTION_S = 30 * 86_400  # finished rows are kept a month for /status and debugging


class JobRun:
    """Handed to a handler with its job: progress it records survives a crash, so a
    re-run can skip the steps already done (``checkpoint``)."""

    def __init__(self, queue: JobQueue, job: Job) -> None:
        self._queue = queue
        self.job = job
        self.checkpoint: dict[str, Any] = dict(job.checkpoint)

    async def save(self, **values: Any) -> None:
        self.checkpoint.update(values)
        await self._queue._save_checkpoint(self.job.id, self.checkpoint)


Handler = Callable[[Job, JobRun], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Kind:
    handler: Handler
    backoff: tuple[float, ...]

    def delay(self, attempts: int) -> float:
        return self.backoff[min(attempts, len(self.backoff)) - 1] if self.backoff else 0.0


class _Stats:
    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def record(self, kind: str, seconds: float, ok: bool) -> None:
        target = self.done if ok else self.failed
        target[kind] = target.get(kind, 0) + 1
        if ok:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds


class JobQueue:
    """Implements the gateway's ``JobSink``. ``start``/``stop`` are idempotent."""

    def __init__(
        self,
        store: JobStorage,
        settings: WorkerSettings,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        poll_s: float = 1.0,
    ) -> None:
        self.store = store
        self.settings = settings
        self._clock = clock
        self._poll_s = poll_s
        self._kinds: dict[str, _Kind] = {}
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: dict[int, asyncio.Task[None]] = {}
        self._stats = _Stats()
        self._duration: Histogram | None = None
        self._outcomes: Counter | None = None
        if metrics is not None:
            r = metrics.registry
            self._duration = Histogram(
                "mnemo_job_duration_seconds",
                "Background job run time, by kind",
                ["kind"],
                buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
                registry=r,
            )
            self._outcomes = Counter(
                "mnemo_jobs", "Background job runs by kind and outcome", ["kind", "outcome"], registry=r
            )

    # --- configuration --------------------------------------------------------------
    def register(self, kind: str, handler: Handler, *, backoff: Sequence[float] = DEFAULT_BACKOFF) -> None:
        if kind in self._kinds:
            raise ValueError(f"a handler for {kind!r} is already registered")
        self._kinds[kind] = _Kind(handler, tuple(backoff))
        self._wake.set()

    # --- lifecycle ------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._dispatcher is not None

    async def start(self) -> None:
        if self._dispatcher is not None:
            return
        requeued, failed = await self.store.recover(
            self._clock(), max_attempts=self.settings.max_attempts, retention_s=DONE_RETENTION_S
        )
        if requeued or failed:
            log.info("jobs_recovered", requeued=requeued, failed=failed)
        self._dispatcher = asyncio.create_task(self._dispatch(), name="job-dispatcher")

    async def stop(self) -> None:
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is None:
            return
        dispatcher.cancel()
        await asyncio.gather(dispatcher, return_exceptions=True)
        running = list(self._running.values())
        if running:
            done, pending = await asyncio.wait(running, timeout=self.settings.drain_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("jobs_cancelled_at_shutdown", count=len(pending))
                await asyncio.gather(*pending, return_exceptions=True)

    async def __aenter__(self) -> JobQueue:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- the JobSink port -----------------------------------------------------------
    async def enqueue(
        self,
        kind: str,
        session_id: str,
        payload: Mapping[str, Any] | None = None,
        *,
        dedupe_key: str | None = None,
    ) -> Job:
        """Persist a job, or return the queued/running one of the same (session, kind) —
        of the same ``dedupe_key`` when one is given."""
        cooldown = self._kinds[kind].backoff[-1] if kind in self._kinds and self._kinds[kind].backoff else 0.0
        job, created = await self.store.add(
            kind, session_id, payload or {}, cooldown_s=cooldown, now=self._clock(), dedupe_key=dedupe_key
        )
        if created:
            log.info("job_enqueued", kind=kind, session=session_id, job=job.id)
            self._wake.set()
        else:
            log.debug("job_merged", kind=kind, session=session_id, job=job.id, state=str(job.state))
        return job

    async def retry(self, job_id: int) -> Job:
        """Queue a failed job again, due now (the operator asked: no failure cooldown).
        The failed row keeps its error; the new row runs with the same kind, session
        and payload. Raises ``ValueError`` for a job that is not failed."""
        job = await self.store.get(job_id)
        if job is None:
            raise ValueError(f"no job {job_id}")
        if job.state is not JobState.FAILED:
            raise ValueError(
                f"job {job_id} is {job.state.value}, not failed: only a failed job can be retried"
            )
        again, created = await self.store.add(
            job.kind,
            job.session_id,
            job.payload,
            cooldown_s=0.0,
            now=self._clock(),
            dedupe_key=job.dedupe_key,
        )
        log.info("job_retried", kind=job.kind, job=job_id, new_job=again.id, created=created)
        self._wake.set()
        return again

    async def depth(self) -> int:
        """Jobs waiting or running."""
        counts = await self.store.counts()
        return counts.get(JobState.QUEUED, 0) + counts.get(JobState.RUNNING, 0)

    async def status_line(self) -> str:
        counts = await self.counts()
        line = (
            f"Background jobs: {counts.get('queued', 0)} queued, {counts.get('running', 0)} running, "
            f"{counts.get('failed', 0)} failed"
        )
        stats = self._stats
        kinds = sorted(set(stats.done) | set(stats.failed))
        if kinds:
            parts = []
            for kind in kinds:
                n = stats.done.get(kind, 0)
                avg = f", avg {stats.seconds.get(kind, 0.0) / n:.1f} s" if n else ""
                failed = f", {stats.failed[kind]} failed" if stats.failed.get(kind) else ""
                parts.append(f"{kind} {n} done{avg}{failed}")
            line += " · since start: " + "; ".join(parts)
        return line

    # --- inspection -----------------------------------------------------------------
    async def counts(self) -> dict[str, int]:
        return await self.store.counts()

    async def get(self, job_id: int) -> Job | None:
        return await self.store.get(job_id)

    async def jobs(
        self, *, session_id: str | None = None, kind: str | None = None, dedupe_key: str | None = None
    ) -> list[Job]:
        """Jobs in creation order, optionally of one session, kind and/or dedupe key."""
        return await self.store.find(session_id=session_id, kind=kind, dedupe_key=dedupe_key)

    def wake(self) -> None:
        """Look for due jobs now (after a clock change in tests, or new handlers)."""
        self._wake.set()

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Until nothing is running and no registered job is due (tests, benchmarks)."""

        kinds = sorted(self._kinds)
        if not kinds:
            return

        async def idle() -> bool:
            if self._running:
                return False
            # A claimed job is 'running' in the table a moment before its task exists.
            busy = await self.store.outstanding(kinds, self._clock())
            return busy == 0 and not self._running

        deadline = time.monotonic() + timeout
        while not await idle():
            if time.monotonic() > deadline:
                raise TimeoutError("the job queue did not become idle")
            await asyncio.sleep(0.02)

    # --- running --------------------------------------------------------------------
    async def _next_due(self) -> float | None:
        """The ``not_before`` of the earliest runnable job, or None."""
        kinds = sorted(self._kinds)
        if not kinds:
            return None
        return await self.store.next_due(kinds)

    async def _claim(self) -> Job | None:
        kinds = sorted(self._kinds)
        if not kinds:
            return None
        return await self.store.claim(kinds, self._clock())

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            self._wake.clear()
            claim = asyncio.ensure_future(self._claim())
            try:
                # Shielded: a claim committed while stop() cancels us is given back.
                job = await asyncio.shield(claim)
            except asyncio.CancelledError:
                self._slots.release()
                taken = await claim
                if taken is not None:
                    await self._requeue(taken.id)
                raise
            except Exception:  # loop boundary: a database hiccup must not end the worker
                self._slots.release()
                log.exception("job_claim_failed")
                await asyncio.sleep(self._poll_s)
                continue
            if job is None:
                self._slots.release()
                await self._sleep_until_due()
                continue
            task = asyncio.create_task(self._execute(job), name=f"job:{job.kind}:{job.id}")
            self._running[job.id] = task
            task.add_done_callback(functools.partial(self._finished, job.id))

    def _finished(self, job_id: int, _task: asyncio.Task[None]) -> None:
        self._running.pop(job_id, None)
        self._slots.release()
        self._wake.set()  # its session may have another job waiting

    async def _sleep_until_due(self) -> None:
        timeout = self._poll_s
        try:
            due = await self._next_due()
        except Exception:  # loop boundary: fall back to polling
            log.exception("job_due_query_failed")
            due = None
        if due is not None:
            timeout = min(timeout, max(0.0, due - self._clock()))
        if timeout <= 0 and due is not None:
            # Due now but not claimable (its session is busy): wait for a job to finish.
            timeout = self._poll_s
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel.
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _execute(self, job: Job) -> None:
        kind = self._kinds[job.kind]
        started = time.monotonic()
        run = JobRun(self, job)
        try:
            await kind.handler(job, run)
        except asyncio.CancelledError:
            # Shutdown: not the job's fault, so the attempt is given back.
            await asyncio.shield(self._requeue(job.id))
            raise
        except OverBudget as e:
            # At a spending cap: not the job's fault either; it waits for the reset.
            await self._requeue(job.id)
            await self._mark(
                job.id,
                JobState.QUEUED,
                error=f"waiting for the budget: {e}",
                not_before=self._clock() + e.retry_after_s,
            )
            log.info(
                "job_waits_for_budget",
                kind=job.kind,
                job=job.id,
                cap=e.cap,
                resets_at=e.resets_at.isoformat(),
            )
            self._observe(job.kind, time.monotonic() - started, "retry")
            return
        except Exception as e:  # loop boundary: every failure is recorded on the job row
            elapsed = time.monotonic() - started
            error = f"{type(e).__name__}: {e}"
            if job.attempts >= self.settings.max_attempts:
                log.error(
                    "job_failed",
                    kind=job.kind,
                    job=job.id,
                    session=job.session_id,
                    attempts=job.attempts,
                    error=error,
                )
                await self._mark(job.id, JobState.FAILED, error=error)
                self._observe(job.kind, elapsed, "failed")
            else:
                delay = kind.delay(job.attempts)
                # A server's Retry-After (memory.durable.RetryLater) wins over the schedule.
                retry_after = getattr(e, "retry_after_s", None)
                if isinstance(retry_after, (int, float)) and retry_after >= 0:
                    delay = float(retry_after)
                log.warning(
                    "job_retry", kind=job.kind, job=job.id, attempts=job.attempts, delay_s=delay, error=error
                )
                await self._mark(job.id, JobState.QUEUED, error=error, not_before=self._clock() + delay)
                self._observe(job.kind, elapsed, "retry")
            return
        elapsed = time.monotonic() - started
        await self._mark(job.id, JobState.DONE)
        self._observe(job.kind, elapsed, "done")
        log.info("job_done", kind=job.kind, job=job.id, session=job.session_id, seconds=round(elapsed, 3))

    def _observe(self, kind: str, seconds: float, outcome: str) -> None:
        if outcome != "retry":
            self._stats.record(kind, seconds, outcome == "done")
        if self._duration is not None and outcome == "done":
            self._duration.labels(kind).observe(seconds)
        if self._outcomes is not None:
            self._outcomes.labels(kind, outcome).inc()

    async def _mark(
        self, job_id: int, state: JobState, *, error: str | None = None, not_before: float | None = None
    ) -> None:
        await self.store.settle(job_id, state, now=self._clock(), error=error, not_before=not_before)

    async def _requeue(self, job_id: int) -> None:
        await self.store.give_back(job_id, self._clock())

    async def _save_checkpoint(self, job_id: int, checkpoint: Mapping[str, Any]) -> None:
        await self.store.save_checkpoint(job_id, checkpoint, self._clock())
