"""Linked identities on PostgreSQL: the rules, the profile merge and the copies are
``IdentityLinks``' (``gateway/people/links.py``); only the SQL differs. Every change
takes one transaction-scoped advisory lock, so two replicas linking or unlinking the
same people at once apply one after the other, and a code is used up by the
``DELETE … RETURNING`` that reads it (never by two replicas). As on SQLite, a link
carries the joining side's own budget caps over when the canonical account has none,
and an unlinked canonical account hands its caps to the account that carries on.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime

from mnemo.gateway.logs import get_logger
from mnemo.gateway.people.links import (
    _ALPHABET,
    CODE_LEN,
    CODE_TTL_S,
    LinkResult,
    LinkRow,
    LinkRules,
    Redeemed,
    UnlinkResult,
    code_hash,
)
from mnemo.memory.identity import Identities
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.ports import CuratedRepository
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

LINKS_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('identity_links', 0))"
# The person's own caps follow the person (``gateway/budgets/ledger.py``).
_CARRY_CAPS = (
    "INSERT INTO budget_overrides (payer, daily_usd, monthly_usd, daily_tokens, updated_at)"
    " SELECT %s, daily_usd, monthly_usd, daily_tokens, updated_at FROM budget_overrides WHERE payer = %s"
    " ON CONFLICT (payer) DO NOTHING"
)


async def canonical_of(conn: Connection, user: str) -> str:
    r = await (
        await conn.execute("SELECT canonical FROM identity_links WHERE member = %s", (user,))
    ).fetchone()
    return str(r["canonical"]) if r is not None else user


async def members_of(conn: Connection, user: str) -> list[str]:
    canonical = await canonical_of(conn, user)
    cur = await conn.execute(
        "SELECT member FROM identity_links WHERE canonical = %s ORDER BY linked_at, member", (canonical,)
    )
    return [str(r["member"]) for r in await cur.fetchall()] or [user]


async def _bump(conn: Connection) -> None:
    await conn.execute("UPDATE identity_generation SET n = n + 1 WHERE id = 1")


class PgIdentityLinks(LinkRules):
    """``LinkRepository`` (``gateway/people/links.py``) on PostgreSQL."""

    def __init__(
        self,
        db: PgDatabase,
        files: CuratedRepository,
        identities: Identities,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(files, identities, clock=clock)
        self.db = db

    async def refresh(self) -> None:
        async def generation(conn: Connection) -> int:
            r = await (await conn.execute("SELECT n FROM identity_generation WHERE id = 1")).fetchone()
            assert r is not None  # the migration inserts the one row
            return int(r["n"])

        if await self.db.read(generation) == self.identities.generation:
            return
        async with self._refreshing:

            async def q(conn: Connection) -> tuple[int, list[tuple[UserRef, UserRef]]]:
                n = await generation(conn)
                rows = await (await conn.execute("SELECT member, canonical FROM identity_links")).fetchall()
                return n, [(UserRef.parse(r["member"]), UserRef.parse(r["canonical"])) for r in rows]

            n, pairs = await self.db.read(q)
            self.identities.replace(pairs, n)

    async def issue_code(self, user: UserRef) -> str:
        code = "".join(secrets.choice(_ALPHABET) for _ in range(CODE_LEN))
        now = self.clock()

        async def tx(conn: Connection) -> None:
            await conn.execute("DELETE FROM link_codes WHERE expires_at < %s OR usr = %s", (now, str(user)))
            await conn.execute(
                "INSERT INTO link_codes (code_hash, usr, expires_at) VALUES (%s, %s, %s)",
                (code_hash(code), str(user), now + CODE_TTL_S),
            )

        await self.db.write(tx)
        return code

    async def redeem(self, code: str, user: UserRef) -> LinkResult:
        digest, now = code_hash(code), self.clock()
        plan: list[tuple[UserRef, UserRef]] = []

        async def tx(conn: Connection) -> LinkResult:
            await conn.execute(LINKS_LOCK)
            r = await (
                await conn.execute("SELECT usr FROM link_codes WHERE code_hash = %s", (digest,))
            ).fetchone()
            if r is None:
                return LinkResult(Redeemed.WRONG)
            issuer = UserRef.parse(r["usr"])
            if issuer == user:
                return LinkResult(Redeemed.OWN)
            used = await (
                await conn.execute(
                    "DELETE FROM link_codes WHERE code_hash = %s RETURNING expires_at", (digest,)
                )
            ).fetchone()
            if used is None:
                return LinkResult(Redeemed.WRONG)
            if float(used["expires_at"]) < now:
                return LinkResult(Redeemed.EXPIRED)
            return await self._pg_link(conn, issuer, user, "code", now, plan)

        result = await self.db.write(tx)
        await self._after(result, plan)
        return result

    async def link(self, a: UserRef, b: UserRef, *, by: str = "admin") -> LinkResult:
        if a == b:
            raise ValueError(f"{a} cannot be linked with itself")
        now = self.clock()
        plan: list[tuple[UserRef, UserRef]] = []

        async def tx(conn: Connection) -> LinkResult:
            await conn.execute(LINKS_LOCK)
            return await self._pg_link(conn, a, b, by, now, plan)

        result = await self.db.write(tx)
        await self._after(result, plan)
        return result

    async def _pg_link(
        self,
        conn: Connection,
        a: UserRef,
        b: UserRef,
        by: str,
        now: float,
        plan: list[tuple[UserRef, UserRef]],
    ) -> LinkResult:
        ca, cb = await canonical_of(conn, str(a)), await canonical_of(conn, str(b))
        if ca == cb:
            return LinkResult(
                Redeemed.ALREADY, UserRef.parse(ca), tuple(map(UserRef.parse, await members_of(conn, ca)))
            )
        joining = await members_of(conn, cb)
        into, other = UserRef.parse(ca), UserRef.parse(cb)
        merged, left_out = await asyncio.to_thread(self._merge, into, other)
        await conn.execute(
            "INSERT INTO identity_links (member, canonical, linked_at, linked_by) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (member) DO NOTHING",
            (ca, ca, now, by),
        )
        for member in joining:
            await conn.execute(
                "INSERT INTO identity_links (member, canonical, linked_at, linked_by) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (member) DO UPDATE SET canonical = excluded.canonical,"
                " linked_at = excluded.linked_at, linked_by = excluded.linked_by",
                (member, ca, now, by),
            )
        await conn.execute(_CARRY_CAPS, (ca, cb))  # the joining side's apply when the canonical has none
        await _bump(conn)
        plan.append((other, into))
        return LinkResult(
            Redeemed.LINKED, into, tuple(map(UserRef.parse, await members_of(conn, ca))), merged, left_out
        )

    async def unlink(self, user: UserRef) -> UnlinkResult:
        async def tx(conn: Connection) -> UnlinkResult:
            await conn.execute(LINKS_LOCK)
            u = str(user)
            if (
                await (await conn.execute("SELECT 1 FROM identity_links WHERE member = %s", (u,))).fetchone()
                is None
            ):
                return UnlinkResult(user, False)
            canonical = await canonical_of(conn, u)
            rest = [m for m in await members_of(conn, u) if m != u]
            await conn.execute("DELETE FROM identity_links WHERE member = %s", (u,))
            if canonical == u:
                new = rest[0]
                await asyncio.to_thread(self._copy, user, UserRef.parse(new))
                await conn.execute("UPDATE identity_links SET canonical = %s WHERE canonical = %s", (new, u))
                await conn.execute(_CARRY_CAPS, (new, u))
                canonical = new
            else:
                await asyncio.to_thread(self._copy, UserRef.parse(canonical), user)
            if len(rest) == 1:
                await conn.execute("DELETE FROM identity_links WHERE member = %s", (rest[0],))
            await _bump(conn)
            return UnlinkResult(user, True, UserRef.parse(canonical), tuple(map(UserRef.parse, rest)))

        result = await self.db.write(tx)
        await self.refresh()
        if result.was_linked:
            log.info("identity_unlinked", user=str(user), canonical=str(result.canonical))
        return result

    async def members(self, user: UserRef) -> tuple[UserRef, ...]:
        async def q(conn: Connection) -> list[str]:
            return await members_of(conn, str(user))

        return tuple(map(UserRef.parse, await self.db.read(q)))

    async def rows(self, user: UserRef) -> list[LinkRow]:
        async def q(conn: Connection) -> list[LinkRow]:
            canonical = await canonical_of(conn, str(user))
            cur = await conn.execute(
                "SELECT member, canonical, linked_at, linked_by FROM identity_links WHERE canonical = %s"
                " ORDER BY linked_at, member",
                (canonical,),
            )
            return [
                LinkRow(
                    UserRef.parse(r["member"]),
                    UserRef.parse(r["canonical"]),
                    datetime.fromtimestamp(float(r["linked_at"]), UTC),
                    str(r["linked_by"]),
                )
                for r in await cur.fetchall()
            ]

        return await self.db.read(q)

    async def linked_dm_keys(self, user: UserRef) -> tuple[str, ...]:
        async def q(conn: Connection) -> tuple[str, ...]:
            keys: list[str] = []
            for member in await members_of(conn, str(user)):
                ref = UserRef.parse(member)
                if ref == user:
                    continue
                cur = await conn.execute(
                    "SELECT DISTINCT chat_key FROM sessions WHERE platform = %s AND user_id = %s"
                    " AND starts_with(chat_key, %s) AND source != 'cron' ORDER BY chat_key",
                    (ref.platform, ref.user_id, f"{ref.platform}:dm:"),
                )
                keys += [str(r["chat_key"]) for r in await cur.fetchall()]
            return tuple(keys)

        return await self.db.read(q)
