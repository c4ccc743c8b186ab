"""``MediaUsageRepository`` on PostgreSQL: the same rows and rules as
``gateway/media_quota.py``, shared by every replica.

Exact under concurrency: every ``admit`` takes one transaction-scoped advisory lock
before it reads the sums, so admits are decided one at a time across all replicas
(READ COMMITTED: each sees what the previous one committed) and two uploads can never
pass a limit together. Reads of the links (a person's accounts) happen in the same
transaction (``gateway/storage_pg/links.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from mnemo.gateway.config import MediaQuotaSettings
from mnemo.gateway.media_quota import (
    UPLOAD_KEEP_S,
    Clock,
    MediaKind,
    MediaUsage,
    QuotaExceeded,
    first_exceeded,
    utc_now,
)
from mnemo.gateway.storage_pg.links import members_of
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration

MEDIA_USAGE = PgMigration(
    "0014_media_usage",
    """
CREATE TABLE media_usage (
    owner text NOT NULL,
    kind text NOT NULL,
    file text NOT NULL,
    bytes bigint NOT NULL,
    day text NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (owner, kind, file)
);
CREATE INDEX media_usage_day ON media_usage(day);
CREATE INDEX media_usage_file ON media_usage(kind, file);
""",
)

_LOCK = "mnemo.media_quota"


class PgMediaUsage:
    """``MediaUsageRepository`` on a ``PgDatabase``."""

    def __init__(self, db: PgDatabase, *, timezone: str = "UTC", clock: Clock = utc_now) -> None:
        self._db = db
        self.tz = ZoneInfo(timezone)
        self.clock = clock

    async def admit(
        self, owner: str, kind: MediaKind, file: str, size: int, limits: MediaQuotaSettings
    ) -> QuotaExceeded | None:
        now = self.clock().astimezone(self.tz)

        async def tx(conn: Connection) -> QuotaExceeded | None:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_LOCK,))
            known = await (
                await conn.execute(
                    "SELECT 1 FROM media_usage WHERE owner = %s AND kind = %s AND file = %s",
                    (owner, str(kind), file),
                )
            ).fetchone()
            if known is not None:
                return None  # the same content again: nothing more is kept
            person = await _usage(conn, await members_of(conn, owner), now)
            everyone = await _usage(conn, None, now)
            exceeded = first_exceeded(limits, size, person, everyone, now)
            if exceeded is None:
                await conn.execute(
                    "INSERT INTO media_usage (owner, kind, file, bytes, day, created_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (owner, str(kind), file, size, now.date().isoformat(), now.timestamp()),
                )
            return exceeded

        return await self._db.write(tx)

    async def release(self, kind: MediaKind, files: Sequence[str]) -> int:
        if not files:
            return 0

        async def tx(conn: Connection) -> int:
            cur = await conn.execute(
                "DELETE FROM media_usage WHERE kind = %s AND file = ANY(%s)", (str(kind), list(files))
            )
            return cur.rowcount

        return await self._db.write(tx)

    async def usage(self, owner: str) -> MediaUsage:
        now = self.clock().astimezone(self.tz)

        async def q(conn: Connection) -> MediaUsage:
            return await _usage(conn, None if owner == "*" else await members_of(conn, owner), now)

        return await self._db.read(q)


async def _usage(conn: Connection, owners: list[str] | None, now: datetime) -> MediaUsage:
    row = await (
        await conn.execute(
            "SELECT COALESCE(SUM(CASE WHEN day = %s THEN bytes END), 0) AS today,"
            " COALESCE(SUM(CASE WHEN kind = 'stored' OR created_at > %s THEN bytes END), 0) AS kept"
            " FROM media_usage WHERE %s::text[] IS NULL OR owner = ANY(%s::text[])",
            (now.date().isoformat(), now.timestamp() - UPLOAD_KEEP_S, owners, owners),
        )
    ).fetchone()
    assert row is not None
    return MediaUsage(int(row["today"]), int(row["kept"]))
