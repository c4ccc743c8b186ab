"""The tokens that bind an MCP client to one person (``mnemo mcp token …``).

A token is ``mnemo_mcp_<id>_<secret>``: ``id`` is public (``mnemo mcp token list``
shows it, ``revoke`` takes it), the secret is 256 random bits. Only the SHA-256 of the
whole token is stored, so the database never holds a working token; the token itself
is shown once, when it is created. A token is refused once revoked or past its expiry,
and every check reads the database, so a revocation applies to the next request of a
client that is already connected.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from mnemo.gateway.mcp.store import McpRepository, TokenRow
from mnemo.memory.scope import UserRef

PREFIX = "mnemo_mcp_"
_DURATION = re.compile(r"(\d+)\s*([mhdw])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86_400, "w": 604_800}


@dataclass(frozen=True, slots=True)
class Grant:
    """What one request may do: act for ``person``, writing only unless ``read_only``."""

    token_id: str
    person: UserRef
    read_only: bool


@dataclass(frozen=True, slots=True)
class NewToken:
    token: str  # shown once
    row: TokenRow


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w`` → seconds; raises ValueError."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None or int(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m or 2w")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Tokens:
    def __init__(self, repo: McpRepository, clock: Callable[[], float] = time.time) -> None:
        self.repo = repo
        self.clock = clock

    async def create(
        self, user: UserRef, *, read_only: bool = False, expires_in_s: float | None = None
    ) -> NewToken:
        token_id = secrets.token_hex(6)
        token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        now = self.clock()
        expires = None if expires_in_s is None else now + expires_in_s
        await self.repo.add_token(
            token_id, digest(token), user, read_only=read_only, at=now, expires_at=expires
        )
        return NewToken(token, TokenRow(token_id, user, read_only, now, expires, None, None))

    async def verify(self, token: str) -> Grant | None:
        """The grant of an active token; None for anything else (unknown, revoked, expired)."""
        if not token.startswith(PREFIX):
            return None
        row = await self.repo.token_by_hash(digest(token))
        now = self.clock()
        if row is None or row.state(now) != "active":
            return None
        await self.repo.touch_token(row.id, now)
        return Grant(row.id, row.user, row.read_only)

    async def list(self) -> list[TokenRow]:
        return await self.repo.tokens()

    async def revoke(self, token_or_id: str) -> str | None:
        """The id of the token revoked; None when no active token has it."""
        token_id = token_or_id.strip()
        if token_id.startswith(PREFIX):
            token_id = token_id[len(PREFIX) :].split("_", 1)[0]
        return token_id if await self.repo.revoke_token(token_id, self.clock()) else None
