"""MCP's repository: client tokens, tool catalogs, reload requests (``McpRepository``).

``McpStore`` keeps them in ``state.db`` (tables in ``schema.py``); ``PgMcpStore``
(``gateway/storage_pg/mcp.py``) in PostgreSQL. Both pass ``tests/contract/test_mcp.py``.
Times are unix seconds from the caller, so a test moves them without sleeping.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mnemo.memory.db import Database
from mnemo.memory.scope import UserRef


@dataclass(frozen=True, slots=True)
class TokenRow:
    id: str
    user: UserRef
    read_only: bool
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None

    def state(self, now: float) -> str:
        """``active``, ``revoked`` or ``expired``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True, slots=True)
class CatalogRow:
    version: int
    created_at: float
    digest: str
    tools: str  # JSON (``catalog.Catalog.from_json``)


@dataclass(frozen=True, slots=True)
class ReloadState:
    generation: int
    requested_at: float
    done_at: float | None
    done_by: str | None
    report: str | None  # JSON


class McpRepository(Protocol):
    """What ``gateway/mcp`` stores. The CLI (tokens, reload requests), ``mnemo mcp
    serve`` (token checks, the person's chats) and the running gateway (catalogs,
    reloads) call it; raises ``StoreError`` on a database failure."""

    async def add_token(
        self,
        token_id: str,
        token_hash: str,
        user: UserRef,
        *,
        read_only: bool,
        at: float,
        expires_at: float | None,
    ) -> None: ...

    async def token_by_hash(self, token_hash: str) -> TokenRow | None: ...

    async def tokens(self) -> list[TokenRow]: ...

    async def revoke_token(self, token_id: str, at: float) -> bool:
        """False when no unrevoked token has that id."""
        ...

    async def touch_token(self, token_id: str, at: float) -> None: ...

    async def add_catalog(self, digest: str, tools: str, at: float) -> CatalogRow:
        """Store a catalog unless the newest one has the same digest (that one is returned)."""
        ...

    async def catalog_at(self, at: float) -> CatalogRow | None:
        """The newest catalog created at or before ``at``."""
        ...

    async def request_reload(self, at: float) -> int:
        """A new reload request; returns its generation."""
        ...

    async def last_reload(self) -> int:
        """The newest generation requested (0: none)."""
        ...

    async def finish_reload(self, generation: int, at: float, by: str, report: str) -> None:
        """Record the first report of a generation (later ones change nothing)."""
        ...

    async def reload_state(self, generation: int) -> ReloadState | None: ...

    async def dm_keys(self, accounts: Sequence[UserRef]) -> tuple[str, ...]:
        """The chat keys of these accounts' direct-message conversations."""
        ...


def token_row(r: Mapping[str, Any]) -> TokenRow:
    return TokenRow(
        id=r["id"],
        user=UserRef.parse(r["user"]),
        read_only=bool(r["read_only"]),
        created_at=float(r["created_at"]),
        expires_at=None if r["expires_at"] is None else float(r["expires_at"]),
        revoked_at=None if r["revoked_at"] is None else float(r["revoked_at"]),
        last_used_at=None if r["last_used_at"] is None else float(r["last_used_at"]),
    )


def catalog_row(r: Mapping[str, Any]) -> CatalogRow:
    return CatalogRow(int(r["version"]), float(r["created_at"]), r["digest"], r["tools"])


def reload_state(r: Mapping[str, Any]) -> ReloadState:
    return ReloadState(
        int(r["generation"]),
        float(r["requested_at"]),
        None if r["done_at"] is None else float(r["done_at"]),
        r["done_by"],
        r["report"],
    )


def like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def report_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, ensure_ascii=False, sort_keys=True)


class McpStore:
    """``McpRepository`` on ``state.db``."""

    def __init__(self, db: Database) -> None:
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
        await self.db.write(
            lambda c: c.execute(
                "INSERT INTO mcp_tokens(id, token_hash, user, read_only, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (token_id, token_hash, str(user), int(read_only), at, expires_at),
            )
        )

    async def token_by_hash(self, token_hash: str) -> TokenRow | None:
        row = await self.db.read(
            lambda c: c.execute("SELECT * FROM mcp_tokens WHERE token_hash = ?", (token_hash,)).fetchone()
        )
        return None if row is None else token_row(row)

    async def tokens(self) -> list[TokenRow]:
        rows = await self.db.read(
            lambda c: c.execute("SELECT * FROM mcp_tokens ORDER BY created_at, id").fetchall()
        )
        return [token_row(r) for r in rows]

    async def revoke_token(self, token_id: str, at: float) -> bool:
        def tx(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE mcp_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (at, token_id)
            )
            return cur.rowcount > 0

        return await self.db.write(tx)

    async def touch_token(self, token_id: str, at: float) -> None:
        await self.db.write(
            lambda c: c.execute("UPDATE mcp_tokens SET last_used_at = ? WHERE id = ?", (at, token_id))
        )

    async def add_catalog(self, digest: str, tools: str, at: float) -> CatalogRow:
        def tx(c: sqlite3.Connection) -> CatalogRow:
            newest = c.execute("SELECT * FROM mcp_catalogs ORDER BY version DESC LIMIT 1").fetchone()
            if newest is not None and newest["digest"] == digest:
                return catalog_row(newest)
            cur = c.execute(
                "INSERT INTO mcp_catalogs(created_at, digest, tools) VALUES (?, ?, ?)", (at, digest, tools)
            )
            assert cur.lastrowid is not None
            return CatalogRow(cur.lastrowid, at, digest, tools)

        return await self.db.write(tx)

    async def catalog_at(self, at: float) -> CatalogRow | None:
        row = await self.db.read(
            lambda c: c.execute(
                "SELECT * FROM mcp_catalogs WHERE created_at <= ? ORDER BY created_at DESC, version DESC LIMIT 1",
                (at,),
            ).fetchone()
        )
        return None if row is None else catalog_row(row)

    async def request_reload(self, at: float) -> int:
        def tx(c: sqlite3.Connection) -> int:
            cur = c.execute("INSERT INTO mcp_reloads(requested_at) VALUES (?)", (at,))
            assert cur.lastrowid is not None
            return cur.lastrowid

        return await self.db.write(tx)

    async def last_reload(self) -> int:
        row = await self.db.read(lambda c: c.execute("SELECT max(generation) FROM mcp_reloads").fetchone())
        return int(row[0] or 0)

    async def finish_reload(self, generation: int, at: float, by: str, report: str) -> None:
        await self.db.write(
            lambda c: c.execute(
                "UPDATE mcp_reloads SET done_at = ?, done_by = ?, report = ? WHERE generation = ? AND done_at IS NULL",
                (at, by, report, generation),
            )
        )

    async def reload_state(self, generation: int) -> ReloadState | None:
        row = await self.db.read(
            lambda c: c.execute("SELECT * FROM mcp_reloads WHERE generation = ?", (generation,)).fetchone()
        )
        return None if row is None else reload_state(row)

    async def dm_keys(self, accounts: Sequence[UserRef]) -> tuple[str, ...]:
        def q(c: sqlite3.Connection) -> tuple[str, ...]:
            keys: list[str] = []
            for ref in accounts:
                keys += [
                    r[0]
                    for r in c.execute(
                        "SELECT DISTINCT chat_key FROM sessions WHERE platform = ? AND user_id = ?"
                        " AND chat_key LIKE ? ESCAPE '\\' AND source != 'cron' ORDER BY chat_key",
                        (ref.platform, ref.user_id, like_prefix(f"{ref.platform}:dm:")),
                    )
                ]
            return tuple(dict.fromkeys(keys))

        return await self.db.read(q)
