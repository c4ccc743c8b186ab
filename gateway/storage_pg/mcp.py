"""``McpRepository`` on PostgreSQL (rules and row shapes in ``gateway/mcp/store.py``).

Several replicas share the rows: a catalog is added under a transaction-scoped advisory
lock, so two replicas fetching the same tools at once store it once; every replica
polls ``mcp_reloads`` and the first to finish a generation writes its report.
"""

from __future__ import annotations

from collections.abc import Sequence

from mnemo.gateway.mcp.store import (
    CatalogRow,
    ReloadState,
    TokenRow,
    catalog_row,
    like_prefix,
    reload_state,
    token_row,
)
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration
from mnemo.memory.scope import UserRef

MCP = PgMigration(
    "0017_mcp",
    """
CREATE TABLE mcp_tokens (
    id text PRIMARY KEY,
    token_hash text NOT NULL UNIQUE,
    "user" text NOT NULL,
    read_only boolean NOT NULL DEFAULT false,
    created_at double precision NOT NULL,
    expires_at double precision,
    revoked_at double precision,
    last_used_at double precision
);
CREATE TABLE mcp_catalogs (
    version bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at double precision NOT NULL,
    digest text NOT NULL,
    tools text NOT NULL
);
CREATE INDEX mcp_catalogs_created ON mcp_catalogs (created_at);
CREATE TABLE mcp_reloads (
    generation bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    requested_at double precision NOT NULL,
    done_at double precision,
    done_by text,
    report text
);
""",
)


class PgMcpStore:
    """``McpRepository`` on PostgreSQL."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    async def add_token(
        self,
        token_id: str,
        token_hash: str,
        user: UserRef,
        *,
        read_only: bool,
        at: float,
        expires_at: float | None,
    ) -> None:
        async def tx(conn: Connection) -> None:
            await conn.execute(
                'INSERT INTO mcp_tokens(id, token_hash, "user", read_only, created_at, expires_at)'
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (token_id, token_hash, str(user), read_only, at, expires_at),
            )

        await self.db.write(tx)

    async def token_by_hash(self, token_hash: str) -> TokenRow | None:
        async def q(conn: Connection) -> TokenRow | None:
            r = await (
                await conn.execute("SELECT * FROM mcp_tokens WHERE token_hash = %s", (token_hash,))
            ).fetchone()
            return None if r is None else token_row(r)

        return await self.db.read(q)

    async def tokens(self) -> list[TokenRow]:
        async def q(conn: Connection) -> list[TokenRow]:
            rows = await (await conn.execute("SELECT * FROM mcp_tokens ORDER BY created_at, id")).fetchall()
            return [token_row(r) for r in rows]

        return await self.db.read(q)

    async def revoke_token(self, token_id: str, at: float) -> bool:
        async def tx(conn: Connection) -> bool:
            cur = await conn.execute(
                "UPDATE mcp_tokens SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL", (at, token_id)
            )
            return cur.rowcount > 0

        return await self.db.write(tx)

    async def touch_token(self, token_id: str, at: float) -> None:
        async def tx(conn: Connection) -> None:
            await conn.execute("UPDATE mcp_tokens SET last_used_at = %s WHERE id = %s", (at, token_id))

        await self.db.write(tx)

    async def add_catalog(self, digest: str, tools: str, at: float) -> CatalogRow:
        async def tx(conn: Connection) -> CatalogRow:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('mcp_catalogs', 0))")
            newest = await (
                await conn.execute("SELECT * FROM mcp_catalogs ORDER BY version DESC LIMIT 1")
            ).fetchone()
            if newest is not None and newest["digest"] == digest:
                return catalog_row(newest)
            r = await (
                await conn.execute(
                    "INSERT INTO mcp_catalogs(created_at, digest, tools) VALUES (%s, %s, %s) RETURNING *",
                    (at, digest, tools),
                )
            ).fetchone()
            assert r is not None
            return catalog_row(r)

        return await self.db.write(tx)

    async def catalog_at(self, at: float) -> CatalogRow | None:
        async def q(conn: Connection) -> CatalogRow | None:
            r = await (
                await conn.execute(
                    "SELECT * FROM mcp_catalogs WHERE created_at <= %s"
                    " ORDER BY created_at DESC, version DESC LIMIT 1",
                    (at,),
                )
            ).fetchone()
            return None if r is None else catalog_row(r)

        return await self.db.read(q)

    async def request_reload(self, at: float) -> int:
        async def tx(conn: Connection) -> int:
            r = await (
                await conn.execute(
                    "INSERT INTO mcp_reloads(requested_at) VALUES (%s) RETURNING generation", (at,)
                )
            ).fetchone()
            assert r is not None
            return int(r["generation"])

        return await self.db.write(tx)

    async def last_reload(self) -> int:
        async def q(conn: Connection) -> int:
            r = await (await conn.execute("SELECT max(generation) AS g FROM mcp_reloads")).fetchone()
            return int(r["g"] or 0) if r is not None else 0

        return await self.db.read(q)

    async def finish_reload(self, generation: int, at: float, by: str, report: str) -> None:
        async def tx(conn: Connection) -> None:
            await conn.execute(
                "UPDATE mcp_reloads SET done_at = %s, done_by = %s, report = %s"
                " WHERE generation = %s AND done_at IS NULL",
                (at, by, report, generation),
            )

        await self.db.write(tx)

    async def reload_state(self, generation: int) -> ReloadState | None:
        async def q(conn: Connection) -> ReloadState | None:
            r = await (
                await conn.execute("SELECT * FROM mcp_reloads WHERE generation = %s", (generation,))
            ).fetchone()
            return None if r is None else reload_state(r)

        return await self.db.read(q)

    async def dm_keys(self, accounts: Sequence[UserRef]) -> tuple[str, ...]:
        async def q(conn: Connection) -> tuple[str, ...]:
            keys: list[str] = []
            for ref in accounts:
                rows = await (
                    await conn.execute(
                        "SELECT DISTINCT chat_key FROM sessions WHERE platform = %s AND user_id = %s"
                        " AND chat_key LIKE %s AND source != 'cron' ORDER BY chat_key",
                        (ref.platform, ref.user_id, like_prefix(f"{ref.platform}:dm:")),
                    )
                ).fetchall()
                keys += [r["chat_key"] for r in rows]
            return tuple(dict.fromkeys(keys))

        return await self.db.read(q)
