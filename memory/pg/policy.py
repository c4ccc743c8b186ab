"""Memory policies on PostgreSQL: the twin of ``SqlitePolicies`` (``memory/policy.py``),
one table every replica reads, so a policy set through one replica holds in all."""

from __future__ import annotations

import time
from collections.abc import Callable

from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration
from mnemo.memory.policy import (
    SELECT,
    UPSERT,
    ChatPolicy,
    Groups,
    History,
    PersonPolicy,
    Remember,
    chat_of,
    person_of,
)

PG_MEMORY_POLICIES = PgMigration(
    "0016_memory_policies",
    """
CREATE TABLE memory_policies (
    scope      text NOT NULL CHECK (scope IN ('person', 'chat')),
    key        text NOT NULL,
    remember   text CHECK (remember IN ('on', 'off', 'ask')),
    groups     text CHECK (groups IN ('private', 'shared')),
    history    text CHECK (history IN ('on', 'off')),
    updated_at double precision NOT NULL,
    updated_by text NOT NULL,
    PRIMARY KEY (scope, key)
);
""",
)


async def erase_within(c: Connection, account: str, *, delete: bool) -> int:
    cur = await c.execute(
        "SELECT count(*) AS n FROM memory_policies WHERE scope = 'person' AND key = %s", (account,)
    )
    row = await cur.fetchone()
    n = int(row["n"]) if row is not None else 0
    if delete:
        await c.execute("DELETE FROM memory_policies WHERE scope = 'person' AND key = %s", (account,))
    return n


class PgPolicies:
    """``PolicyRepository`` on PostgreSQL."""

    def __init__(self, db: PgDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def _get(self, scope: str, key: str) -> tuple[str | None, str | None, str | None] | None:
        async def q(c: Connection) -> tuple[str | None, str | None, str | None] | None:
            row = await (await c.execute(SELECT.format(p="%s"), (scope, key))).fetchone()
            return None if row is None else (row["remember"], row["groups"], row["history"])

        return await self.db.read(q)

    async def _set(
        self, scope: str, key: str, values: tuple[str | None, str | None, str | None], by: str
    ) -> None:
        now = self.clock()

        async def tx(c: Connection) -> None:
            await c.execute(UPSERT.format(p="%s"), (scope, key, *values, now, by))

        await self.db.write(tx)

    async def person(self, who: str) -> PersonPolicy:
        return person_of(await self._get("person", who))

    async def chat(self, chat: str) -> ChatPolicy:
        return chat_of(await self._get("chat", chat))

    async def set_person(
        self, who: str, *, remember: Remember | None = None, groups: Groups | None = None, by: str
    ) -> PersonPolicy:
        await self._set("person", who, (_v(remember), _v(groups), None), by)
        return await self.person(who)

    async def set_chat(
        self, chat: str, *, remember: Remember | None = None, history: History | None = None, by: str
    ) -> ChatPolicy:
        if remember is Remember.ASK:
            raise ValueError("a chat's remember is on or off ('ask' is a person's choice)")
        await self._set("chat", chat, (_v(remember), None, _v(history)), by)
        return await self.chat(chat)


def _v(value: Remember | Groups | History | None) -> str | None:
    return None if value is None else value.value
