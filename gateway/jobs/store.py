"""Storage of the worker queue's jobs: the port and its SQLite implementation.

``JobRepository`` is what the dispatcher of ``JobQueue`` needs (claim, settle, recover),
``JobLedger`` what inspection needs (``/status``, tests); ``JobStorage`` is both, and
``JobStore`` implements it on ``state.db`` (table ``jobs``, schema in ``schema.py``).
The rules of the queue (module docstring of ``queue.py``) live in the SQL here: the
single-flight indexes (per (session, kind), or per dedupe key), the claim that skips
busy sessions, the persisted cooldown.
Every backend passes ``tests/contract/test_jobs.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from mnemo.memory.db import Database


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    kind: str
    session_id: str
    payload: Mapping[str, Any]
    state: JobState
    attempts: int
    not_before: float
    checkpoint: Mapping[str, Any]
    error: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    # An independent, idempotent write (a provider write, ``provider_writes.py``): single
    # flight per key instead of per (session, kind), and it does not take its session's
    # turn. None for the session's own work (compression, flush, review).
    dedupe_key: str | None = None


def _job(r: sqlite3.Row | Mapping[str, Any]) -> Job:
    return Job(
        id=r["id"],
        kind=r["kind"],
        session_id=r["session_id"],
        payload=json.loads(r["payload"]),
        state=JobState(r["state"]),
        attempts=r["attempts"],
        not_before=r["not_before"],
        checkpoint=json.loads(r["checkpoint"]),
        error=r["error"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        dedupe_key=r["dedupe_key"],
    )


class JobRepository(Protocol):
    """The job rows as the dispatcher of ``JobQueue`` moves them (one queue per process;
    several processes may share the store). Times are epoch seconds from the queue's
    clock. Raises ``StoreError`` (``StoreBusy``)."""

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
        """Queue a job, or return the queued/running one of (session, kind) — of
        ``dedupe_key`` when one is given — with False. After a failed job of the same
        (session, kind) or key the new one waits ``cooldown_s`` from that failure."""
        ...

    async def claim(self, kinds: Sequence[str], now: float) -> Job | None:
        """queued → running (one more attempt) for the due job of ``kinds`` first in
        (not_before, id) order whose session has no running job (a job with a dedupe key
        neither waits for its session nor holds it); None if there is none."""
        ...

    async def settle(
        self,
        job_id: int,
        state: JobState,
        *,
        now: float,
        error: str | None = None,
        not_before: float | None = None,
    ) -> None:
        """Record an outcome: done/failed (finished now) or queued again for a retry.
        ``error`` and ``not_before`` keep their stored values when None."""
        ...

    async def give_back(self, job_id: int, now: float) -> None:
        """A running job that was cancelled (shutdown): queued again, its attempt returned."""
        ...

    async def save_checkpoint(self, job_id: int, checkpoint: Mapping[str, Any], now: float) -> None: ...

    async def recover(self, now: float, *, max_attempts: int, retention_s: float) -> tuple[int, int]:
        """At start-up: jobs left running are queued again, those already tried
        ``max_attempts`` times failed; done rows older than ``retention_s`` deleted.
        Returns (requeued, failed)."""
        ...

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        """The earliest ``not_before`` of a queued job of ``kinds``."""
        ...

    async def outstanding(self, kinds: Sequence[str], now: float) -> int:
        """Jobs of ``kinds`` running or queued and due."""
        ...


class JobLedger(Protocol):
    """Read-only views of the jobs (``/status``, metrics, tests)."""

    async def get(self, job_id: int) -> Job | None: ...

    async def find(
        self, *, session_id: str | None = None, kind: str | None = None, dedupe_key: str | None = None
    ) -> list[Job]:
        """Jobs in creation order, optionally of one session, kind and/or dedupe key."""
        ...

    async def counts(self) -> dict[str, int]:
        """Jobs per state."""
        ...


class JobStorage(JobRepository, JobLedger, Protocol):
    """The jobs table, as a storage backend implements it."""


class JobStore:
    """``JobStorage`` on ``state.db``."""

    def __init__(self, db: Database) -> None:
        self.db = db

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
            same, args = "session_id = ? AND kind = ? AND dedupe_key IS NULL", (session_id, kind)
        else:
            same, args = "dedupe_key = ?", (dedupe_key,)

        def tx(conn: sqlite3.Connection) -> tuple[sqlite3.Row, bool]:
            existing = conn.execute(
                f"SELECT * FROM jobs WHERE {same} AND state IN ('queued', 'running')", args
            ).fetchone()
            if existing is not None:
                return existing, False
            last = conn.execute(
                f"SELECT state, updated_at FROM jobs WHERE {same} ORDER BY id DESC LIMIT 1", args
            ).fetchone()
            # The cooldown after a failure is persisted: a new request does not hammer a
            # failing endpoint again at once.
            failed = last is not None and last["state"] == "failed"
            not_before = max(now, last["updated_at"] + cooldown_s) if failed else now
            cur = conn.execute(
                "INSERT INTO jobs(kind, session_id, payload, not_before, created_at, updated_at, dedupe_key)"
                " VALUES (?,?,?,?,?,?,?)",
                (kind, session_id, body, not_before, now, now, dedupe_key),
            )
            return conn.execute("SELECT * FROM jobs WHERE id = ?", (cur.lastrowid,)).fetchone(), True

        row, created = await self.db.write(tx)
        return _job(row), created

    async def claim(self, kinds: Sequence[str], now: float) -> Job | None:
        marks = ",".join("?" * len(kinds))
        row = await self.db.write(
            lambda c: c.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = ?, updated_at = ?"
                " WHERE id = (SELECT id FROM jobs WHERE state = 'queued' AND not_before <= ?"
                f" AND kind IN ({marks}) AND (dedupe_key IS NOT NULL OR session_id NOT IN"
                " (SELECT session_id FROM jobs WHERE state = 'running' AND dedupe_key IS NULL))"
                " ORDER BY not_before, id LIMIT 1) RETURNING *",
                (now, now, now, *kinds),
            ).fetchone()
        )
        return None if row is None else _job(row)

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
        await self.db.write(
            lambda c: c.execute(
                "UPDATE jobs SET state = ?, error = COALESCE(?, error), not_before = COALESCE(?, not_before),"
                " updated_at = ?, finished_at = ? WHERE id = ?",
                (str(state), error, not_before, now, finished, job_id),
            )
        )

    async def give_back(self, job_id: int, now: float) -> None:
        await self.db.write(
            lambda c: c.execute(
                "UPDATE jobs SET state = 'queued', attempts = MAX(0, attempts - 1), updated_at = ?"
                " WHERE id = ? AND state = 'running'",
                (now, job_id),
            )
        )

    async def save_checkpoint(self, job_id: int, checkpoint: Mapping[str, Any], now: float) -> None:
        body = json.dumps(dict(checkpoint), ensure_ascii=False)
        await self.db.write(
            lambda c: c.execute(
                "UPDATE jobs SET checkpoint = ?, updated_at = ? WHERE id = ?", (body, now, job_id)
            )
        )

    async def recover(self, now: float, *, max_attempts: int, retention_s: float) -> tuple[int, int]:
        def tx(conn: sqlite3.Connection) -> tuple[int, int]:
            # A job that kept killing the process must not loop forever.
            failed = conn.execute(
                "UPDATE jobs SET state = 'failed', error = 'interrupted by a restart too many times',"
                " updated_at = ?, finished_at = ? WHERE state = 'running' AND attempts >= ?",
                (now, now, max_attempts),
            ).rowcount
            requeued = conn.execute(
                "UPDATE jobs SET state = 'queued', not_before = ?, updated_at = ? WHERE state = 'running'",
                (now, now),
            ).rowcount
            conn.execute("DELETE FROM jobs WHERE state = 'done' AND updated_at < ?", (now - retention_s,))
            return requeued, failed

        return await self.db.write(tx)

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        marks = ",".join("?" * len(kinds))
        value = await self.db.read(
            lambda c: c.execute(
                f"SELECT MIN(not_before) FROM jobs WHERE state = 'queued' AND kind IN ({marks})", tuple(kinds)
            ).fetchone()[0]
        )
        return None if value is None else float(value)

    async def outstanding(self, kinds: Sequence[str], now: float) -> int:
        marks = ",".join("?" * len(kinds))
        return int(
            await self.db.read(
                lambda c: c.execute(
                    f"SELECT COUNT(*) FROM jobs WHERE kind IN ({marks})"
                    " AND (state = 'running' OR (state = 'queued' AND not_before <= ?))",
                    (*kinds, now),
                ).fetchone()[0]
            )
        )

    async def get(self, job_id: int) -> Job | None:
        r = await self.db.read(lambda c: c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
        return None if r is None else _job(r)

    async def find(
        self, *, session_id: str | None = None, kind: str | None = None, dedupe_key: str | None = None
    ) -> list[Job]:
        clauses, args = [], []
        for column, value in (("session_id", session_id), ("kind", kind), ("dedupe_key", dedupe_key)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self.db.read(
            lambda c: c.execute(f"SELECT * FROM jobs{where} ORDER BY id", args).fetchall()
        )
        return [_job(r) for r in rows]

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read(
            lambda c: c.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        )
        return {r[0]: r[1] for r in rows}
