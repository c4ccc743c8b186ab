"""``CronRepository`` on PostgreSQL (see ``gateway/cron/store.py`` for the three rules:
edits bump ``rev``, a slot is claimed by compare-and-swap on ``next_run_at``, a run is
finished together with its outbox delivery). The compare-and-swaps are single
``UPDATE … WHERE`` statements, which PostgreSQL's row locks make exact across replicas:
the loser re-checks the row after the winner commits and matches nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from mnemo.gateway.cron.store import (
    Claimed,
    CronJob,
    CronRun,
    JobState,
    JobTarget,
    RunState,
    _job,
    _run,
    _ts,
)
from mnemo.gateway.events import OutboundMessage
from mnemo.gateway.storage_pg.outbox import PgOutbox
from mnemo.memory.pg.db import Connection, PgDatabase

T = TypeVar("T")
_SAME = "IS NOT DISTINCT FROM"


class PgCronStore:
    """``CronRepository`` on PostgreSQL; deliveries go through ``outbox`` (same database:
    they share this store's transaction)."""

    def __init__(self, db: PgDatabase, outbox: PgOutbox) -> None:
        self.db = db
        self._outbox = outbox

    async def _fetch(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        async def q(c: Connection) -> list[dict[str, Any]]:
            return await (await c.execute(sql, args)).fetchall()

        return await self.db.read(q)

    async def _write(self, fn: Callable[[Connection], Awaitable[T]]) -> T:
        return await self.db.write(fn)

    # --- jobs -------------------------------------------------------------------------
    async def insert(self, job: CronJob) -> bool:
        s = job.schedule

        async def tx(c: Connection) -> bool:
            cur = await c.execute(
                "INSERT INTO cron_jobs(id, platform, chat_id, chat_type, thread_id, user_id, source, created_by,"
                " prompt, schedule_kind, schedule, timezone, start_at, state, next_run_at, created_at, updated_at)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (id) DO NOTHING",
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

        return await self._write(tx)

    async def redefine(self, job: CronJob, now: datetime) -> None:
        s = job.schedule

        async def tx(c: Connection) -> None:
            await c.execute(
                "UPDATE cron_jobs SET platform=%s, chat_id=%s, chat_type=%s, thread_id=%s, user_id=%s, prompt=%s,"
                " schedule_kind=%s, schedule=%s, timezone=%s, start_at=%s, state=%s, next_run_at=%s, rev=rev+1,"
                " updated_at=%s WHERE id=%s",
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

        await self._write(tx)

    async def get(self, job_id: str) -> CronJob | None:
        rows = await self._fetch("SELECT * FROM cron_jobs WHERE id = %s", (job_id,))
        return _job(rows[0]) if rows else None

    async def all(self) -> list[CronJob]:
        return [_job(r) for r in await self._fetch("SELECT * FROM cron_jobs ORDER BY created_at, id")]

    async def in_chat(self, target: JobTarget) -> list[CronJob]:
        rows = await self._fetch(
            f"SELECT * FROM cron_jobs WHERE platform = %s AND chat_id = %s AND thread_id {_SAME} %s"
            " ORDER BY created_at, id",
            (target.platform, target.chat_id, target.thread_id),
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
        async def tx(c: Connection) -> bool:
            cur = await c.execute(
                "UPDATE cron_jobs SET state = %s, next_run_at = %s, rev = rev + 1, updated_at = %s,"
                " last_result = COALESCE(%s, last_result) WHERE id = %s",
                (state.value, _ts(next_run_at), _ts(now), result, job_id),
            )
            return cur.rowcount == 1

        return await self._write(tx)

    async def delete(self, job_id: str) -> bool:
        async def tx(c: Connection) -> bool:
            return (await c.execute("DELETE FROM cron_jobs WHERE id = %s", (job_id,))).rowcount > 0

        return await self._write(tx)

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
        async def tx(c: Connection) -> Claimed | None:
            job = await (
                await c.execute(
                    "UPDATE cron_jobs SET next_run_at = %s, last_run_at = %s WHERE id = %s AND rev = %s"
                    f" AND state = 'active' AND next_run_at {_SAME} %s RETURNING *",
                    (_ts(new_next), _ts(now), job_id, rev, _ts(seen_next)),
                )
            ).fetchone()
            if job is None:
                return None
            run = await (
                await c.execute(
                    "INSERT INTO cron_runs(job_id, trigger, state, scheduled_for, started_at, pid)"
                    " VALUES (%s, 'schedule', 'running', %s, %s, %s) RETURNING id",
                    (job_id, _ts(seen_next), _ts(now), pid),
                )
            ).fetchone()
            assert run is not None
            return Claimed(_job(job), int(run["id"]))

        return await self._write(tx)

    async def record_missed(
        self,
        job_id: str,
        rev: int,
        seen_next: datetime | None,
        new_next: datetime | None,
        now: datetime,
        detail: str,
    ) -> bool:
        done = new_next is None

        async def tx(c: Connection) -> bool:
            cur = await c.execute(
                "UPDATE cron_jobs SET next_run_at = %s, last_result = %s,"
                " state = CASE WHEN %s THEN 'done' ELSE state END, rev = rev + %s"
                f" WHERE id = %s AND rev = %s AND state = 'active' AND next_run_at {_SAME} %s",
                (_ts(new_next), detail, done, int(done), job_id, rev, _ts(seen_next)),
            )
            if cur.rowcount != 1:
                return False
            await c.execute(
                "INSERT INTO cron_runs(job_id, trigger, state, scheduled_for, finished_at, detail)"
                " VALUES (%s, 'schedule', 'missed', %s, %s, %s)",
                (job_id, _ts(seen_next), _ts(now), detail),
            )
            return True

        return await self._write(tx)

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
        async def tx(c: Connection) -> int | None:
            row = await (await c.execute("SELECT job_id FROM cron_runs WHERE id = %s", (run_id,))).fetchone()
            if row is None:
                return None  # the job (and its runs) was removed meanwhile
            outbox_id = None
            if delivery is not None:
                outbox_id = await self._outbox.enqueue_within(
                    c, delivery, kind="cron", session_id=session_id, now=now.timestamp()
                )
            await c.execute(
                "UPDATE cron_runs SET state = %s, finished_at = %s, detail = %s, session_id = %s, outbox_id = %s"
                " WHERE id = %s",
                (state.value, _ts(now), detail, session_id, outbox_id, run_id),
            )
            summary = state.value + (f": {detail}" if detail else "")
            await c.execute(
                "UPDATE cron_jobs SET last_result = %s, last_run_at = %s,"
                " state = CASE WHEN %s AND state = 'active' THEN 'done' ELSE state END,"
                " rev = rev + %s WHERE id = %s",
                (summary[:500], _ts(now), job_done, int(job_done), row["job_id"]),
            )
            return outbox_id

        return await self._write(tx)

    # --- requested (run-now) and interrupted runs ------------------------------------
    async def request_run(self, job_id: str, now: datetime) -> int:
        async def tx(c: Connection) -> int:
            r = await (
                await c.execute(
                    "INSERT INTO cron_runs(job_id, trigger, state, requested_at)"
                    " VALUES (%s, 'manual', 'requested', %s) RETURNING id",
                    (job_id, _ts(now)),
                )
            ).fetchone()
            assert r is not None
            return int(r["id"])

        return await self._write(tx)

    async def claim_run(
        self, run_id: int, seen_state: RunState, seen_pid: int | None, now: datetime, pid: int
    ) -> Claimed | None:
        async def tx(c: Connection) -> Claimed | None:
            cur = await c.execute(
                "UPDATE cron_runs SET state = 'running', started_at = %s, pid = %s WHERE id = %s AND state = %s"
                f" AND pid {_SAME} %s",
                (_ts(now), pid, run_id, seen_state.value, seen_pid),
            )
            if cur.rowcount != 1:
                return None
            row = await (
                await c.execute(
                    "SELECT j.*, r.trigger AS run_trigger FROM cron_jobs j JOIN cron_runs r ON r.job_id = j.id"
                    " WHERE r.id = %s",
                    (run_id,),
                )
            ).fetchone()
            assert row is not None
            return Claimed(_job(row), run_id, manual=row["run_trigger"] == "manual")

        return await self._write(tx)

    async def open_runs(self) -> list[CronRun]:
        rows = await self._fetch(
            "SELECT * FROM cron_runs WHERE state IN ('requested', 'running', 'interrupted') ORDER BY id"
        )
        return [_run(r) for r in rows]

    async def mark_run(self, run_id: int, state: RunState, now: datetime, detail: str | None = None) -> None:
        async def tx(c: Connection) -> None:
            await c.execute(
                "UPDATE cron_runs SET state = %s, finished_at = %s, detail = COALESCE(%s, detail) WHERE id = %s",
                (state.value, _ts(now), detail, run_id),
            )

        await self._write(tx)

    async def get_run(self, run_id: int) -> CronRun | None:
        rows = await self._fetch("SELECT * FROM cron_runs WHERE id = %s", (run_id,))
        return _run(rows[0]) if rows else None

    async def runs(self, job_id: str | None = None) -> list[CronRun]:
        rows = await self._fetch(
            "SELECT * FROM cron_runs WHERE %s::text IS NULL OR job_id = %s ORDER BY id", (job_id, job_id)
        )
        return [_run(r) for r in rows]

    async def count_runs(self, state: RunState) -> dict[str, int]:
        rows = await self._fetch(
            "SELECT job_id, COUNT(*) AS n FROM cron_runs WHERE state = %s GROUP BY job_id", (state.value,)
        )
        return {r["job_id"]: int(r["n"]) for r in rows}
