"""Cron jobs and their runs in ``state.db`` (tables ``cron_jobs`` and ``cron_runs``).

Every change of a job goes through this store, whichever process makes it (the gateway,
``mnemo cron`` in another terminal). Three rules make several processes safe:

* **Definition and state changes bump ``rev``.** A running scheduler compares the
  ``rev`` and ``next_run_at`` it scheduled with the stored ones every ``cron.poll_s``
  and re-schedules what differs.
* **A scheduled run is claimed by compare-and-swap on ``next_run_at``**
  (``claim_scheduled``): the run row is inserted and the job's next run advanced in one
  transaction, only if the job still has the next run the scheduler saw. Two schedulers
  on one profile therefore never both run the same slot.
* **A run is finished together with its delivery** (``finish_run``): the run row, the
  job's last result and the outbox row are written in one transaction. A run that was
  interrupted (crash, shutdown) has therefore delivered nothing and may run again.
  The delivery is queued through the outbox's own port (``OutboxWithin.enqueue_within``,
  handed this store's open transaction), never with the outbox's SQL.

The ports are ``CronJobRepository`` (definitions) and ``CronRunRepository`` (runs);
``CronRepository`` is both, and ``CronStore`` its SQLite implementation. Every backend
passes ``tests/contract/test_cron.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from mnemo.gateway.cron.schedules import Schedule, ScheduleKind
from mnemo.gateway.delivery.outbox import OutboxWithin
from mnemo.gateway.events import ChatRef, ChatType, OutboundMessage
from mnemo.memory.db import Database, inserted_id


class JobState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DONE = "done"


class JobSource(StrEnum):
    TOOL = "tool"
    COMMAND = "command"
    CLI = "cli"
    CONFIG = "config"
    ADMIN = "admin"  # the admin dashboard (/admin)


class RunState(StrEnum):
    REQUESTED = "requested"  # run-now from the CLI, waiting for a process to take it
    RUNNING = "running"
    DELIVERED = "delivered"
    SILENT = "silent"  # the reply was exactly [SILENT]
    FAILED = "failed"
    MISSED = "missed"  # later than the misfire grace: skipped
    INTERRUPTED = "interrupted"  # the process stopped or died during the run
    PAUSED = "paused"  # the target chat is no longer authorized; the job was paused
    SKIPPED = "skipped"  # its user (or the bot) was at a spending cap: no model request


@dataclass(frozen=True, slots=True)
class JobTarget:
    """The chat a job's result goes to (where it was created)."""

    platform: str
    chat_id: str
    chat_type: ChatType = ChatType.DM
    thread_id: str | None = None

    @property
    def chat(self) -> ChatRef:
        return ChatRef(self.platform, self.chat_id, self.thread_id)

    def __str__(self) -> str:
        if self.chat_type is ChatType.DM:
            return f"{self.platform}:{self.chat_id}"
        return f"{self.platform}:group:{self.chat_id}" + (f":{self.thread_id}" if self.thread_id else "")


@dataclass(frozen=True, slots=True)
class CronJob:
    id: str
    target: JobTarget
    user_id: str  # the run speaks for this user (whose USER.md a DM job reads)
    source: JobSource
    created_by: str
    prompt: str
    schedule: Schedule
    state: JobState
    next_run_at: datetime | None
    last_run_at: datetime | None
    last_result: str | None
    rev: int
    created_at: datetime

    @property
    def declared(self) -> bool:
        return self.source is JobSource.CONFIG


@dataclass(frozen=True, slots=True)
class CronRun:
    id: int
    job_id: str
    trigger: str
    state: RunState
    scheduled_for: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    pid: int | None
    session_id: str | None
    outbox_id: int | None
    detail: str | None


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def _job(r: sqlite3.Row | Mapping[str, Any]) -> CronJob:  # a PostgreSQL row too (storage_pg)
    created = _dt(r["created_at"])
    assert created is not None
    return CronJob(
        id=r["id"],
        target=JobTarget(r["platform"], r["chat_id"], ChatType(r["chat_type"]), r["thread_id"]),
        user_id=r["user_id"],
        source=JobSource(r["source"]),
        created_by=r["created_by"],
        prompt=r["prompt"],
        schedule=Schedule(ScheduleKind(r["schedule_kind"]), r["schedule"], r["timezone"], _dt(r["start_at"])),
        state=JobState(r["state"]),
        next_run_at=_dt(r["next_run_at"]),
        last_run_at=_dt(r["last_run_at"]),
        last_result=r["last_result"],
        rev=r["rev"],
        created_at=created,
    )


def _run(r: sqlite3.Row | Mapping[str, Any]) -> CronRun:
    return CronRun(
        id=r["id"],
        job_id=r["job_id"],
        trigger=r["trigger"],
        state=RunState(r["state"]),
        scheduled_for=_dt(r["scheduled_for"]),
        started_at=_dt(r["started_at"]),
        finished_at=_dt(r["finished_at"]),
        pid=r["pid"],
        session_id=r["session_id"],
        outbox_id=r["outbox_id"],
        detail=r["detail"],
    )


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run this process has taken and must finish (``CronStore.finish_run``)."""

    job: CronJob
    run_id: int
    manual: bool = False  # run-now: leaves the schedule (and a one-off's state) alone


class CronJobRepository(Protocol):
    """Job definitions. Called by ``CronJobs`` (the tool, ``/cron``, ``mnemo cron``,
    config sync) in any process; every change bumps ``rev``. Raises ``StoreError``."""

    async def insert(self, job: CronJob) -> bool:
        """False when the id is taken (the caller picks another)."""
        ...

    async def redefine(self, job: CronJob, now: datetime) -> None: ...

    async def get(self, job_id: str) -> CronJob | None: ...

    async def all(self) -> list[CronJob]: ...

    async def in_chat(self, target: JobTarget) -> list[CronJob]: ...

    async def set_state(
        self,
        job_id: str,
        state: JobState,
        next_run_at: datetime | None,
        now: datetime,
        result: str | None = None,
    ) -> bool: ...

    async def delete(self, job_id: str) -> bool:
        """Remove a job and its runs."""
        ...


class CronRunRepository(Protocol):
    """Runs. Called by the ``CronScheduler`` of each process and by ``mnemo cron run``.
    The ``claim_*`` methods are compare-and-swaps: of two processes racing for one slot
    or run, exactly one gets a ``Claimed``. Raises ``StoreError``."""

    async def claim_scheduled(
        self,
        job_id: str,
        rev: int,
        seen_next: datetime | None,
        new_next: datetime | None,
        now: datetime,
        pid: int,
    ) -> Claimed | None: ...

    async def record_missed(
        self,
        job_id: str,
        rev: int,
        seen_next: datetime | None,
        new_next: datetime | None,
        now: datetime,
        detail: str,
    ) -> bool: ...

    async def finish_run(
        self,
        run_id: int,
        state: RunState,
        now: datetime,
        *,
        detail: str | None = None,
        session_id: str | None = None,
        delivery: OutboundMessage | None = None,
        job_done: bool = False,
    ) -> int | None:
        """Close the run and queue ``delivery`` in one transaction; the outbox row id."""
        ...

    async def request_run(self, job_id: str, now: datetime) -> int: ...

    async def claim_run(
        self, run_id: int, seen_state: RunState, seen_pid: int | None, now: datetime, pid: int
    ) -> Claimed | None: ...

    async def open_runs(self) -> list[CronRun]:
        """Runs requested, running or interrupted, oldest first."""
        ...

    async def mark_run(
        self, run_id: int, state: RunState, now: datetime, detail: str | None = None
    ) -> None: ...

    async def get_run(self, run_id: int) -> CronRun | None: ...

    async def runs(self, job_id: str | None = None) -> list[CronRun]: ...

    async def count_runs(self, state: RunState) -> dict[str, int]:
        """Job id -> how many of its runs ended in ``state`` (jobs with none left out)."""
        ...


class CronRepository(CronJobRepository, CronRunRepository, Protocol):
    """The cron tables, as a storage backend implements them."""


class CronStore:
    """``CronRepository`` on ``state.db``; deliveries go through ``outbox`` (which must
    be on the same database: they share this store's write transaction)."""

    def __init__(self, db: Database, outbox: OutboxWithin) -> None:
        self.db = db
        self._outbox = outbox

    # --- jobs -------------------------------------------------------------------------
    async def insert(self, job: CronJob) -> bool:
        """False when the id is taken (the caller picks another)."""
        s = job.schedule

        def tx(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "INSERT INTO cron_jobs(id, platform, chat_id, chat_type, thread_id, user_id, source, created_by,"
                " prompt, schedule_kind, schedule, timezone, start_at, state, next_run_at, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                (
                    job.id,
                    job.target.platform,
                    job.target.chat_id,
                    job.target.chat_type.value,
                    job.target.thread_id,
                    job.user_id,
                    job.source.value,
                    job.created_by,
                    job.prompt,
                    s.kind.value,
                    s.value,
                    s.timezone,
                    _ts(s.start),
                    job.state.value,
                    _ts(job.next_run_at),
                    _ts(job.created_at),
                    _ts(job.created_at),
                ),
            )
            return cur.rowcount == 1

        return await self.db.write(tx)

    async def redefine(self, job: CronJob, now: datetime) -> None:
        """Replace a job's definition (a changed config.yaml entry), keeping its id."""
        s = job.schedule
        await self.db.write(
            lambda c: c.execute(
                "UPDATE cron_jobs SET platform=?, chat_id=?, chat_type=?, thread_id=?, user_id=?, prompt=?,"
                " schedule_kind=?, schedule=?, timezone=?, start_at=?, state=?, next_run_at=?, rev=rev+1,"
                " updated_at=? WHERE id=?",
                (
                    job.target.platform,
                    job.target.chat_id,
                    job.target.chat_type.value,
                    job.target.thread_id,
                    job.user_id,
                    job.prompt,
                    s.kind.value,
                    s.value,
                    s.timezone,
                    _ts(s.start),
                    job.state.value,
                    _ts(job.next_run_at),
                    _ts(now),
                    job.id,
                ),
            )
        )

    async def get(self, job_id: str) -> CronJob | None:
        r = await self.db.read(
            lambda c: c.execute("SELECT * FROM cron_jobs WHERE id = ?", (job_id,)).fetchone()
        )
        return None if r is None else _job(r)

    async def all(self) -> list[CronJob]:
        rows = await self.db.read(
            lambda c: c.execute("SELECT * FROM cron_jobs ORDER BY created_at, id").fetchall()
        )
        return [_job(r) for r in rows]

    async def in_chat(self, target: JobTarget) -> list[CronJob]:
        rows = await self.db.read(
            lambda c: c.execute(
                "SELECT * FROM cron_jobs WHERE platform = ? AND chat_id = ? AND thread_id IS ?"
                " ORDER BY created_at, id",
                (target.platform, target.chat_id, target.thread_id),
            ).fetchall()
        )
        return [_job(r) for r in rows]

    async def set_state(
        self,
        job_id: str,
        state: JobState,
        next_run_at: datetime | None,
        now: datetime,
        result: str | None = None,
    ) -> bool:
        def tx(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE cron_jobs SET state = ?, next_run_at = ?, rev = rev + 1, updated_at = ?,"
                " last_result = COALESCE(?, last_result) WHERE id = ?",
                (state.value, _ts(next_run_at), _ts(now), result, job_id),
            )
            return cur.rowcount == 1

        return await self.db.write(tx)

    async def delete(self, job_id: str) -> bool:
        return bool(
            await self.db.write(lambda c: c.execute("DELETE FROM cron_jobs WHERE id = ?", (job_id,)).rowcount)
        )

    # --- scheduled runs ---------------------------------------------------------------
    async def claim_scheduled(
        self,
        job_id: str,
        rev: int,
        seen_next: datetime | None,
        new_next: datetime | None,
        now: datetime,
        pid: int,
    ) -> Claimed | None:
        """Start the run of the slot ``seen_next``: advance the job to ``new_next`` and
        insert a running run row, only if the job is unchanged (module docstring)."""

        def tx(c: sqlite3.Connection) -> Claimed | None:
            cur = c.execute(
                "UPDATE cron_jobs SET next_run_at = ?, last_run_at = ? WHERE id = ? AND rev = ?"
                " AND state = 'active' AND next_run_at IS ?",
                (_ts(new_next), _ts(now), job_id, rev, _ts(seen_next)),
            )
            if cur.rowcount != 1:
                return None
            run = c.execute(
                "INSERT INTO cron_runs(job_id, trigger, state, scheduled_for, started_at, pid)"
                " VALUES (?, 'schedule', 'running', ?, ?, ?)",
                (job_id, _ts(seen_next), _ts(now), pid),
            )
            row = c.execute("SELECT * FROM cron_jobs WHERE id = ?", (job_id,)).fetchone()
            return Claimed(_job(row), inserted_id(run))

        return await self.db.write(tx)

    async def record_missed(
        self,
        job_id: str,
        rev: int,
        seen_next: datetime | None,
        new_next: datetime | None,
        now: datetime,
        detail: str,
    ) -> bool:
        """A slot later than the misfire grace: skipped, and recorded as such."""

        def tx(c: sqlite3.Connection) -> bool:
            done = new_next is None
            cur = c.execute(
                "UPDATE cron_jobs SET next_run_at = ?, last_result = ?,"
                " state = CASE WHEN ? THEN 'done' ELSE state END, rev = rev + ?"
                " WHERE id = ? AND rev = ? AND state = 'active' AND next_run_at IS ?",
                (_ts(new_next), detail, done, int(done), job_id, rev, _ts(seen_next)),
            )
            if cur.rowcount != 1:
                return False
            c.execute(
                "INSERT INTO cron_runs(job_id, trigger, state, scheduled_for, finished_at, detail)"
                " VALUES (?, 'schedule', 'missed', ?, ?, ?)",
                (job_id, _ts(seen_next), _ts(now), detail),
            )
            return True

        return await self.db.write(tx)

    async def finish_run(
        self,
        run_id: int,
        state: RunState,
        now: datetime,
        *,
        detail: str | None = None,
        session_id: str | None = None,
        delivery: OutboundMessage | None = None,
        job_done: bool = False,
    ) -> int | None:
        """Close a run, record the job's last result and queue its delivery — one
        transaction. Returns the outbox row id (None if nothing was queued, or the job
        was removed while it ran)."""

        def tx(c: sqlite3.Connection) -> int | None:
            row = c.execute("SELECT job_id FROM cron_runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None  # the job (and its runs) was removed meanwhile
            outbox_id = None
            if delivery is not None:
                outbox_id = self._outbox.enqueue_within(
                    c, delivery, kind="cron", session_id=session_id, now=now.timestamp()
                )
            c.execute(
                "UPDATE cron_runs SET state = ?, finished_at = ?, detail = ?, session_id = ?, outbox_id = ?"
                " WHERE id = ?",
                (state.value, _ts(now), detail, session_id, outbox_id, run_id),
            )
            summary = state.value + (f": {detail}" if detail else "")
            c.execute(
                "UPDATE cron_jobs SET last_result = ?, last_run_at = ?,"
                " state = CASE WHEN ? AND state = 'active' THEN 'done' ELSE state END,"
                " rev = rev + ? WHERE id = ?",
                (summary[:500], _ts(now), job_done, int(job_done), row["job_id"]),
            )
            return outbox_id

        return await self.db.write(tx)

    # --- requested (run-now) and interrupted runs ------------------------------------
    async def request_run(self, job_id: str, now: datetime) -> int:
        return await self.db.write(
            lambda c: inserted_id(
                c.execute(
                    "INSERT INTO cron_runs(job_id, trigger, state, requested_at) VALUES (?, 'manual', 'requested', ?)",
                    (job_id, _ts(now)),
                )
            )
        )

    async def claim_run(
        self, run_id: int, seen_state: RunState, seen_pid: int | None, now: datetime, pid: int
    ) -> Claimed | None:
        """Take a requested or interrupted run (compare-and-swap on its state and owner):
        it becomes this process's running run."""

        def tx(c: sqlite3.Connection) -> Claimed | None:
            cur = c.execute(
                "UPDATE cron_runs SET state = 'running', started_at = ?, pid = ? WHERE id = ? AND state = ?"
                " AND pid IS ?",
                (_ts(now), pid, run_id, seen_state.value, seen_pid),
            )
            if cur.rowcount != 1:
                return None
            row = c.execute(
                "SELECT j.*, r.trigger AS run_trigger FROM cron_jobs j JOIN cron_runs r ON r.job_id = j.id"
                " WHERE r.id = ?",
                (run_id,),
            ).fetchone()
            return Claimed(_job(row), run_id, manual=row["run_trigger"] == "manual")

        return await self.db.write(tx)

    async def open_runs(self) -> list[CronRun]:
        rows = await self.db.read(
            lambda c: c.execute(
                "SELECT * FROM cron_runs WHERE state IN ('requested', 'running', 'interrupted') ORDER BY id"
            ).fetchall()
        )
        return [_run(r) for r in rows]

    async def mark_run(self, run_id: int, state: RunState, now: datetime, detail: str | None = None) -> None:
        await self.db.write(
            lambda c: c.execute(
                "UPDATE cron_runs SET state = ?, finished_at = ?, detail = COALESCE(?, detail) WHERE id = ?",
                (state.value, _ts(now), detail, run_id),
            )
        )

    async def get_run(self, run_id: int) -> CronRun | None:
        r = await self.db.read(
            lambda c: c.execute("SELECT * FROM cron_runs WHERE id = ?", (run_id,)).fetchone()
        )
        return None if r is None else _run(r)

    async def runs(self, job_id: str | None = None) -> list[CronRun]:
        rows = await self.db.read(
            lambda c: c.execute(
                "SELECT * FROM cron_runs WHERE ? IS NULL OR job_id = ? ORDER BY id", (job_id, job_id)
            ).fetchall()
        )
        return [_run(r) for r in rows]

    async def count_runs(self, state: RunState) -> dict[str, int]:
        rows = await self.db.read(
            lambda c: c.execute(
                "SELECT job_id, COUNT(*) FROM cron_runs WHERE state = ? GROUP BY job_id", (state.value,)
            ).fetchall()
        )
        return {job_id: n for job_id, n in rows}
