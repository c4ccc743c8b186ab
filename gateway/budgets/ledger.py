"""What each person spent, per local day, kept exact beside the sessions.

``record_within`` is the ``UsageRecorder`` the session store calls inside the very
write that adds a request's usage to its session (``SessionStore.add_usage``): the
counter and the session commit together or not at all, and because every write runs
on the one writer connection an ``INSERT … ON CONFLICT DO UPDATE SET x = x + ?`` can
neither double count nor lose an update, however many chats spend at once. Every
request is also added to the ``*`` row (the whole bot, for ``budgets.global``).

Days are those of ``gateway.timezone``; a month is the sum of its days. The clock is
injected so a test can cross midnight without sleeping.

Linked accounts (``gateway/people/links.py``) are one payer: spend is recorded under
the canonical account, a person's spend is the sum of all their accounts' rows (what
they spent before linking counts too), and their caps are the canonical account's.
Each lookup reads the links in the same SQL snapshot as the counters, so a link made
by another process applies at the next request.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from mnemo.gateway.budgets.charge import Billing, billed_to, current_billing
from mnemo.gateway.people.links import canonical_within, members_within
from mnemo.memory.db import Database
from mnemo.memory.usage import Usage

__all__ = ["EVERYONE", "Billing", "BudgetRepository", "SqliteBudgets", "billed_to", "current_billing"]

EVERYONE = "*"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Spend:
    """A payer's spend today and this month (local calendar)."""

    day_usd: float = 0.0
    day_tokens: int = 0
    month_usd: float = 0.0
    month_tokens: int = 0
    requests_today: int = 0


@dataclass(frozen=True, slots=True)
class UpkeepKind:
    """Today's background requests of one kind (flush, review, summary, …)."""

    kind: str
    requests: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        """Counted like the budgets' tokens: everything read, plus the output."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens + self.output_tokens

    @property
    def cache_read_share(self) -> float:
        read = self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
        return self.cache_read_tokens / read if read else 0.0


@dataclass(frozen=True, slots=True)
class UpkeepSpend:
    """A payer's (or the whole bot's) background memory work: today per kind, and this
    month's cost. Part of ``Spend`` already — shown apart, never added twice."""

    kinds: tuple[UpkeepKind, ...] = ()
    month_usd: float = 0.0

    @property
    def day_tokens(self) -> int:
        return sum(k.tokens for k in self.kinds)

    @property
    def day_usd(self) -> float:
        return sum(k.cost_usd for k in self.kinds)

    @property
    def requests_today(self) -> int:
        return sum(k.requests for k in self.kinds)


def upkeep_spend_of(rows: Sequence[Sequence[Any]], month_usd: float) -> UpkeepSpend:
    """From rows of (kind, requests, input, cache read, cache write, output, cost)."""
    kinds = tuple(
        UpkeepKind(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), float(r[6]))
        for r in rows
    )
    return UpkeepSpend(kinds, month_usd)


UPKEEP_KEEP_DAYS = 62  # a month's report and the one before; older rows are dropped


@dataclass(frozen=True, slots=True)
class PayerSpend:
    payer: str
    spend: Spend


@dataclass(frozen=True, slots=True)
class Override:
    """A person's own caps; None: the configured default applies."""

    daily_usd: float | None = None
    monthly_usd: float | None = None
    daily_tokens: int | None = None


class BudgetRepository(Protocol):
    """The spending ledger and the per-person overrides, as the storage backend builds
    it (``StorageBackend.budgets``: ``SqliteBudgets``, ``PgBudgets``). The backend binds
    its ``record_within`` into the session store's usage write when it opens, so spend
    is counted in the same transaction as the session's usage; the budget gate reads
    ``spend`` before a turn; the CLI, ``/usage`` and the dashboard read and set the
    rest. Raises ``StoreError`` on a database failure."""

    def local_now(self) -> datetime:
        """Now in the ledger's timezone (whose days and months it counts)."""
        ...

    async def spend(self, payer: str) -> Spend: ...

    async def everyone(self) -> list[PayerSpend]: ...

    async def days(self, payer: str, first: date) -> dict[date, float]:
        """``payer``'s cost per local day from ``first`` to today (days without spend
        left out); ``EVERYONE`` is the whole bot."""
        ...

    async def payer(self, user: str) -> str:
        """Whose budget ``user``'s requests count against: their canonical account."""
        ...

    async def override(self, payer: str) -> Override | None: ...

    async def set_override(self, payer: str, override: Override | None) -> None: ...

    async def claim_notice(self, payer: str, resets_at: datetime) -> bool: ...

    async def erase(self, payer: str) -> int: ...

    async def record_spend(self, payer: str | None, usage: Usage) -> None:
        """Count a request that belongs to no session (a consolidation) on its own."""
        ...

    async def record_upkeep(self, session_id: str, kind: str, payer: str | None, usage: Usage) -> None:
        """One background request of ``session_id`` (``payer`` None: nobody's). It is
        in ``usage_days`` already (``SessionStorage.add_usage``); this row is upkeep's
        own account, for its caps and to show it apart."""
        ...

    async def upkeep_spend(self, payer: str | None) -> UpkeepSpend:
        """``payer``'s background work today and this month; None: the whole bot's."""
        ...

    async def upkeep_requests_since(self, session_id: str, since: float) -> list[float]:
        """When ``session_id``'s background requests after ``since`` (epoch s) were made."""
        ...


class SqliteBudgets:
    """``BudgetRepository`` on ``state.db`` (tables in ``schema.py``)."""

    def __init__(self, db: Database, *, timezone: str = "UTC", clock: Clock = utc_now) -> None:
        self._db = db
        self.tz = ZoneInfo(timezone)
        self.clock = clock

    def local_now(self) -> datetime:
        return self.clock().astimezone(self.tz)

    def record_within(self, conn: sqlite3.Connection, payer: str | None, usage: Usage) -> None:
        day = self.local_now().date().isoformat()
        tokens = usage.prompt_tokens + usage.output_tokens
        if payer is not None and payer != EVERYONE:
            payer = canonical_within(conn, payer)
        for who in (EVERYONE,) if payer is None or payer == EVERYONE else (payer, EVERYONE):
            conn.execute(
                "INSERT INTO usage_days (payer, day, cost_usd, tokens, requests) VALUES (?, ?, ?, ?, 1)"
                " ON CONFLICT (payer, day) DO UPDATE SET cost_usd = cost_usd + excluded.cost_usd,"
                " tokens = tokens + excluded.tokens, requests = requests + 1",
                (who, day, usage.cost_usd, tokens),
            )

    async def spend(self, payer: str) -> Spend:
        today = self.local_now().date()

        def q(conn: sqlite3.Connection) -> Spend:
            payers = [payer] if payer == EVERYONE else members_within(conn, payer)
            row = conn.execute(
                "SELECT COALESCE(SUM(CASE WHEN day = ? THEN cost_usd END), 0),"
                " COALESCE(SUM(CASE WHEN day = ? THEN tokens END), 0),"
                " COALESCE(SUM(cost_usd), 0), COALESCE(SUM(tokens), 0),"
                " COALESCE(SUM(CASE WHEN day = ? THEN requests END), 0)"
                f" FROM usage_days WHERE payer IN ({','.join('?' * len(payers))}) AND day >= ? AND day <= ?",
                (
                    today.isoformat(),
                    today.isoformat(),
                    today.isoformat(),
                    *payers,
                    today.replace(day=1).isoformat(),
                    today.isoformat(),
                ),
            ).fetchone()
            return Spend(float(row[0]), int(row[1]), float(row[2]), int(row[3]), int(row[4]))

        return await self._db.read(q)

    async def everyone(self) -> list[PayerSpend]:
        """Every person with spend this month, highest monthly spend first (``*`` left out)."""
        today = self.local_now().date()

        def q(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(  # a linked person once, under their canonical account
                "SELECT DISTINCT COALESCE(l.canonical, u.payer) FROM usage_days u"
                " LEFT JOIN identity_links l ON l.member = u.payer WHERE u.payer != ? AND u.day >= ?",
                (EVERYONE, today.replace(day=1).isoformat()),
            )
            return [r[0] for r in rows]

        out = [PayerSpend(p, await self.spend(p)) for p in await self._db.read(q)]
        out.sort(key=lambda p: (-p.spend.month_usd, -p.spend.day_usd, p.payer))
        return out

    async def days(self, payer: str, first: date) -> dict[date, float]:
        def q(conn: sqlite3.Connection) -> dict[date, float]:
            payers = [payer] if payer == EVERYONE else members_within(conn, payer)
            rows = conn.execute(
                f"SELECT day, SUM(cost_usd) FROM usage_days WHERE payer IN ({','.join('?' * len(payers))})"
                " AND day >= ? GROUP BY day",
                (*payers, first.isoformat()),
            )
            return {date.fromisoformat(day): float(cost) for day, cost in rows}

        return await self._db.read(q)

    async def override(self, payer: str) -> Override | None:
        def q(conn: sqlite3.Connection) -> Override | None:
            row = conn.execute(
                "SELECT daily_usd, monthly_usd, daily_tokens FROM budget_overrides WHERE payer = ?",
                (canonical_within(conn, payer),),
            ).fetchone()
            return None if row is None else Override(row[0], row[1], row[2])

        return await self._db.read(q)

    async def set_override(self, payer: str, override: Override | None) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            who = canonical_within(conn, payer)
            if override is None:
                conn.execute("DELETE FROM budget_overrides WHERE payer = ?", (who,))
                return
            conn.execute(
                "INSERT INTO budget_overrides (payer, daily_usd, monthly_usd, daily_tokens, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (payer) DO UPDATE SET daily_usd = excluded.daily_usd,"
                " monthly_usd = excluded.monthly_usd, daily_tokens = excluded.daily_tokens,"
                " updated_at = excluded.updated_at",
                (who, override.daily_usd, override.monthly_usd, override.daily_tokens, time.time()),
            )

        await self._db.write(tx)

    async def claim_notice(self, payer: str, resets_at: datetime) -> bool:
        """True exactly once per payer and reset time: whoever gets True sends the notice."""

        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT OR IGNORE INTO budget_notices (payer, resets_at) VALUES (?, ?)",
                (payer, resets_at.astimezone(UTC).isoformat()),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def payer(self, user: str) -> str:
        """Whose budget ``user``'s requests count against: their canonical account."""
        return await self._db.read(lambda conn: canonical_within(conn, user))

    async def record_spend(self, payer: str | None, usage: Usage) -> None:
        await self._db.write(lambda conn: self.record_within(conn, payer, usage))

    async def record_upkeep(self, session_id: str, kind: str, payer: str | None, usage: Usage) -> None:
        now = self.clock()
        day = self.local_now().date()

        def tx(conn: sqlite3.Connection) -> None:
            who = canonical_within(conn, payer) if payer is not None else None
            conn.execute(
                "INSERT INTO upkeep_requests (at, day, session_id, kind, payer, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now.timestamp(),
                    day.isoformat(),
                    session_id,
                    kind,
                    who,
                    usage.input_tokens,
                    usage.output_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                    usage.cost_usd,
                ),
            )
            conn.execute(
                "DELETE FROM upkeep_requests WHERE day < ?",
                ((day - timedelta(days=UPKEEP_KEEP_DAYS)).isoformat(),),
            )

        await self._db.write(tx)

    async def upkeep_spend(self, payer: str | None) -> UpkeepSpend:
        today = self.local_now().date()

        def q(conn: sqlite3.Connection) -> UpkeepSpend:
            if payer is None:
                who, args = "1 = 1", []
            else:
                payers = members_within(conn, payer)
                who, args = f"payer IN ({','.join('?' * len(payers))})", payers
            kinds = conn.execute(
                "SELECT kind, COUNT(*), SUM(input_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens),"
                f" SUM(output_tokens), SUM(cost_usd) FROM upkeep_requests WHERE day = ? AND {who}"
                " GROUP BY kind ORDER BY kind",
                (today.isoformat(), *args),
            ).fetchall()
            month = conn.execute(
                f"SELECT COALESCE(SUM(cost_usd), 0) FROM upkeep_requests WHERE day >= ? AND day <= ? AND {who}",
                (today.replace(day=1).isoformat(), today.isoformat(), *args),
            ).fetchone()
            return upkeep_spend_of(kinds, float(month[0]))

        return await self._db.read(q)

    async def upkeep_requests_since(self, session_id: str, since: float) -> list[float]:
        def q(conn: sqlite3.Connection) -> list[float]:
            rows = conn.execute(
                "SELECT at FROM upkeep_requests WHERE session_id = ? AND at > ? ORDER BY at",
                (session_id, since),
            )
            return [float(r[0]) for r in rows]

        return await self._db.read(q)

    def erase_within(self, conn: sqlite3.Connection, payer: str) -> int:
        n = 0
        for table in ("usage_days", "budget_overrides", "upkeep_requests"):
            n += conn.execute(f"DELETE FROM {table} WHERE payer = ?", (payer,)).rowcount
        # Notices are keyed "PAYER|cap".
        n += conn.execute(
            "DELETE FROM budget_notices WHERE substr(payer, 1, length(?) + 1) = ? || '|'", (payer, payer)
        ).rowcount
        return n

    async def erase(self, payer: str) -> int:
        """Forget a person's counters, overrides and notices (their spend stays in ``*``)."""
        return await self._db.write(lambda conn: self.erase_within(conn, payer))
