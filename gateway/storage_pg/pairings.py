"""``PairingRepository`` on PostgreSQL (see ``gateway/inbound/access.py`` for the rules)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from mnemo.gateway.inbound.access import _CODE_ALPHABET, PAIRING_TTL_S, Pairing
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.scope import UserRef


def _pairing(r: Mapping[str, Any]) -> Pairing:
    return Pairing(
        r["code"], UserRef(r["platform"], r["user_id"]), r["user_name"], r["state"], r["created_at"]
    )


class PgPairingStore:
    """``PairingRepository`` on PostgreSQL."""

    def __init__(self, db: PgDatabase, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    async def is_paired(self, user: UserRef) -> bool:
        async def q(conn: Connection) -> bool:
            cur = await conn.execute(
                "SELECT 1 FROM pairings WHERE platform = %s AND user_id = %s AND state = 'approved' LIMIT 1",
                (user.platform, user.user_id),
            )
            return await cur.fetchone() is not None

        return await self.db.read(q)

    async def request(self, user: UserRef, user_name: str) -> str:
        now = self._clock()

        async def tx(conn: Connection) -> str:
            # Two replicas answering the same user at once must hand out one code.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"pair:{user.platform}:{user.user_id}",),
            )
            r = await (
                await conn.execute(
                    "SELECT code FROM pairings WHERE platform = %s AND user_id = %s AND state = 'pending'"
                    " AND created_at > %s ORDER BY created_at DESC LIMIT 1",
                    (user.platform, user.user_id, now - PAIRING_TTL_S),
                )
            ).fetchone()
            if r is not None:
                return str(r["code"])
            code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(8))
            await conn.execute(
                "INSERT INTO pairings(code, platform, user_id, user_name, created_at) VALUES (%s, %s, %s, %s, %s)",
                (code, user.platform, user.user_id, user_name, now),
            )
            return code

        return await self.db.write(tx)

    async def decide(self, code: str, approve: bool, by: str) -> Pairing | None:
        now = self._clock()
        code = code.strip().upper()
        state = "approved" if approve else "denied"

        async def tx(conn: Connection) -> Pairing | None:
            r = await (
                await conn.execute(
                    "UPDATE pairings SET state = %s, decided_at = %s, decided_by = %s"
                    " WHERE code = %s AND state = 'pending' AND created_at > %s RETURNING *",
                    (state, now, by, code, now - PAIRING_TTL_S),
                )
            ).fetchone()
            return None if r is None else _pairing(r)

        return await self.db.write(tx)

    async def pending(self) -> list[Pairing]:
        now = self._clock()

        async def q(conn: Connection) -> list[Pairing]:
            cur = await conn.execute(
                "SELECT * FROM pairings WHERE state = 'pending' AND created_at > %s ORDER BY created_at",
                (now - PAIRING_TTL_S,),
            )
            return [_pairing(r) for r in await cur.fetchall()]

        return await self.db.read(q)

    async def revoke(self, user: UserRef) -> int:
        async def tx(conn: Connection) -> int:
            cur = await conn.execute(
                "UPDATE pairings SET state = 'denied' WHERE platform = %s AND user_id = %s AND state = 'approved'",
                (user.platform, user.user_id),
            )
            return cur.rowcount

        return await self.db.write(tx)
