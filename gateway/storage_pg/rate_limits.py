"""The per-user rate limit's window on PostgreSQL, shared by every replica.

On SQLite the window lives in the process (``RateLimiter``, ``gateway/inbound/access.py``):
one process serves the bot. With N replicas behind a round-robin webhook an in-process
window would let a user send N times the limit, so on PostgreSQL ``AccessControl`` asks
this repository instead. The rules are the same as the in-process limiter's:

* a message is allowed while the user has fewer than ``limit`` allowed messages in the
  last 60 s; an allowed message is one row of ``rate_limit_hits`` (a refused one is not
  counted, so a user who keeps writing is let through again as soon as a slot frees);
* the first refused message gets the "slow down" notice, later ones are dropped silently
  until a message is allowed again — the ``warned`` flag of ``rate_limit_users`` says so
  for every replica, so the notice goes out once however the messages are spread.

Exact under concurrency: a hit first upserts the user's ``rate_limit_users`` row, which
locks it until the transaction ends, so the hits of one user are decided one at a time
(READ COMMITTED: each later statement sees what the previous holder committed) while
different users never wait for each other. Time is the server's clock
(``clock_timestamp()``), one clock for all replicas, unless a clock is given (tests).
Rows older than the window are deleted on the user's next hit, and every
``SWEEP_INTERVAL_S`` across all users, so the tables hold at most ``limit`` rows per
recently active user.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mnemo.gateway.inbound.access import RateVerdict
from mnemo.gateway.logs import get_logger
from mnemo.memory.errors import StoreError
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration

log = get_logger(__name__)

WINDOW_S = 60.0
SWEEP_INTERVAL_S = 600.0

RATE_LIMITS = PgMigration(
    "pg_rate_limits",
    """
CREATE TABLE rate_limit_users (
    key text PRIMARY KEY,
    warned boolean NOT NULL DEFAULT false
);
CREATE TABLE rate_limit_hits (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL,
    at double precision NOT NULL
);
CREATE INDEX rate_limit_hits_key ON rate_limit_hits(key, at);
CREATE INDEX rate_limit_hits_at ON rate_limit_hits(at);
""",
)


class PgRateLimits:
    """``SharedRateWindow`` (``gateway/inbound/access.py``) on PostgreSQL."""

    def __init__(self, db: PgDatabase, clock: Callable[[], float] | None = None) -> None:
        self.db = db
        self._clock = clock
        self._next_sweep = 0.0

    async def hit(self, key: str, limit: int) -> RateVerdict:
        """Count one message of ``key`` against ``limit`` per minute, atomically."""
        if limit <= 0:
            return RateVerdict(True)
        given = self._clock() if self._clock is not None else None

        async def tx(conn: Connection) -> RateVerdict:
            row = await (
                await conn.execute(
                    "INSERT INTO rate_limit_users (key) VALUES (%s)"
                    " ON CONFLICT (key) DO UPDATE SET key = excluded.key RETURNING warned",
                    (key,),
                )
            ).fetchone()
            assert row is not None
            warned = bool(row["warned"])
            if given is not None:
                now = given
            else:  # read after the row lock: the time this hit is decided at
                clock = await (
                    await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS now")
                ).fetchone()
                assert clock is not None
                now = float(clock["now"])
            await conn.execute(
                "DELETE FROM rate_limit_hits WHERE key = %s AND at <= %s", (key, now - WINDOW_S)
            )
            counted = await (
                await conn.execute(
                    "SELECT count(*) AS n, min(at) AS oldest FROM rate_limit_hits WHERE key = %s", (key,)
                )
            ).fetchone()
            assert counted is not None
            if counted["n"] < limit:
                await conn.execute("INSERT INTO rate_limit_hits (key, at) VALUES (%s, %s)", (key, now))
                if warned:
                    await conn.execute("UPDATE rate_limit_users SET warned = false WHERE key = %s", (key,))
                return RateVerdict(True)
            if not warned:
                await conn.execute("UPDATE rate_limit_users SET warned = true WHERE key = %s", (key,))
            return RateVerdict(
                False, max(0.0, float(counted["oldest"]) + WINDOW_S - now), first_refusal=not warned
            )

        verdict = await self.db.write(tx)
        try:
            await self._maybe_sweep(given)
        except StoreError as e:  # the verdict stands; the next sweep takes the old rows
            log.warning("rate_limit_sweep_failed", error=str(e))
        return verdict

    async def _maybe_sweep(self, given: float | None) -> None:
        local = time.monotonic()
        if local < self._next_sweep:
            return
        self._next_sweep = local + SWEEP_INTERVAL_S

        async def tx(conn: Connection) -> None:
            if given is not None:
                await conn.execute("DELETE FROM rate_limit_hits WHERE at <= %s", (given - WINDOW_S,))
            else:
                await conn.execute(
                    "DELETE FROM rate_limit_hits WHERE at <= extract(epoch FROM clock_timestamp()) - %s",
                    (WINDOW_S,),
                )
            # A user with no hit left and no notice pending is forgotten (a later hit
            # creates the row again); a locked row, a hit being decided right now, is
            # skipped, not waited for. Hits are not tied to the row by a foreign key, so
            # even a race with a hit committed meanwhile loses no hit.
            await conn.execute(
                "DELETE FROM rate_limit_users u WHERE NOT u.warned AND u.key IN ("
                " SELECT key FROM rate_limit_users v WHERE NOT v.warned"
                " AND NOT EXISTS (SELECT 1 FROM rate_limit_hits h WHERE h.key = v.key)"
                " FOR UPDATE SKIP LOCKED)"
            )

        await self.db.write(tx)
