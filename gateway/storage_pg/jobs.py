"""``JobStorage`` on PostgreSQL (see ``gateway/jobs/store.py`` and ``queue.py`` for the
rules: single flight per (session, kind) or per dedupe key, one running job per session
for jobs without a key, persisted cooldown).

For several replicas on one database:

* **claims** pick the due row with ``FOR UPDATE SKIP LOCKED``, so concurrent claimants
  never wait on each other's candidate; the partial unique index ``jobs_one_running``
  makes "one running job per session" hold across replicas too (a claim that loses that
  race retries with the next candidate);
* **leases**: a claim records ``owner`` and ``lease_until = now + lease_s``
  (``save_checkpoint`` renews it). A running job whose lease has expired belongs to a
  dead replica: the next ``claim`` of any replica queues it again and may take it.
* **recovery at start-up** (``recover``) only touches this owner's running jobs and
  expired ones, never the work a live replica is doing.
* **while replicas run** (``gateway/replicas.py``, every heartbeat): ``renew_leases``
  extends the lease of every job this replica is running, however long it takes, so a
  live replica's job is never taken over; ``requeue_orphans`` queues again at once the
  running jobs of replicas that are not alive (``storage_pg/heartbeats.py``), without
  waiting for their lease.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import errors as pg_errors

from mnemo.gateway.jobs.store import Job, JobState, _job
from mnemo.gateway.storage_pg.heartbeats import dead_owner
from mnemo.memory.pg.db import Connection, PgDatabase

JOB_LEASE_S = 900.0
_CLAIM_ATTEMPTS = 5


class PgJobStore:
    """``JobStorage`` on PostgreSQL."""

    def __init__(self, db: PgDatabase, *, owner: str = "mnemo", lease_s: float = JOB_LEASE_S) -> None:
        self.db = db
        self.owner = owner
        self.lease_s = lease_s

    async def add(
        self,
        kind: str,
        session_id: str,
        payload: Mapping[str, Any],
        *,
        cooldown_s: float,
        now: float,
        dedupe_key: str | None = None,
    ) -> tuple[Job, bool]:
        body = json.dumps(dict(payload), ensure_ascii=False)
        # Single flight per dedupe key when there is one, else per (session, kind).
        args: tuple[str, ...]
        if dedupe_key is None:
            lock = f"jobs:{kind}:{session_id}"
            same, args = "session_id = %s AND kind = %s AND dedupe_key IS NULL", (session_id, kind)
        else:
            lock, same, args = f"jobs-key:{dedupe_key}", "dedupe_key = %s", (dedupe_key,)

        async def tx(c: Connection) -> tuple[dict[str, Any], bool]:
            # Serialise adds of one (session, kind) or key across replicas: the
            # single-flight check and the insert then see the same rows.
            await c.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (lock,))
            existing = await (
                await c.execute(f"SELECT * FROM jobs WHERE {same} AND state IN ('queued', 'running')", args)
            ).fetchone()
            if existing is not None:
                return existing, False
            last = await (
                await c.execute(
                    f"SELECT state, updated_at FROM jobs WHERE {same} ORDER BY id DESC LIMIT 1", args
                )
            ).fetchone()
            failed = last is not None and last["state"] == "failed"
            not_before = max(now, last["updated_at"] + cooldown_s) if failed and last is not None else now
            row = await (
                await c.execute(
                    "INSERT INTO jobs(kind, session_id, payload, not_before, created_at, updated_at, dedupe_key)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
                    (kind, session_id, body, not_before, now, now, dedupe_key),
                )
            ).fetchone()
            assert row is not None
            return row, True

        row, created = await self.db.write(tx)
        return _job(row), created

    async def claim(self, kinds: Sequence[str], now: float) -> Job | None:
        async def tx(c: Connection) -> dict[str, Any] | None:
            # A dead replica's expired leases go back to the queue first.
            await c.execute(
                "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, updated_at = %s"
                " WHERE state = 'running' AND lease_until < %s",
                (now, now),
            )
            return await (
                await c.execute(
                    "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = %(now)s,"
                    " updated_at = %(now)s, owner = %(owner)s, lease_until = %(lease)s"
                    " WHERE id = (SELECT id FROM jobs j WHERE state = 'queued' AND not_before <= %(now)s"
                    " AND kind = ANY(%(kinds)s::text[])"
                    " AND (j.dedupe_key IS NOT NULL OR NOT EXISTS (SELECT 1 FROM jobs r"
                    " WHERE r.session_id = j.session_id AND r.state = 'running' AND r.dedupe_key IS NULL))"
                    " ORDER BY not_before, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING *",
                    {"now": now, "owner": self.owner, "lease": now + self.lease_s, "kinds": list(kinds)},
                )
            ).fetchone()

        for attempt in range(_CLAIM_ATTEMPTS):
            try:
                row = await self.db.write(tx)
            except pg_errors.UniqueViolation:
                # Another replica started a job of the same session meanwhile.
                if attempt == _CLAIM_ATTEMPTS - 1:
                    return None
                continue
            return None if row is None else _job(row)
        return None

    async def settle(
        self,
        job_id: int,
        state: JobState,
        *,
        now: float,
        error: str | None = None,
        not_before: float | None = None,
    ) -> None:
        finished = now if state in (JobState.DONE, JobState.FAILED) else None

        async def tx(c: Connection) -> None:
            await c.execute(
                "UPDATE jobs SET state = %s, error = COALESCE(%s, error), not_before = COALESCE(%s, not_before),"
                " updated_at = %s, finished_at = %s, owner = NULL, lease_until = NULL WHERE id = %s",
                (str(state), error, not_before, now, finished, job_id),
            )

        await self.db.write(tx)

    async def give_back(self, job_id: int, now: float) -> None:
        async def tx(c: Connection) -> None:
            await c.execute(
                "UPDATE jobs SET state = 'queued', attempts = GREATEST(0, attempts - 1), updated_at = %s,"
                " owner = NULL, lease_until = NULL WHERE id = %s AND state = 'running'",
                (now, job_id),
            )

        await self.db.write(tx)

    async def save_checkpoint(self, job_id: int, checkpoint: Mapping[str, Any], now: float) -> None:
        body = json.dumps(dict(checkpoint), ensure_ascii=False)

        async def tx(c: Connection) -> None:
            await c.execute(
                "UPDATE jobs SET checkpoint = %s, updated_at = %s,"
                " lease_until = CASE WHEN state = 'running' THEN %s ELSE lease_until END WHERE id = %s",
                (body, now, now + self.lease_s, job_id),
            )

        await self.db.write(tx)

    async def renew_leases(self, now: float) -> int:
        """Extend the lease of every job this replica is running."""

        async def tx(c: Connection) -> int:
            cur = await c.execute(
                "UPDATE jobs SET lease_until = %s WHERE state = 'running' AND owner = %s",
                (now + self.lease_s, self.owner),
            )
            return cur.rowcount

        return await self.db.write(tx)

    async def requeue_orphans(self, now: float, *, max_attempts: int) -> tuple[int, int]:
        """Queue again (or fail, past ``max_attempts``) the running jobs of replicas that
        are not alive: (requeued, failed)."""
        dead = f"state = 'running' AND owner IS DISTINCT FROM %(owner)s AND {dead_owner('owner')}"
        return await self._requeue(dead, now, max_attempts=max_attempts, retention_s=None)

    async def recover(self, now: float, *, max_attempts: int, retention_s: float) -> tuple[int, int]:
        mine = "state = 'running' AND (owner = %(owner)s OR owner IS NULL OR lease_until < %(now)s)"
        return await self._requeue(mine, now, max_attempts=max_attempts, retention_s=retention_s)

    async def _requeue(
        self, mine: str, now: float, *, max_attempts: int, retention_s: float | None
    ) -> tuple[int, int]:
        args = {"owner": self.owner, "now": now, "max": max_attempts, "old": now - (retention_s or 0)}

        async def tx(c: Connection) -> tuple[int, int]:
            failed = (
                await c.execute(
                    "UPDATE jobs SET state = 'failed', error = 'interrupted by a restart too many times',"
                    f" updated_at = %(now)s, finished_at = %(now)s, owner = NULL, lease_until = NULL"
                    f" WHERE {mine} AND attempts >= %(max)s",
                    args,
                )
            ).rowcount
            requeued = (
                await c.execute(
                    "UPDATE jobs SET state = 'queued', not_before = %(now)s, updated_at = %(now)s, owner = NULL,"
                    f" lease_until = NULL WHERE {mine}",
                    args,
                )
            ).rowcount
            if retention_s is not None:
                await c.execute("DELETE FROM jobs WHERE state = 'done' AND updated_at < %(old)s", args)
            return requeued, failed

        return await self.db.write(tx)

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        async def q(c: Connection) -> float | None:
            r = await (
                await c.execute(
                    "SELECT min(not_before) AS t FROM jobs WHERE state = 'queued' AND kind = ANY(%s::text[])",
                    (list(kinds),),
                )
            ).fetchone()
            return None if r is None or r["t"] is None else float(r["t"])

        return await self.db.read(q)

    async def outstanding(self, kinds: Sequence[str], now: float) -> int:
        async def q(c: Connection) -> int:
            r = await (
                await c.execute(
                    "SELECT count(*) AS n FROM jobs WHERE kind = ANY(%s::text[])"
                    " AND (state = 'running' OR (state = 'queued' AND not_before <= %s))",
                    (list(kinds), now),
                )
            ).fetchone()
            return 0 if r is None else int(r["n"])

        return await self.db.read(q)

    async def get(self, job_id: int) -> Job | None:
        async def q(c: Connection) -> Job | None:
            r = await (await c.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))).fetchone()
            return None if r is None else _job(r)

        return await self.db.read(q)

    async def find(
        self, *, session_id: str | None = None, kind: str | None = None, dedupe_key: str | None = None
    ) -> list[Job]:
        async def q(c: Connection) -> list[Job]:
            cur = await c.execute(
                "SELECT * FROM jobs WHERE (%(s)s::text IS NULL OR session_id = %(s)s)"
                " AND (%(k)s::text IS NULL OR kind = %(k)s)"
                " AND (%(d)s::text IS NULL OR dedupe_key = %(d)s) ORDER BY id",
                {"s": session_id, "k": kind, "d": dedupe_key},
            )
            return [_job(r) for r in await cur.fetchall()]

        return await self.db.read(q)

    async def counts(self) -> dict[str, int]:
        async def q(c: Connection) -> dict[str, int]:
            rows = await (await c.execute("SELECT state, count(*) AS n FROM jobs GROUP BY state")).fetchall()
            return {r["state"]: int(r["n"]) for r in rows}

        return await self.db.read(q)
