"""``MediaUsageRepository`` on ``state.db``: the ``media_usage`` rows of
``gateway/media_quota.py``, summed per person over their linked accounts (read from
``identity_links`` in the same transaction, ``links.members_within``).

One step of the ordered list in ``gateway/storage.py``; never edit it once shipped,
append a new one. ``erase_usage_within`` forgets a person's rows inside the erasure's
transaction (``erasure.py``).
"""

from __future__ import annotations

import sqlite3
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
from mnemo.gateway.people.links import members_within
from mnemo.memory.db import Database
from mnemo.memory.migrations import Migration

MEDIA_USAGE = Migration(
    "0014_media_usage",
    """
CREATE TABLE media_usage (
    owner TEXT NOT NULL,               -- PLATFORM:ID of the account that sent it
    kind TEXT NOT NULL,                -- 'stored' (media/) or 'upload' (media/uploads/)
    file TEXT NOT NULL,                -- the stored file's name, or USER/UPLOAD_ID
    bytes INTEGER NOT NULL,
    day TEXT NOT NULL,                 -- YYYY-MM-DD in gateway.timezone
    created_at REAL NOT NULL,
    PRIMARY KEY (owner, kind, file)
) WITHOUT ROWID;
CREATE INDEX media_usage_day ON media_usage(day);
CREATE INDEX media_usage_file ON media_usage(kind, file);
""",
)

_KEPT = "(kind = 'stored' OR created_at > ?)"


class SqliteMediaUsage:
    """``MediaUsageRepository`` on ``state.db``."""

    def __init__(self, db: Database, *, timezone: str = "UTC", clock: Clock = utc_now) -> None:
        self._db = db
        self.tz = ZoneInfo(timezone)
        self.clock = clock

    async def admit(
        self, owner: str, kind: MediaKind, file: str, size: int, limits: MediaQuotaSettings
    ) -> QuotaExceeded | None:
        now = self.clock().astimezone(self.tz)

        def tx(conn: sqlite3.Connection) -> QuotaExceeded | None:
            if conn.execute(
                "SELECT 1 FROM media_usage WHERE owner = ? AND kind = ? AND file = ?", (owner, kind, file)
            ).fetchone():
                return None  # the same content again: nothing more is kept
            person = _usage(conn, members_within(conn, owner), now)
            everyone = _usage(conn, None, now)
            exceeded = first_exceeded(limits, size, person, everyone, now)
            if exceeded is None:
                conn.execute(
                    "INSERT INTO media_usage (owner, kind, file, bytes, day, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (owner, kind, file, size, now.date().isoformat(), now.timestamp()),
                )
            return exceeded

        return await self._db.write(tx)

    async def release(self, kind: MediaKind, files: Sequence[str]) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            return sum(
                conn.execute("DELETE FROM media_usage WHERE kind = ? AND file = ?", (kind, f)).rowcount
                for f in files
            )

        return await self._db.write(tx) if files else 0

    async def usage(self, owner: str) -> MediaUsage:
        now = self.clock().astimezone(self.tz)
        return await self._db.read(
            lambda conn: _usage(conn, None if owner == "*" else members_within(conn, owner), now)
        )


def _usage(conn: sqlite3.Connection, owners: list[str] | None, now: datetime) -> MediaUsage:
    where, args = ("", []) if owners is None else (f" AND owner IN ({','.join('?' * len(owners))})", owners)
    row = conn.execute(
        f"SELECT COALESCE(SUM(CASE WHEN day = ? THEN bytes END), 0),"
        f" COALESCE(SUM(CASE WHEN {_KEPT} THEN bytes END), 0) FROM media_usage WHERE 1 = 1{where}",
        (now.date().isoformat(), now.timestamp() - UPLOAD_KEEP_S, *args),
    ).fetchone()
    return MediaUsage(int(row[0]), int(row[1]))


def erase_usage_within(conn: sqlite3.Connection, owner: str) -> int:
    """Forget what ``owner`` stored (their files are erased with their messages)."""
    return int(conn.execute("DELETE FROM media_usage WHERE owner = ?", (owner,)).rowcount)
