"""Linked identities: one person's accounts on several platforms (tables in ``schema.py``).

A link is made only when both accounts act: ``/link`` on one gives a one-time code
(``issue_code``; ten minutes, stored as its SHA-256 digest, one pending per account),
``/link CODE`` from the other redeems it (``redeem``). An admin may link two accounts
from the CLI (``link``). The issuing side's person is kept: its canonical account
stays canonical and the other side's accounts join it.

What linked accounts share, keyed by the canonical account: the USER.md
(``MemoryFiles.user`` resolves it), the budget (``gateway/budgets/ledger.py`` counts
spend and reads caps by it) and the external providers' scope (``MemoryManager`` sets
``ProviderContext.person``). Sessions, history and search scopes stay per chat.

Linking merges the other side's USER.md into the canonical one once, entry by entry
through ``CuratedFile.add`` — so the threat scan and the char limit apply as to any
write; a duplicate is skipped, an entry refused or over the limit is left out and
counted. When both profiles had entries, a note says they were merged so the model
resolves any disagreement with the person instead of trusting one side. The merge runs
inside the transaction that writes the links (a failed write leaves the links as they
were); the other side's old file is removed after the commit. Unlinking an account
gives it a copy of the shared profile; if it was the canonical one, the next linked
account becomes canonical and receives the profile.

``Identities`` (``memory/identity.py``) is this process's copy of the table for the
sync readers; every change bumps ``identity_generation`` and ``refresh`` re-reads the
table when the generation moved (another process, e.g. ``mnemo users link``).

``LinkRepository`` is the port; the storage backend builds it (``StorageBackend.links``):
``IdentityLinks`` here on ``state.db``, ``PgIdentityLinks`` (``storage_pg/links.py``) on
PostgreSQL. Both share ``LinkRules`` — the profile merge, the copies, what follows a
commit — and differ only in their SQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from mnemo.gateway.logs import get_logger
from mnemo.memory.db import Database
from mnemo.memory.identity import Identities
from mnemo.memory.ports import CuratedRepository
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

CODE_TTL_S = 600
UNDO_WINDOW_S = 24 * 3600  # /link undo: how long the newest link may be taken back
CODE_LEN = 8
# No 0/O, 1/I/L: the code is read on one screen and typed on another.
_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"


def code_hash(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("ascii", "replace")).hexdigest()


def normalize_code(code: str) -> str:
    return "".join(ch for ch in code.upper() if ch.isalnum())


class Redeemed(StrEnum):
    LINKED = "linked"
    ALREADY = "already"  # both accounts were already the same person
    WRONG = "wrong"  # no such code (or already used)
    EXPIRED = "expired"
    OWN = "own"  # the code was asked for by this very account


@dataclass(frozen=True, slots=True)
class LinkResult:
    status: Redeemed
    canonical: UserRef | None = None
    members: tuple[UserRef, ...] = ()
    merged: int = 0  # entries of the other side's profile added to the shared one
    left_out: int = 0  # entries refused by the scan or over the limit


@dataclass(frozen=True, slots=True)
class UnlinkResult:
    user: UserRef
    was_linked: bool
    canonical: UserRef | None = None  # the canonical account of the accounts still linked
    remaining: tuple[UserRef, ...] = ()


@dataclass(frozen=True, slots=True)
class UndoResult:
    """``undone``: the accounts split off (() when there was nothing to undo, or it was
    too late); ``linked_at``: when the newest link was made."""

    undone: tuple[UserRef, ...] = ()
    too_late: bool = False
    linked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LinkRow:
    member: UserRef
    canonical: UserRef
    linked_at: datetime
    linked_by: str


def canonical_within(conn: sqlite3.Connection, user: str) -> str:
    row = conn.execute("SELECT canonical FROM identity_links WHERE member = ?", (user,)).fetchone()
    return str(row[0]) if row is not None else user


def members_within(conn: sqlite3.Connection, user: str) -> list[str]:
    """Every account of ``user``'s person, ``user`` included, oldest link first."""
    canonical = canonical_within(conn, user)
    rows = [
        r[0]
        for r in conn.execute(
            "SELECT member FROM identity_links WHERE canonical = ? ORDER BY linked_at, member", (canonical,)
        )
    ]
    return rows or [user]


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE identity_generation SET n = n + 1 WHERE id = 1")


class LinkRepository(Protocol):
    """Linked identities, as a storage backend keeps them. Called by ``/link``, ``mnemo
    users link|unlink|show``, the session resolver (``refresh`` before a session starts),
    erasure and the dashboard. ``identities`` is this process's map, kept current by
    every change made here and by ``refresh``. Raises ``StoreError``; ``link`` raises
    ``ValueError`` for an account linked with itself and ``OSError`` when a profile to
    merge cannot be read (nothing is linked then)."""

    identities: Identities

    async def refresh(self) -> None:
        """Re-read the links when another process (or this one) changed them."""
        ...

    async def issue_code(self, user: UserRef) -> str:
        """A new one-time code for ``user`` (their previous one stops working)."""
        ...

    async def redeem(self, code: str, user: UserRef) -> LinkResult:
        """Link ``user`` with the account that asked for ``code`` (used up once)."""
        ...

    async def link(self, a: UserRef, b: UserRef, *, by: str = "admin") -> LinkResult:
        """Link ``b``'s person into ``a``'s (``a``'s canonical account stays canonical)."""
        ...

    async def unlink(self, user: UserRef) -> UnlinkResult:
        """Split ``user`` off their person; they keep a copy of the shared profile."""
        ...

    async def members(self, user: UserRef) -> tuple[UserRef, ...]:
        """Every account of ``user``'s person, ``user`` included, oldest link first."""
        ...

    async def rows(self, user: UserRef) -> list[LinkRow]:
        """The link rows of ``user``'s person ([] when not linked)."""
        ...

    async def linked_dm_keys(self, user: UserRef) -> tuple[str, ...]:
        """The DM chats (session keys) of ``user``'s other linked accounts."""
        ...

    async def undo_latest(self, user: UserRef) -> UndoResult:
        """Take back the newest link of ``user``'s person if it is less than
        ``UNDO_WINDOW_S`` old: the accounts it joined are split off *without* a copy
        of the profile they were linked into (``/link undo``, from any account)."""
        ...


class LinkRules(ABC):
    """What every backend's links share: the profile merge and copies (through the
    curated repository: files or rows) and what follows a committed change. Reading
    and writing the link table is each backend's (the abstract methods)."""

    def __init__(
        self, files: CuratedRepository, identities: Identities, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.files = files
        self.identities = identities
        self.clock = clock
        self._refreshing = asyncio.Lock()

    @abstractmethod
    async def refresh(self) -> None:
        """Reload the links cache from this backend's table."""

    @abstractmethod
    async def rows(self, user: UserRef) -> list[LinkRow]:
        """The link rows of ``user``'s person, from this backend's table."""

    @abstractmethod
    async def unlink(self, user: UserRef) -> UnlinkResult:
        """Split ``user`` off in this backend's table (``LinkRepository.unlink``)."""

    async def undo_latest(self, user: UserRef) -> UndoResult:
        """``LinkRepository.undo_latest``: the same on every backend. A leaked code is
        the case it is for: whoever redeemed it must not walk away with a copy of the
        profile, so the split-off accounts' copies are dropped (what their own profile
        added to the shared one at the link stays there)."""
        rows = await self.rows(user)
        if not rows:
            return UndoResult()
        newest = max(r.linked_at for r in rows)
        joined = tuple(r.member for r in rows if r.linked_at == newest and r.member != r.canonical)
        if not joined:
            return UndoResult()
        if self.clock() - newest.timestamp() > UNDO_WINDOW_S:
            return UndoResult(too_late=True, linked_at=newest)
        for member in joined:
            await self.unlink(member)
            await asyncio.to_thread(self.files.drop_own, member)
        log.info("identity_link_undone", by=str(user), undone=[str(m) for m in joined])
        return UndoResult(joined, linked_at=newest)

    def _merge(self, into: UserRef, other: UserRef) -> tuple[int, int]:
        """Add ``other``'s USER.md entries to ``into``'s (blocking; inside the links'
        transaction). Returns (entries added, entries left out)."""
        source, target = self.files.own(other), self.files.own(into)
        theirs = source.load()
        if not theirs.readable:
            raise OSError(f"the profile of {other} cannot be read: {'; '.join(theirs.warnings)}")
        mine = target.load()
        if not mine.readable:
            raise OSError(f"the profile of {into} cannot be read: {'; '.join(mine.warnings)}")
        new = [e for e in theirs.entries if e not in mine.entries]
        if not new:
            return 0, 0
        if mine.entries:
            day = datetime.fromtimestamp(self.clock(), UTC).date().isoformat()
            target.add(
                f"On {day} the profiles of {into} and {other} (the same person on two accounts) were "
                "merged; where entries below disagree, ask them which one holds."
            )
        merged = sum(1 for entry in new if target.add(entry).changed)
        return merged, len(new) - merged

    def _copy(self, source: UserRef, dest: UserRef) -> None:
        """``dest``'s own USER.md becomes a copy of ``source``'s (removed if there is none):
        files or rows, whichever the curated repository keeps (``memory/ports.py``)."""
        self.files.copy_own(source, dest)

    async def _after(self, result: LinkResult, plan: list[tuple[UserRef, UserRef]]) -> None:
        for other, into in plan if result.status is Redeemed.LINKED else ():
            await asyncio.to_thread(self.files.drop_own, other)
            log.info(
                "identity_linked",
                canonical=str(into),
                joined=str(other),
                merged=result.merged,
                left_out=result.left_out,
            )
        await self.refresh()


class IdentityLinks(LinkRules):
    """``LinkRepository`` on ``state.db``."""

    def __init__(
        self,
        db: Database,
        files: CuratedRepository,
        identities: Identities,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(files, identities, clock=clock)
        self.db = db

    # --- this process's map ----------------------------------------------------------
    async def refresh(self) -> None:
        """Re-read the links when another process (or this one) changed them."""
        generation = await self.db.read(
            lambda conn: int(conn.execute("SELECT n FROM identity_generation WHERE id = 1").fetchone()[0])
        )
        if generation == self.identities.generation:
            return
        async with self._refreshing:

            def q(conn: sqlite3.Connection) -> tuple[int, list[tuple[UserRef, UserRef]]]:
                n = int(conn.execute("SELECT n FROM identity_generation WHERE id = 1").fetchone()[0])
                rows = conn.execute("SELECT member, canonical FROM identity_links").fetchall()
                return n, [(UserRef.parse(m), UserRef.parse(c)) for m, c in rows]

            n, pairs = await self.db.read(q)
            self.identities.replace(pairs, n)

    # --- codes -------------------------------------------------------------------------
    async def issue_code(self, user: UserRef) -> str:
        """A new one-time code for ``user`` (their previous one stops working)."""
        code = "".join(secrets.choice(_ALPHABET) for _ in range(CODE_LEN))
        now = self.clock()

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM link_codes WHERE expires_at < ? OR user = ?", (now, str(user)))
            conn.execute(
                "INSERT INTO link_codes (code_hash, user, expires_at) VALUES (?, ?, ?)",
                (code_hash(code), str(user), now + CODE_TTL_S),
            )

        await self.db.write(tx)
        return code

    async def redeem(self, code: str, user: UserRef) -> LinkResult:
        """Link ``user`` with the account that asked for ``code``. A wrong, used or expired
        code links nothing (an expired one is deleted); the right one is used up."""
        digest = code_hash(code)
        now = self.clock()
        plan: list[tuple[UserRef, UserRef]] = []

        def tx(conn: sqlite3.Connection) -> LinkResult:
            row = conn.execute(
                "SELECT user, expires_at FROM link_codes WHERE code_hash = ?", (digest,)
            ).fetchone()
            if row is None:
                return LinkResult(Redeemed.WRONG)
            issuer = UserRef.parse(row[0])
            if issuer == user:
                return LinkResult(Redeemed.OWN)
            conn.execute("DELETE FROM link_codes WHERE code_hash = ?", (digest,))
            if float(row[1]) < now:
                return LinkResult(Redeemed.EXPIRED)
            return self._link_within(conn, issuer, user, "code", now, plan)

        result = await self.db.write(tx)
        await self._after(result, plan)
        return result

    # --- links -------------------------------------------------------------------------
    async def link(self, a: UserRef, b: UserRef, *, by: str = "admin") -> LinkResult:
        """Link ``b``'s person into ``a``'s (``a``'s canonical account stays canonical)."""
        if a == b:
            raise ValueError(f"{a} cannot be linked with itself")
        now = self.clock()
        plan: list[tuple[UserRef, UserRef]] = []
        result = await self.db.write(lambda conn: self._link_within(conn, a, b, by, now, plan))
        await self._after(result, plan)
        return result

    def _link_within(
        self,
        conn: sqlite3.Connection,
        a: UserRef,
        b: UserRef,
        by: str,
        now: float,
        plan: list[tuple[UserRef, UserRef]],
    ) -> LinkResult:
        ca, cb = canonical_within(conn, str(a)), canonical_within(conn, str(b))
        if ca == cb:
            members = tuple(UserRef.parse(m) for m in members_within(conn, ca))
            return LinkResult(Redeemed.ALREADY, UserRef.parse(ca), members)
        joining = members_within(conn, cb)
        into, other = UserRef.parse(ca), UserRef.parse(cb)
        merged, left_out = self._merge(into, other)
        conn.execute(
            "INSERT OR IGNORE INTO identity_links (member, canonical, linked_at, linked_by) VALUES (?, ?, ?, ?)",
            (ca, ca, now, by),
        )
        for member in joining:
            conn.execute(
                "INSERT INTO identity_links (member, canonical, linked_at, linked_by) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (member) DO UPDATE SET canonical = excluded.canonical,"
                " linked_at = excluded.linked_at, linked_by = excluded.linked_by",
                (member, ca, now, by),
            )
        # The person's own caps: the joining side's apply when the canonical has none.
        conn.execute(
            "INSERT OR IGNORE INTO budget_overrides (payer, daily_usd, monthly_usd, daily_tokens, updated_at)"
            " SELECT ?, daily_usd, monthly_usd, daily_tokens, updated_at FROM budget_overrides WHERE payer = ?",
            (ca, cb),
        )
        _bump(conn)
        plan.append((other, into))  # after the commit: remove the merged-in file
        members = tuple(UserRef.parse(m) for m in members_within(conn, ca))
        return LinkResult(Redeemed.LINKED, into, members, merged, left_out)

    async def unlink(self, user: UserRef) -> UnlinkResult:
        """Split ``user`` off their person; they keep a copy of the shared profile."""

        def tx(conn: sqlite3.Connection) -> UnlinkResult:
            u = str(user)
            if conn.execute("SELECT 1 FROM identity_links WHERE member = ?", (u,)).fetchone() is None:
                return UnlinkResult(user, False)
            canonical = canonical_within(conn, u)
            rest = [m for m in members_within(conn, u) if m != u]
            conn.execute("DELETE FROM identity_links WHERE member = ?", (u,))
            if canonical == u:
                new = rest[0]  # the oldest remaining link carries the person on
                self._copy(UserRef.parse(u), UserRef.parse(new))
                conn.execute("UPDATE identity_links SET canonical = ? WHERE canonical = ?", (new, u))
                conn.execute(
                    "INSERT OR IGNORE INTO budget_overrides (payer, daily_usd, monthly_usd, daily_tokens, updated_at)"
                    " SELECT ?, daily_usd, monthly_usd, daily_tokens, updated_at FROM budget_overrides WHERE payer = ?",
                    (new, u),
                )
                canonical = new
            else:
                self._copy(UserRef.parse(canonical), user)
            if len(rest) == 1:  # one account left is no link
                conn.execute("DELETE FROM identity_links WHERE member = ?", (rest[0],))
            _bump(conn)
            return UnlinkResult(user, True, UserRef.parse(canonical), tuple(UserRef.parse(m) for m in rest))

        result = await self.db.write(tx)
        await self.refresh()
        if result.was_linked:
            log.info("identity_unlinked", user=str(user), canonical=str(result.canonical))
        return result

    # --- reading -----------------------------------------------------------------------
    async def members(self, user: UserRef) -> tuple[UserRef, ...]:
        rows = await self.db.read(lambda conn: members_within(conn, str(user)))
        return tuple(UserRef.parse(m) for m in rows)

    async def rows(self, user: UserRef) -> list[LinkRow]:
        """The link rows of ``user``'s person ([] when not linked)."""

        def q(conn: sqlite3.Connection) -> list[LinkRow]:
            canonical = canonical_within(conn, str(user))
            return [
                LinkRow(UserRef.parse(m), UserRef.parse(c), datetime.fromtimestamp(t, UTC), by)
                for m, c, t, by in conn.execute(
                    "SELECT member, canonical, linked_at, linked_by FROM identity_links WHERE canonical = ?"
                    " ORDER BY linked_at, member",
                    (canonical,),
                )
            ]

        return await self.db.read(q)

    async def linked_dm_keys(self, user: UserRef) -> tuple[str, ...]:
        """The DM chats (session keys) of ``user``'s other linked accounts."""

        def q(conn: sqlite3.Connection) -> tuple[str, ...]:
            keys: list[str] = []
            for member in members_within(conn, str(user)):
                ref = UserRef.parse(member)
                if ref == user:
                    continue
                keys += [
                    r[0]
                    for r in conn.execute(
                        "SELECT DISTINCT chat_key FROM sessions WHERE platform = ? AND user_id = ?"
                        " AND chat_key LIKE ? ESCAPE '\\' AND source != 'cron' ORDER BY chat_key",
                        (ref.platform, ref.user_id, _like_prefix(f"{ref.platform}:dm:")),
                    )
                ]
            return tuple(keys)

        return await self.db.read(q)


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
