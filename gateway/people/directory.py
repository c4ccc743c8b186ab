"""Who mnemo knows, and how much the bot talks: the reads behind ``mnemo users`` and the
admin dashboard, the same on every backend.

``Directory`` is the port, built by the storage backend (``StorageBackend.directory``):
``StateDirectory`` here reads ``state.db`` and, since USER.md files live beside it on
SQLite, the ``memories/users`` folder; ``PgDirectory`` (``storage_pg/people.py``) reads
the PostgreSQL rows, USER.md rows included. A person is ``PLATFORM:ID`` — an account
with a session of its own (cron runs aside), spend, or its own USER.md.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Protocol
from zoneinfo import ZoneInfo

from mnemo.memory.db import Database
from mnemo.memory.scope import UserRef


@dataclass(frozen=True, slots=True)
class PersonFacts:
    sessions: int  # sessions whose user is this account
    messages: int  # messages this account wrote (any session of its platform)


class Directory(Protocol):
    """Read-only; raises ``StoreError`` when the database cannot be read."""

    async def everyone(self) -> list[str]:
        """Every person, as ``PLATFORM:ID``, sorted."""
        ...

    async def facts(self, user: UserRef) -> PersonFacts: ...

    async def has_profile(self, owner: UserRef) -> bool:
        """Whether exactly this account keeps a USER.md (a linked person's is kept by
        the canonical account: ask with that one)."""
        ...

    async def chats(self) -> list[str]:
        """Every chat key the store knows (the search scopes), sorted."""
        ...

    async def messages_per_day(self, first: date, timezone: str) -> dict[date, int]:
        """Messages stored per local day of ``timezone``, from ``first`` on (days
        without messages left out)."""
        ...


class StateDirectory:
    """``Directory`` on ``state.db`` and the USER.md files of ``memories``."""

    def __init__(self, db: Database, memories: Path) -> None:
        self.db = db
        self.memories = memories

    async def everyone(self) -> list[str]:
        def q(conn: sqlite3.Connection) -> set[str]:
            found = {
                f"{r[0]}:{r[1]}"
                for r in conn.execute(
                    "SELECT DISTINCT platform, user_id FROM sessions WHERE user_id IS NOT NULL AND source != 'cron'"
                )
            }
            found |= {r[0] for r in conn.execute("SELECT DISTINCT payer FROM usage_days WHERE payer != '*'")}
            return found

        people = await self.db.read(q)
        users = self.memories / "users"
        if users.is_dir():
            people |= {f"{p.parent.name}:{p.name}" for p in users.glob("*/*") if (p / "USER.md").exists()}
        return sorted(people)

    async def facts(self, user: UserRef) -> PersonFacts:
        def q(conn: sqlite3.Connection) -> PersonFacts:
            who = (user.platform, user.user_id)
            sessions = conn.execute("SELECT COUNT(*) FROM sessions WHERE platform = ? AND user_id = ?", who)
            messages = conn.execute(
                "SELECT COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id"
                " WHERE s.platform = ? AND m.author_id = ? AND m.role = 'user'",
                who,
            )
            return PersonFacts(int(sessions.fetchone()[0]), int(messages.fetchone()[0]))

        return await self.db.read(q)

    async def has_profile(self, owner: UserRef) -> bool:
        return (self.memories / "users" / owner.platform / owner.user_id / "USER.md").is_file()

    async def chats(self) -> list[str]:
        return await self.db.read(
            lambda conn: [str(r[0]) for r in conn.execute("SELECT chat_key FROM chats ORDER BY chat_key")]
        )

    async def messages_per_day(self, first: date, timezone: str) -> dict[date, int]:
        tz = ZoneInfo(timezone)
        since = datetime.combine(first, datetime.min.time(), tz).astimezone(ZoneInfo("UTC")).isoformat()

        def q(conn: sqlite3.Connection) -> list[str]:
            return [
                str(r[0])
                for r in conn.execute("SELECT created_at FROM messages WHERE created_at >= ?", (since,))
            ]

        counts: dict[date, int] = {}
        for stamp in await self.db.read(q):
            day = datetime.fromisoformat(stamp).astimezone(tz).date()
            counts[day] = counts.get(day, 0) + 1
        return counts
