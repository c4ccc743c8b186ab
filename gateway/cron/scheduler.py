"""Running cron jobs on time: APScheduler in the gateway process, the runs through the
same pipeline as a user message.

``CronScheduler`` mirrors the active jobs of ``cron_jobs`` into an APScheduler 3.x
``AsyncIOScheduler`` (in-memory job store; state.db stays the only truth):

* A job is added to APScheduler only when it is not there yet, with the stored
  ``next_run_at`` as its next run time — never re-added with ``replace_existing`` at
  start, which would recompute the next run and silently throw a missed one away.
* ``max_instances=1``, and ``coalesce`` / ``misfire_grace_time`` set explicitly from
  ``cron.coalesce`` / ``cron.misfire_grace_s`` (APScheduler's own grace default is one
  second). So a job whose time passed while the bot was down runs **once** at start if
  it is at most ``misfire_grace_s`` late (with ``coalesce``, several missed runs of a
  recurring job make one run); later than that it is skipped, logged
  (``cron_run_missed``) and recorded as a missed run; a recurring job then waits for
  its next time, a one-off job is done.
* Every ``cron.poll_s`` the scheduler re-reads ``cron_jobs`` and reconciles (jobs added,
  changed or removed by ``mnemo cron`` in another process are picked up), and takes
  run-now requests.
* A run claims its slot in the database first (``CronStore.claim_scheduled``), so two
  processes with a scheduler never run the same slot twice.

``CronRunner`` runs one claimed job: a synthetic ``InboundMessage`` with
``agent_context=cron`` (the target chat, the job's user, a message id unique per run)
goes through ``Gateway.run_scheduled`` — a fresh session, the cron hint in its system
prompt, no cronjob tool, personal memory read-only — inside the budget gate's
``turn`` for the job's user (``gateway/budgets/gate.py``): a run whose user (or the
whole bot) is at a spending cap is skipped, recorded as ``skipped`` (``mnemo cron
list`` counts them) and makes no model request; the chat gets one note per job and
reset saying so. The operator's group jobs speak for nobody and meet the global cap
only. The reply is queued in the outbox
in the same transaction that finishes the run (a reply of exactly ``[SILENT]``, or a
failed run, queues nothing), so an interrupted run has delivered nothing and can run
again after a restart (if still within the grace) without a second message. Before
each run the target chat's authorization is checked; a job whose chat is no longer
authorized is paused, logged, and the admins get a note.

APScheduler keeps time on the wall clock; ``clock`` (injectable) is what mnemo itself
records and decides with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from mnemo.gateway.budgets.gate import Refusal
from mnemo.gateway.config import CronSettings
from mnemo.gateway.cron.schedules import local_time, utc, zone
from mnemo.gateway.cron.service import OPERATOR_USER, CronJobs
from mnemo.gateway.cron.store import Claimed, CronJob, CronRepository, JobSource, JobState, RunState
from mnemo.gateway.events import SILENT, ChatType, InboundMessage, OutboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.agent import TurnResult
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import Clock, utc_now

log = get_logger(__name__)

# A 'running' run whose process still lives is left alone at start-up, unless it is
# older than this (its pid may have been reused).
STALE_RUN = timedelta(hours=6)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_text(job: CronJob, now: datetime) -> str:
    """The user turn of a run: what the job is, the time where it is scheduled, the prompt."""
    return (
        f"[Scheduled job {job.id}: {job.schedule.describe()}; "
        f"it is now {local_time(now, job.schedule.timezone)}]\n{job.prompt}"
    )


def job_message(job: CronJob, run_id: int, now: datetime) -> InboundMessage:
    group = job.target.chat_type is ChatType.GROUP
    return InboundMessage(
        platform=job.target.platform,
        chat_id=job.target.chat_id,
        thread_id=job.target.thread_id,
        chat_type=job.target.chat_type,
        user_id=job.user_id,
        user_name="scheduled job",
        message_id=f"cron-{job.id}-{run_id}",
        text=run_text(job, now),
        received_at=now,
        agent_context=AgentContext.CRON,
        # What a group job writes, the whole channel reads: no member's profile goes in.
        shared_room=group,
    )


class ScheduledTurns(Protocol):
    """What a cron run needs from the pipeline (``Gateway`` implements it)."""

    async def run_scheduled(self, msg: InboundMessage, *, deliver: bool = True) -> TurnResult: ...

    async def notify_admins(self, text: str) -> None: ...

    def wake_delivery(self) -> None: ...


class RunAccess(Protocol):
    """Whether a job's chat and user are still allowed (``AccessControl``)."""

    def chat_allowed(self, msg: InboundMessage) -> bool: ...

    async def user_allowed(self, user: UserRef) -> bool: ...

    def is_admin(self, platform: str, user_id: str) -> bool: ...


class RunBudget(Protocol):
    """The budget gate (``BudgetGate.turn``): entered around a run, it yields None to go
    on — admitting the run's model requests — or the refusal."""

    def turn(
        self, user: UserRef, *, admin: bool, topic: str = ""
    ) -> AbstractAsyncContextManager[Refusal | None]: ...


class CronRunner:
    def __init__(
        self,
        turns: ScheduledTurns,
        access: RunAccess,
        store: CronRepository,
        *,
        budget: RunBudget,
        clock: Clock = utc_now,
    ) -> None:
        self.turns = turns
        self.access = access
        self.store = store
        self.budget = budget
        self.clock = clock

    async def run(self, claimed: Claimed) -> RunState:
        job, run_id = claimed.job, claimed.run_id
        job_done = not claimed.manual and not job.schedule.recurring
        msg = job_message(job, run_id, self.clock())
        reason = await self._unauthorized(job, msg)
        if reason is not None:
            await self._pause(job, run_id, reason)
            return RunState.PAUSED
        log.info("cron_run_started", job=job.id, run=run_id, target=str(job.target), manual=claimed.manual)
        user = UserRef(job.target.platform, job.user_id)
        admin = _operator_group_job(job) or self.access.is_admin(user.platform, user.user_id)
        try:
            async with self.budget.turn(user, admin=admin, topic=f"cron:{job.id}") as refusal:
                if refusal is None:
                    result = await self.turns.run_scheduled(msg, deliver=False)
            if refusal is not None:
                return await self._skip(job, run_id, refusal, job_done=job_done)
        except asyncio.CancelledError:
            await self.store.mark_run(run_id, RunState.INTERRUPTED, self.clock(), "stopped during the run")
            raise
        except Exception as e:  # loop boundary: one broken run never stops the scheduler
            log.exception("cron_run_error", job=job.id, run=run_id)
            await self.store.finish_run(
                run_id, RunState.FAILED, self.clock(), detail=f"{type(e).__name__}: {e}", job_done=job_done
            )
            return RunState.FAILED
        delivery = None
        if result.failed:
            state, detail = RunState.FAILED, result.reply[:200]
        elif result.reply.strip() == SILENT:
            state, detail = RunState.SILENT, None
        else:
            state, detail = RunState.DELIVERED, None
            delivery = OutboundMessage(
                chat=job.target.chat,
                text=result.reply,
                mention_user_id=None if job.user_id == OPERATOR_USER else job.user_id,
                scheduled=True,
            )
        outbox_id = await self.store.finish_run(
            run_id,
            state,
            self.clock(),
            detail=detail,
            session_id=result.session_id,
            delivery=delivery,
            job_done=job_done,
        )
        if outbox_id is not None:
            self.turns.wake_delivery()
        log.info("cron_run_finished", job=job.id, run=run_id, result=state.value, session=result.session_id)
        return state

    async def _skip(self, job: CronJob, run_id: int, refusal: Refusal, *, job_done: bool) -> RunState:
        """Over budget: no model request; the run is recorded as skipped, and the chat is
        told once per job and reset."""
        log.info(
            "cron_run_skipped_over_budget", job=job.id, run=run_id, cap=refusal.cap, notified=refusal.notify
        )
        delivery = None
        if refusal.notify:
            then = (
                "It will not run again (it was a one-off job)."
                if job_done
                else f"Its runs go ahead again after the reset: {refusal.resets}."
            )
            delivery = OutboundMessage(
                chat=job.target.chat,
                text=f"Skipped scheduled job {job.id} ({job.schedule.describe()}): {refusal.what} is used up. {then}",
                mention_user_id=None if job.user_id == OPERATOR_USER else job.user_id,
                scheduled=True,
            )
        outbox_id = await self.store.finish_run(
            run_id,
            RunState.SKIPPED,
            self.clock(),
            detail=f"over budget ({refusal.cap}) until {refusal.resets_at.isoformat()}",
            delivery=delivery,
            job_done=job_done,
        )
        if outbox_id is not None:
            self.turns.wake_delivery()
        return RunState.SKIPPED

    async def _unauthorized(self, job: CronJob, msg: InboundMessage) -> str | None:
        access = self.access
        if not access.chat_allowed(msg):
            return f"the bot no longer works in {job.target}"
        # A group job of the operator's speaks for nobody; any other run speaks for its
        # user, who must still be allowed (in a DM, that user is the chat).
        if not _operator_group_job(job) and not await access.user_allowed(
            UserRef(job.target.platform, job.user_id)
        ):
            return f"{job.target.platform}:{job.user_id} is no longer authorized"
        return None

    async def _pause(self, job: CronJob, run_id: int, reason: str) -> None:
        now = self.clock()
        await self.store.set_state(job.id, JobState.PAUSED, None, now, result=f"paused: {reason}")
        await self.store.mark_run(run_id, RunState.PAUSED, now, reason)
        log.warning("cron_job_paused_unauthorized", job=job.id, target=str(job.target), reason=reason)
        note = (
            f"Scheduled job {job.id} ({job.schedule.describe()}) for {job.target} was paused: {reason}. "
            f"Once that is fixed, /cron resume {job.id} — or /cron remove {job.id}."
        )
        await self.turns.notify_admins(note)


def _operator_group_job(job: CronJob) -> bool:
    """A group job the operator set up (CLI, config.yaml): it speaks for nobody."""
    return job.source in (JobSource.CLI, JobSource.CONFIG) and job.user_id == OPERATOR_USER


@dataclass(frozen=True, slots=True)
class _Seen:
    """What the scheduler handed to APScheduler for a job: compared with the store."""

    rev: int
    next_run_at: datetime | None


class CronScheduler:
    def __init__(
        self,
        jobs: CronJobs,
        runner: CronRunner,
        settings: CronSettings,
        *,
        clock: Clock = utc_now,
        drain_s: float = 10.0,
    ) -> None:
        self.jobs = jobs
        self.store = jobs.store
        self.runner = runner
        self.settings = settings
        self.clock = clock
        self.drain_s = drain_s
        self.pid = os.getpid()
        self._aps: AsyncIOScheduler | None = None
        self._seen: dict[str, _Seen] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._poll: asyncio.Task[None] | None = None
        jobs.on_change(self.poke)

    # --- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        if self._aps is not None:
            return
        self._aps = AsyncIOScheduler(
            timezone=zone(self.jobs.default_timezone),
            job_defaults={
                "coalesce": self.settings.coalesce,
                "misfire_grace_time": self.settings.misfire_grace_s,
                "max_instances": 1,
            },
        )
        self._aps.add_listener(self._on_missed, EVENT_JOB_MISSED)
        self._aps.add_listener(self._on_busy, EVENT_JOB_MAX_INSTANCES)
        self._aps.start()
        await self._recover()
        await self.reconcile()
        self._poll = asyncio.create_task(self._poll_loop(), name="cron-poll")
        log.info(
            "cron_scheduler_started",
            jobs=len(self._seen),
            grace_s=self.settings.misfire_grace_s,
            coalesce=self.settings.coalesce,
        )

    async def stop(self) -> None:
        aps, self._aps = self._aps, None
        if aps is None:
            return
        aps.pause()  # no new runs; the ones in flight may finish within drain_s
        poll, self._poll = self._poll, None
        if poll is not None:
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
        if self._running:
            await asyncio.wait(set(self._running), timeout=self.drain_s)
        pending = self._running | self._tasks
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        aps.shutdown(wait=False)
        await asyncio.sleep(0)  # AsyncIOScheduler.shutdown runs on the loop's next turn
        self._seen.clear()

    def scheduled(self) -> dict[str, datetime | None]:
        """Job id → next run time, as APScheduler holds them now (for /status and tests)."""
        if self._aps is None:
            return {}
        return {j.id: utc(j.next_run_time) if j.next_run_time else None for j in self._aps.get_jobs()}

    def poke(self) -> None:
        """Re-read the jobs now (called after changes made in this process)."""
        self._wake.set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poll_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation
            # that arrives as the event is set, and stop() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.reconcile()
                await self._take_requested()
            except Exception:  # loop boundary: keep polling
                log.exception("cron_poll_error")

    # --- mirroring the store into APScheduler ----------------------------------------
    async def reconcile(self) -> None:
        aps = self._aps
        if aps is None:
            return
        wanted = {j.id: j for j in await self.store.all() if j.state is JobState.ACTIVE and j.next_run_at}
        for job_id in list(self._seen):
            if job_id not in wanted:
                self._unschedule(job_id)
        for job in wanted.values():
            seen = self._seen.get(job.id)
            if seen == _Seen(job.rev, job.next_run_at):
                continue
            if seen is not None:
                self._unschedule(job.id)
            self._schedule(job)

    def _schedule(self, job: CronJob) -> None:
        assert self._aps is not None
        try:
            trigger = job.schedule.trigger()
        except Exception as e:
            log.error("cron_job_unschedulable", job=job.id, error=f"{type(e).__name__}: {e}")
            return
        self._aps.add_job(
            self._fire,
            trigger=trigger,
            args=(job.id,),
            id=job.id,
            name=f"cron job {job.id}",
            next_run_time=job.next_run_at,
            misfire_grace_time=self.settings.misfire_grace_s,
            coalesce=self.settings.coalesce,
            max_instances=1,
        )
        self._seen[job.id] = _Seen(job.rev, job.next_run_at)

    def _unschedule(self, job_id: str) -> None:
        self._seen.pop(job_id, None)
        if self._aps is not None:
            with contextlib.suppress(JobLookupError):
                self._aps.remove_job(job_id)

    def _aps_next(self, job_id: str) -> datetime | None:
        job = self._aps.get_job(job_id) if self._aps is not None else None
        return utc(job.next_run_time) if job is not None and job.next_run_time is not None else None

    # --- runs -------------------------------------------------------------------------
    async def _fire(self, job_id: str) -> None:
        """APScheduler's job function: the slot is due (and within the grace)."""
        seen = self._seen.get(job_id)
        if seen is None:
            return
        new_next = self._aps_next(job_id)
        claimed = await self.store.claim_scheduled(
            job_id, seen.rev, seen.next_run_at, new_next, self.clock(), self.pid
        )
        if claimed is None:
            log.info(
                "cron_slot_not_claimed", job=job_id, reason="changed meanwhile, or run by another process"
            )
            self.poke()
            return
        self._seen[job_id] = _Seen(claimed.job.rev, new_next)
        await self._run(claimed)

    async def _run(self, claimed: Claimed) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            await self.runner.run(claimed)
            self.poke()  # a run may have paused or finished its job
        except asyncio.CancelledError:
            # The top of a run task being stopped by ``stop``: the runner has recorded
            # the run as interrupted; ending quietly keeps APScheduler's log clean.
            log.info("cron_run_interrupted", job=claimed.job.id, run=claimed.run_id)
        finally:
            self._running.discard(task)

    def _on_missed(self, event: JobExecutionEvent) -> None:
        self._spawn(self._record_missed(event.job_id, utc(event.scheduled_run_time)))

    def _on_busy(self, event: JobSubmissionEvent) -> None:
        log.warning("cron_run_skipped_still_running", job=event.job_id)

    async def _record_missed(self, job_id: str, slot: datetime) -> None:
        seen = self._seen.get(job_id)
        job = await self.store.get(job_id)
        if seen is None or job is None:
            return
        now = self.clock()
        late_s = int((now - slot).total_seconds())
        detail = (
            f"missed the run of {local_time(slot, job.schedule.timezone)}: {late_s} s late, more than the "
            f"misfire grace of {self.settings.misfire_grace_s} s"
        )
        log.warning(
            "cron_run_missed",
            job=job_id,
            scheduled_for=slot.isoformat(),
            late_s=late_s,
            grace_s=self.settings.misfire_grace_s,
        )
        new_next = self._aps_next(job_id)
        if await self.store.record_missed(job_id, seen.rev, seen.next_run_at, new_next, now, detail):
            self._seen[job_id] = _Seen(seen.rev + int(new_next is None), new_next)

    async def _take_requested(self) -> None:
        for run in await self.store.open_runs():
            if run.state is RunState.REQUESTED:
                claimed = await self.store.claim_run(run.id, RunState.REQUESTED, None, self.clock(), self.pid)
                if claimed is not None:
                    self._spawn(self._run(claimed))

    async def _recover(self) -> None:
        """Runs left open by a process that stopped or died: run again when still within
        the grace (nothing of them was delivered), otherwise recorded as missed."""
        now = self.clock()
        grace = timedelta(seconds=self.settings.misfire_grace_s)
        for run in await self.store.open_runs():
            if run.state is RunState.REQUESTED:
                continue  # taken by the poll loop
            if (
                run.state is RunState.RUNNING
                and run.pid is not None
                and run.pid != self.pid
                and _alive(run.pid)
                and run.started_at is not None
                and now - run.started_at < STALE_RUN
            ):
                continue  # another live process is running it
            slot = run.scheduled_for or run.started_at or now
            job = await self.store.get(run.job_id)
            if job is not None and job.state is JobState.ACTIVE and now - slot <= grace:
                claimed = await self.store.claim_run(run.id, run.state, run.pid, now, self.pid)
                if claimed is not None:
                    log.info("cron_run_resumed", job=run.job_id, run=run.id)
                    self._spawn(self._run(claimed))
                continue
            detail = "interrupted, and too late to run again (misfire grace)"
            log.warning("cron_run_lost", job=run.job_id, run=run.id, scheduled_for=slot.isoformat())
            one_off = job is not None and not job.schedule.recurring and run.trigger == "schedule"
            await self.store.finish_run(run.id, RunState.MISSED, now, detail=detail, job_done=one_off)
