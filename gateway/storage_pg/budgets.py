"""``BudgetRepository`` on PostgreSQL: the same ledger as ``gateway/budgets/ledger.py``
(one row per payer and local day, a month the sum of its days, every request also on
the ``*`` row), shared by every replica.

Exact under concurrency the same way: ``record_within`` runs inside the session
store's usage transaction (``PgSessionStore.add_usage``) and adds with
``INSERT … ON CONFLICT DO UPDATE SET x = x + excluded.x``, which PostgreSQL applies
atomically per row (a concurrent insert of the same key waits and then updates), so
however many replicas spend at once nothing is counted twice or lost.

Linked accounts are one payer, as on SQLite: spend is recorded under the canonical
account, a person's spend is the sum of all their accounts' rows, their caps are the
canonical account's; each lookup reads ``identity_links`` in the same transaction as the
counters (``gateway/storage_pg/links.py``).
"""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from mnemo.gateway.budgets.ledger import (
    EVERYONE,
    UPKEEP_KEEP_DAYS,
    Clock,
    Override,
    PayerSpend,
    Spend,
    UpkeepSpend,
    upkeep_spend_of,
    utc_now,
)
from mnemo.gateway.storage_pg.links import canonical_of, members_of
from mnemo.memory.pg.db import Connection, PgDatabase, PgMigration
from mnemo.memory.usage import Usage

BUDGETS = PgMigration(
    "0010_budgets",
    """
CREATE TABLE usage_days (
    payer text NOT NULL,
    day text NOT NULL,
    cost_usd double precision NOT NULL DEFAULT 0,
    tokens bigint NOT NULL DEFAULT 0,
    requests bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (payer, day)
);
CREATE TABLE budget_overrides (
    payer text PRIMARY KEY,
    daily_usd double precision,
    monthly_usd double precision,
    daily_tokens bigint,
    updated_at double precision NOT NULL
);
CREATE TABLE budget_notices (
    payer text NOT NULL,
    resets_at text NOT NULL,
    PRIMARY KEY (payer, resets_at)
);
""",
)


UPKEEP = PgMigration(
    "0018_upkeep_requests",
    """
CREATE TABLE upkeep_requests (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at double precision NOT NULL,
    day text NOT NULL,
    session_id text NOT NULL,
    kind text NOT NULL,
    payer text,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0
);
CREATE INDEX upkeep_requests_day ON upkeep_requests (day, payer);
CREATE INDEX upkeep_requests_session ON upkeep_requests (session_id, at);
""",
)


class PgBudgets:
    """``BudgetRepository`` (``gateway/budgets/ledger.py``) on PostgreSQL."""

    def __init__(self, db: PgDatabase, *, timezone: str = "UTC", clock: Clock = utc_now) -> None:
        self._db = db
        self.tz = ZoneInfo(timezone)
        self.clock = clock

    def local_now(self) -> datetime:
        return self.clock().astimezone(self.tz)

    async def record_within(self, conn: Connection, payer: str | None, usage: Usage) -> None:
        day = self.local_now().date().isoformat()
        tokens = usage.prompt_tokens + usage.output_tokens
        if payer is not None and payer != EVERYONE:
            payer = await canonical_of(conn, payer)
        for who in (EVERYONE,) if payer is None or payer == EVERYONE else (payer, EVERYONE):
            await conn.execute(
                "INSERT INTO usage_days (payer, day, cost_usd, tokens, requests) VALUES (%s, %s, %s, %s, 1)"
                " ON CONFLICT (payer, day) DO UPDATE SET cost_usd = usage_days.cost_usd + excluded.cost_usd,"
                " tokens = usage_days.tokens + excluded.tokens, requests = usage_days.requests + 1",
                (who, day, usage.cost_usd, tokens),
            )

    async def spend(self, payer: str) -> Spend:
        date = self.local_now().date()
        today, first = date.isoformat(), date.replace(day=1).isoformat()

        async def q(conn: Connection) -> Spend:
            payers = [payer] if payer == EVERYONE else await members_of(conn, payer)
            row = await (
                await conn.execute(
                    "SELECT COALESCE(SUM(CASE WHEN day = %s THEN cost_usd END), 0) AS day_usd,"
                    " COALESCE(SUM(CASE WHEN day = %s THEN tokens END), 0) AS day_tokens,"
                    " COALESCE(SUM(cost_usd), 0) AS month_usd, COALESCE(SUM(tokens), 0) AS month_tokens,"
                    " COALESCE(SUM(CASE WHEN day = %s THEN requests END), 0) AS requests"
                    " FROM usage_days WHERE payer = ANY(%s) AND day >= %s AND day <= %s",
                    (today, today, today, payers, first, today),
                )
            ).fetchone()
            assert row is not None
            return Spend(
                float(row["day_usd"]),
                int(row["day_tokens"]),
                float(row["month_usd"]),
                int(row["month_tokens"]),
                int(row["requests"]),
            )

        return await self._db.read(q)

    async def everyone(self) -> list[PayerSpend]:
        """Every person with spend this month, highest monthly spend first (``*`` left out)."""
        first = self.local_now().date().replace(day=1).isoformat()

        async def q(conn: Connection) -> list[str]:
            rows = await (
                await conn.execute(
                    "SELECT DISTINCT COALESCE(l.canonical, u.payer) AS payer FROM usage_days u"
                    " LEFT JOIN identity_links l ON l.member = u.payer WHERE u.payer != %s AND u.day >= %s",
                    (EVERYONE, first),
                )
            ).fetchall()
            return [r["payer"] for r in rows]

        out = [PayerSpend(p, await self.spend(p)) for p in await self._db.read(q)]
        out.sort(key=lambda p: (-p.spend.month_usd, -p.spend.day_usd, p.payer))
        return out

    async def days(self, payer: str, first: date) -> dict[date, float]:
        async def q(conn: Connection) -> dict[date, float]:
            payers = [payer] if payer == EVERYONE else await members_of(conn, payer)
            rows = await (
                await conn.execute(
                    "SELECT day, SUM(cost_usd) AS cost FROM usage_days WHERE payer = ANY(%s) AND day >= %s"
                    " GROUP BY day",
                    (payers, first.isoformat()),
                )
            ).fetchall()
            return {date.fromisoformat(r["day"]): float(r["cost"]) for r in rows}

        return await self._db.read(q)

    async def override(self, payer: str) -> Override | None:
        async def q(conn: Connection) -> Override | None:
            row = await (
                await conn.execute(
                    "SELECT daily_usd, monthly_usd, daily_tokens FROM budget_overrides WHERE payer = %s",
                    (await canonical_of(conn, payer),),
                )
            ).fetchone()
            if row is None:
                return None
            tokens = row["daily_tokens"]
            return Override(row["daily_usd"], row["monthly_usd"], None if tokens is None else int(tokens))

        return await self._db.read(q)

    async def set_override(self, payer: str, override: Override | None) -> None:
        async def tx(conn: Connection) -> None:
            who = await canonical_of(conn, payer)
            if override is None:
                await conn.execute("DELETE FROM budget_overrides WHERE payer = %s", (who,))
                return
            await conn.execute(
                "INSERT INTO budget_overrides (payer, daily_usd, monthly_usd, daily_tokens, updated_at)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (payer) DO UPDATE SET daily_usd = excluded.daily_usd,"
                " monthly_usd = excluded.monthly_usd, daily_tokens = excluded.daily_tokens,"
                " updated_at = excluded.updated_at",
                (who, override.daily_usd, override.monthly_usd, override.daily_tokens, time.time()),
            )

        await self._db.write(tx)

    async def claim_notice(self, payer: str, resets_at: datetime) -> bool:
        """True exactly once per payer and reset time, across every replica."""

        async def tx(conn: Connection) -> bool:
            cur = await conn.execute(
                "INSERT INTO budget_notices (payer, resets_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (payer, resets_at.astimezone(UTC).isoformat()),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def payer(self, user: str) -> str:
        """Whose budget ``user``'s requests count against: their canonical account."""
        return await self._db.read(lambda conn: canonical_of(conn, user))

    async def record_spend(self, payer: str | None, usage: Usage) -> None:
        await self._db.write(lambda conn: self.record_within(conn, payer, usage))

    async def record_upkeep(self, session_id: str, kind: str, payer: str | None, usage: Usage) -> None:
        now = self.clock()
        day = self.local_now().date()

        async def tx(conn: Connection) -> None:
            who = await canonical_of(conn, payer) if payer is not None else None
            await conn.execute(
                "INSERT INTO upkeep_requests (at, day, session_id, kind, payer, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, cost_usd)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
            await conn.execute(
                "DELETE FROM upkeep_requests WHERE day < %s",
                ((day - timedelta(days=UPKEEP_KEEP_DAYS)).isoformat(),),
            )

        await self._db.write(tx)

    async def upkeep_spend(self, payer: str | None) -> UpkeepSpend:
        today = self.local_now().date()

        async def q(conn: Connection) -> UpkeepSpend:
            payers = None if payer is None else await members_of(conn, payer)
            who = "TRUE" if payers is None else "payer = ANY(%s)"
            args: list[object] = [] if payers is None else [payers]
            kinds = await (
                await conn.execute(
                    "SELECT kind, COUNT(*) AS n, SUM(input_tokens) AS i, SUM(cache_read_tokens) AS r,"
                    " SUM(cache_write_tokens) AS w, SUM(output_tokens) AS o, SUM(cost_usd) AS c"
                    f" FROM upkeep_requests WHERE day = %s AND {who} GROUP BY kind ORDER BY kind",
                    (today.isoformat(), *args),
                )
            ).fetchall()
            month = await (
                await conn.execute(
                    "SELECT COALESCE(SUM(cost_usd), 0) AS c FROM upkeep_requests"
                    f" WHERE day >= %s AND day <= %s AND {who}",
                    (today.replace(day=1).isoformat(), today.isoformat(), *args),
                )
            ).fetchone()
            assert month is not None
            rows = [(r["kind"], r["n"], r["i"], r["r"], r["w"], r["o"], float(r["c"])) for r in kinds]
            return upkeep_spend_of(rows, float(month["c"]))

        return await self._db.read(q)

    async def upkeep_requests_since(self, session_id: str, since: float) -> list[float]:
        async def q(conn: Connection) -> list[float]:
            rows = await (
                await conn.execute(
                    "SELECT at FROM upkeep_requests WHERE session_id = %s AND at > %s ORDER BY at",
                    (session_id, since),
                )
            ).fetchall()
            return [float(r["at"]) for r in rows]

        return await self._db.read(q)

    async def erase_within(self, conn: Connection, payer: str) -> int:
        n = 0
        for table in ("usage_days", "budget_overrides", "upkeep_requests"):
            n += (await conn.execute(f"DELETE FROM {table} WHERE payer = %s", (payer,))).rowcount
        n += (
            await conn.execute(  # notices are keyed "PAYER|cap"
                "DELETE FROM budget_notices WHERE left(payer, length(%s) + 1) = %s || '|'", (payer, payer)
            )
        ).rowcount
        return n

    async def erase(self, payer: str) -> int:
        """Forget a person's counters, overrides and notices (their spend stays in ``*``)."""
        return await self._db.write(lambda conn: self.erase_within(conn, payer))
