"""Access control, in one place: allowlists, admins, pairing, per-user rate limits.

Rules, in order:

1. Loopback platforms (``cli``, and ``web`` — which refuses to bind a non-loopback
   address without an access token) belong to the operator: always allowed, admin.
2. Admins (``access.admins``, ``platform:id``) are always allowed.
3. A platform with an allowlist (``TELEGRAM_ALLOWED_USERS``, ``DISCORD_ALLOWED_USERS``,
   or ``access.allowed`` entries ``platform:id`` / ``platform:*``) admits exactly those
   users (plus admins and paired users).
4. Without an allowlist, the default is deny: only admins and paired users. An unknown
   user writing in a DM gets a pairing code (if ``access.pairing``) that an admin
   approves with ``/pair approve CODE`` (or ``mnemo pair approve CODE`` from a shell).
5. Discord channel allowlists restrict where the bot listens in servers.

An unauthorized user gets one polite refusal per hour (or silence, configurable); none
of their messages is stored — only the refusal log line.

The per-user rate limit is a sliding window of ``access.rate_limit_per_minute``
messages; the first message over it gets a clear "slow down" reply, further ones are
dropped silently until the window frees up. The window is a ``RateWindow`` the storage
backend builds (``StorageBackend.rate_limits``): kept in the process on SQLite, where
one process serves the bot (``RateLimiter``), shared by every replica on PostgreSQL
(``PgRateLimits``).
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from mnemo.gateway.config import Settings
from mnemo.gateway.events import InboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.memory.db import Database
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

LOOPBACK_PLATFORMS = frozenset({"cli", "web"})
REFUSAL_INTERVAL_S = 3600.0
PAIRING_TTL_S = 3600.0
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I


class Verdict(StrEnum):
    ALLOW = "allow"
    REFUSE = "refuse"  # reply with the given text (possibly a pairing code)
    DROP = "drop"  # say nothing


@dataclass(frozen=True, slots=True)
class AccessDecision:
    verdict: Verdict
    reply: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Pairing:
    code: str
    user: UserRef
    user_name: str
    state: str
    created_at: float


class PairingRepository(Protocol):
    """Pairing requests of unknown DM users. Called by ``AccessControl`` (``is_paired``,
    ``request``), ``/pair`` and ``mnemo pair`` (``pending``, ``decide``, ``revoke``).
    A code is valid for ``PAIRING_TTL_S``. Raises ``StoreError``."""

    async def is_paired(self, user: UserRef) -> bool: ...

    async def request(self, user: UserRef, user_name: str) -> str:
        """The user's pending code (a new one if none is pending or it expired)."""
        ...

    async def decide(self, code: str, approve: bool, by: str) -> Pairing | None:
        """Approve or deny a pending, unexpired code (case-insensitive); None when there is
        no such code."""
        ...

    async def pending(self) -> list[Pairing]: ...

    async def revoke(self, user: UserRef) -> int:
        """Un-pair an approved user; how many approvals were withdrawn."""
        ...


class PairingStore:
    """``PairingRepository`` on ``state.db`` (table ``pairings``, schema in
    ``schema.py``). Every backend passes ``tests/contract/test_pairings.py``."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    async def is_paired(self, user: UserRef) -> bool:
        row = await self.db.read(
            lambda c: c.execute(
                "SELECT 1 FROM pairings WHERE platform = ? AND user_id = ? AND state = 'approved' LIMIT 1",
                (user.platform, user.user_id),
            ).fetchone()
        )
        return row is not None

    async def request(self, user: UserRef, user_name: str) -> str:
        """The user's pending code (a new one if none is pending or it expired)."""
        now = self._clock()

        def tx(c: sqlite3.Connection) -> str:
            row = c.execute(
                "SELECT code FROM pairings WHERE platform = ? AND user_id = ? AND state = 'pending'"
                " AND created_at > ? ORDER BY created_at DESC LIMIT 1",
                (user.platform, user.user_id, now - PAIRING_TTL_S),
            ).fetchone()
            if row is not None:
                return str(row[0])
            code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(8))
            c.execute(
                "INSERT INTO pairings(code, platform, user_id, user_name, created_at) VALUES (?,?,?,?,?)",
                (code, user.platform, user.user_id, user_name, now),
            )
            return code

        return await self.db.write(tx)

    async def decide(self, code: str, approve: bool, by: str) -> Pairing | None:
        """Approve or deny a pending, unexpired code. None when there is no such code."""
        now = self._clock()
        code = code.strip().upper()

        def tx(c: sqlite3.Connection) -> Pairing | None:
            row = c.execute(
                "SELECT * FROM pairings WHERE code = ? AND state = 'pending' AND created_at > ?",
                (code, now - PAIRING_TTL_S),
            ).fetchone()
            if row is None:
                return None
            state = "approved" if approve else "denied"
            c.execute(
                "UPDATE pairings SET state = ?, decided_at = ?, decided_by = ? WHERE code = ?",
                (state, now, by, code),
            )
            return Pairing(
                code, UserRef(row["platform"], row["user_id"]), row["user_name"], state, row["created_at"]
            )

        return await self.db.write(tx)

    async def pending(self) -> list[Pairing]:
        now = self._clock()
        rows = await self.db.read(
            lambda c: c.execute(
                "SELECT * FROM pairings WHERE state = 'pending' AND created_at > ? ORDER BY created_at",
                (now - PAIRING_TTL_S,),
            ).fetchall()
        )
        return [
            Pairing(
                r["code"], UserRef(r["platform"], r["user_id"]), r["user_name"], r["state"], r["created_at"]
            )
            for r in rows
        ]

    async def revoke(self, user: UserRef) -> int:
        return await self.db.write(
            lambda c: (
                c.execute(
                    "UPDATE pairings SET state = 'denied' WHERE platform = ? AND user_id = ? AND state = 'approved'",
                    (user.platform, user.user_id),
                ).rowcount
            )
        )


@dataclass(frozen=True, slots=True)
class RateVerdict:
    allowed: bool
    wait_s: float = 0.0  # seconds until a slot frees (refused only)
    first_refusal: bool = False  # this refusal is the one that gets the "slow down" notice


class RateWindow(Protocol):
    """The per-user rate limit's window, built by the storage backend: ``RateLimiter``
    in this process (SQLite: one process serves the bot) or ``PgRateLimits`` shared by
    every replica (``gateway/storage_pg/rate_limits.py``). Same rules either way: a
    message is allowed while the key has fewer than ``limit`` allowed messages in the
    last 60 s (a refused one is not counted); the first refusal gets the notice, once."""

    async def hit(self, key: str, limit: int) -> RateVerdict:
        """Count one message of ``key`` against ``limit`` per minute (0: no limit)."""
        ...


WINDOW_S = 60.0


class RateLimiter:
    """``RateWindow`` kept in this process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._warned: set[str] = set()

    async def hit(self, key: str, limit: int) -> RateVerdict:
        if limit <= 0:
            return RateVerdict(True)
        now = self._clock()
        hits = self._hits.setdefault(key, deque())
        while hits and hits[0] <= now - WINDOW_S:
            hits.popleft()
        if len(hits) < limit:
            hits.append(now)
            self._warned.discard(key)
            return RateVerdict(True)
        first = key not in self._warned
        self._warned.add(key)
        return RateVerdict(False, max(0.0, hits[0] + WINDOW_S - now), first_refusal=first)

    def forget(self, key: str) -> None:
        """Drop ``key``'s window (erasure: nothing of the person stays, even here)."""
        self._hits.pop(key, None)
        self._warned.discard(key)


class AccessControl:
    def __init__(
        self,
        settings: Settings,
        pairings: PairingRepository,
        *,
        clock: Callable[[], float] = time.monotonic,
        rate: RateWindow | None = None,
    ) -> None:
        """``rate``: the storage backend's window (``StorageBackend.rate_limits``); None
        keeps one in this process on ``clock``."""
        self.settings = settings
        self.pairings = pairings
        self._admins = frozenset(settings.access.admins)
        self._allow = {
            "telegram": frozenset(settings.telegram.allowed_users),
            "discord": frozenset(settings.discord.allowed_users),
        }
        for entry in settings.access.allowed:
            platform, _, user_id = entry.partition(":")
            self._allow[platform] = self._allow.get(platform, frozenset()) | {user_id}
        self._channels = {"discord": frozenset(settings.discord.allowed_channels)}
        self.rate: RateWindow = rate if rate is not None else RateLimiter(clock)
        self._clock = clock
        self._refused_at: dict[str, float] = {}

    def is_admin(self, platform: str, user_id: str) -> bool:
        return platform in LOOPBACK_PLATFORMS or f"{platform}:{user_id}" in self._admins

    def describe(self) -> list[str]:
        """Start-up log lines: what the policy is, per configured platform."""
        lines = []
        for platform in self.settings.platform_tokens:  # an unconfigured platform has no policy to tell
            allow = self._allow[platform]
            if "*" in allow:
                lines.append(f"{platform}: every user is allowed (access.allowed has {platform}:*)")
            elif allow:
                lines.append(f"{platform}: allowlist of {len(allow)} user(s), plus admins and paired users")
            else:
                pairing = "pairing codes on" if self.settings.access.pairing else "pairing off"
                lines.append(
                    f"{platform}: no allowlist — default deny except admins and paired users ({pairing})"
                )
        return lines

    async def check(self, msg: InboundMessage) -> AccessDecision:
        user = msg.speaker
        key = str(user)
        if not self.chat_allowed(msg):
            return AccessDecision(Verdict.DROP, reason="channel not allowed")
        if not await self.user_allowed(user):
            return await self._refuse(msg, user)
        if self.is_admin(msg.platform, msg.user_id) and msg.platform in LOOPBACK_PLATFORMS:
            return AccessDecision(Verdict.ALLOW)
        verdict = await self.rate.hit(key, self.settings.access.rate_limit_per_minute)
        if not verdict.allowed:
            if verdict.first_refusal:
                return AccessDecision(
                    Verdict.REFUSE,
                    f"You're sending messages faster than I can answer. Please wait {int(verdict.wait_s) + 1} s"
                    " and try again.",
                    reason="rate limited",
                )
            return AccessDecision(Verdict.DROP, reason="rate limited")
        return AccessDecision(Verdict.ALLOW)

    # The two halves of authorization, also asked by cron before every run of a job:
    # they have no side effects (no rate limit, no refusal, no pairing code).
    def chat_allowed(self, msg: InboundMessage) -> bool:
        """Whether the bot works in this chat at all (channel allowlists)."""
        channels = self._channels.get(msg.platform)
        return not (
            channels
            and not msg.is_dm
            and msg.chat_id not in channels
            and (msg.thread_id or "") not in channels
        )

    async def user_allowed(self, user: UserRef) -> bool:
        """Admin, allowlisted or paired."""
        if self.is_admin(user.platform, user.user_id):
            return True
        allowed = self._allow.get(user.platform, frozenset())
        if user.user_id in allowed or "*" in allowed:
            return True
        return await self.pairings.is_paired(user)

    async def _refuse(self, msg: InboundMessage, user: UserRef) -> AccessDecision:
        log.info("access_refused", platform=msg.platform, user=msg.user_id, dm=msg.is_dm)
        if self.settings.access.unauthorized_reply == "silent":
            return AccessDecision(Verdict.DROP, reason="not authorized")
        key = str(user)
        now = self._clock()
        last = self._refused_at.get(key)
        if last is not None and now - last < REFUSAL_INTERVAL_S:
            return AccessDecision(Verdict.DROP, reason="not authorized (already told)")
        self._refused_at[key] = now
        if msg.is_dm and self.settings.access.pairing:
            code = await self.pairings.request(user, msg.user_name)
            return AccessDecision(
                Verdict.REFUSE,
                "Sorry, I only talk to people my operator has approved. "
                f"If you know them, send them this pairing code: {code}",
                reason="pairing code issued",
            )
        return AccessDecision(
            Verdict.REFUSE, "Sorry, I'm not available to you here.", reason="not authorized"
        )
