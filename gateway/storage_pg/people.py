"""``Directory`` (``gateway/people/directory.py``) on PostgreSQL: who mnemo knows and how
much the bot talks, read from the rows every replica shares (USER.md rows included, in
``curated_memory``)."""

from __future__ import annotations

from datetime import date

from mnemo.gateway.people.directory import PersonFacts
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.scope import UserRef


class PgDirectory:
    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    async def everyone(self) -> list[str]:
        async def q(conn: Connection) -> list[str]:
            cur = await conn.execute(
                "SELECT platform || ':' || user_id AS who FROM sessions"
                " WHERE user_id IS NOT NULL AND source != 'cron'"
                " UNION SELECT payer FROM usage_days WHERE payer != '*'"
                " UNION SELECT owner FROM curated_memory WHERE target = 'user'"
            )
            return sorted(str(r["who"]) for r in await cur.fetchall())

        return await self.db.read(q)

    async def facts(self, user: UserRef) -> PersonFacts:
        async def q(conn: Connection) -> PersonFacts:
            who = (user.platform, user.user_id)
            row = await (
                await conn.execute(
                    "SELECT (SELECT count(*) FROM sessions WHERE platform = %s AND user_id = %s) AS sessions,"
                    " (SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id"
                    "  WHERE s.platform = %s AND m.author_id = %s AND m.role = 'user') AS messages",
                    (*who, *who),
                )
            ).fetchone()
            assert row is not None  # an aggregate always answers one row
            return PersonFacts(int(row["sessions"]), int(row["messages"]))

        return await self.db.read(q)

    async def has_profile(self, owner: UserRef) -> bool:
        async def q(conn: Connection) -> bool:
            cur = await conn.execute(
                "SELECT 1 FROM curated_memory WHERE target = 'user' AND owner = %s", (str(owner),)
            )
            return await cur.fetchone() is not None

        return await self.db.read(q)

    async def chats(self) -> list[str]:
        async def q(conn: Connection) -> list[str]:
            cur = await conn.execute("SELECT chat_key FROM chats ORDER BY chat_key")
            return [str(r["chat_key"]) for r in await cur.fetchall()]

        return await self.db.read(q)

    async def messages_per_day(self, first: date, timezone: str) -> dict[date, int]:
        async def q(conn: Connection) -> dict[date, int]:
            cur = await conn.execute(
                "SELECT (created_at AT TIME ZONE %s)::date AS day, count(*) AS n FROM messages"
                " WHERE created_at >= (%s::date)::timestamp AT TIME ZONE %s GROUP BY 1",
                (timezone, first, timezone),
            )
            return {r["day"]: int(r["n"]) for r in await cur.fetchall()}

        return await self.db.read(q)
