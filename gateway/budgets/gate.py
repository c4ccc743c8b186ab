"""The budget gate: may this person's turn ask the model, and what did they spend.

The pipeline enters ``turn(user, admin=…)`` around every turn. It yields None (go on)
or a ``Refusal`` (no LLM request is made; the person is told once per reset when the
cap lifts). A capped person's turns run one at a time across all their chats, checked
after the previous one has been counted: that is what keeps ten chats at once within
one turn's cost of the cap, since a turn's cost is known only when it is over. A turn
that has started always finishes. The global cap is checked before every turn too;
turns of other people already running may take it past by what they cost.

Limits: ``budgets.per_user`` unless the person has an override (``mnemo users
budget``); admins are exempt from the per-user caps by default, never from the global
one. Days and months are those of ``gateway.timezone``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from mnemo.gateway.budgets.ledger import EVERYONE, BudgetRepository, Override, Spend
from mnemo.gateway.config import BudgetSettings
from mnemo.memory.scope import UserRef


@dataclass(frozen=True, slots=True)
class Limits:
    daily_usd: float | None = None
    monthly_usd: float | None = None
    daily_tokens: int | None = None
    exempt: bool = False  # an admin: no per-user cap

    @property
    def capped(self) -> bool:
        return not self.exempt and any(
            v is not None for v in (self.daily_usd, self.monthly_usd, self.daily_tokens)
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    cap: str  # "daily_usd" | "monthly_usd" | "daily_tokens" | "global_daily_usd"
    limit: float
    spent: float
    resets_at: datetime  # aware, in gateway.timezone
    notify: bool  # the first refusal since this cap was reached: tell the person
    checked_at: datetime

    @property
    def text(self) -> str:
        what = {
            "daily_usd": f"your daily budget (${self.limit:.2f})",
            "monthly_usd": f"your monthly budget (${self.limit:.2f})",
            "daily_tokens": f"your daily token budget ({int(self.limit):,} tokens)",
            "global_daily_usd": f"this bot's daily budget (${self.limit:.2f})",
        }[self.cap]
        return (
            f"You've reached {what}, so I won't answer until it resets: "
            f"{self.resets_at:%Y-%m-%d %H:%M} {self.resets_at.tzname()} ({_in(self.resets_at - self.checked_at)})."
        )


def _in(delta: timedelta) -> str:
    minutes = max(1, int(delta.total_seconds() // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = (
        ([f"{days} d"] if days else [])
        + ([f"{hours} h"] if hours else [])
        + ([f"{mins} min"] if mins else [])
    )
    return "in " + " ".join(parts)


def next_day(now: datetime) -> datetime:
    return datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), tzinfo=now.tzinfo)


def next_month(now: datetime) -> datetime:
    first = now.date().replace(day=1) + timedelta(days=32)
    return datetime.combine(first.replace(day=1), datetime.min.time(), tzinfo=now.tzinfo)


class BudgetGate:
    def __init__(self, settings: BudgetSettings, ledger: BudgetRepository) -> None:
        self.settings = settings
        self.ledger = ledger
        self._locks: dict[str, asyncio.Lock] = {}

    async def payer(self, user: UserRef) -> str:
        """The person whose budget it is: linked accounts share their canonical one's."""
        return await self.ledger.payer(str(user))

    async def limits(self, user: UserRef, *, admin: bool) -> Limits:
        base = self.settings.per_user
        own = await self.ledger.override(str(user)) or Override()
        return Limits(
            daily_usd=own.daily_usd if own.daily_usd is not None else base.daily_usd,
            monthly_usd=own.monthly_usd if own.monthly_usd is not None else base.monthly_usd,
            daily_tokens=own.daily_tokens if own.daily_tokens is not None else base.daily_tokens,
            exempt=admin and self.settings.admins_exempt,
        )

    @contextlib.asynccontextmanager
    async def turn(self, user: UserRef, *, admin: bool) -> AsyncIterator[Refusal | None]:
        limits = await self.limits(user, admin=admin)
        if not limits.capped:
            yield await self._check(user, limits)
            return
        # One lock per capped person for the life of the process (a few bytes each).
        async with self._locks.setdefault(await self.payer(user), asyncio.Lock()):
            yield await self._check(user, limits)

    async def check(self, user: UserRef, *, admin: bool) -> Refusal | None:
        """The caps of ``turn`` for a request made inside a running turn (a delegated
        sub-agent): without the turn's lock, which the caller holds, and without using
        up the person's one notice."""
        return await self._check(user, await self.limits(user, admin=admin), notice=False)

    async def _check(self, user: UserRef, limits: Limits, *, notice: bool = True) -> Refusal | None:
        now = self.ledger.local_now()
        found: tuple[str, float, float, datetime, str] | None = None
        glob = self.settings.global_.daily_usd
        if glob is not None:
            spent = (await self.ledger.spend(EVERYONE)).day_usd
            if spent >= glob:
                found = ("global_daily_usd", glob, spent, next_day(now), EVERYONE)
        if found is None and limits.capped:
            s = await self.ledger.spend(await self.payer(user))
            for cap, limit, spent, resets in (
                ("monthly_usd", limits.monthly_usd, s.month_usd, next_month(now)),
                ("daily_usd", limits.daily_usd, s.day_usd, next_day(now)),
                ("daily_tokens", limits.daily_tokens, s.day_tokens, next_day(now)),
            ):
                if limit is not None and spent >= limit:
                    found = (cap, float(limit), float(spent), resets, await self.payer(user))
                    break
        if found is None:
            return None
        cap, limit, spent, resets, _ = found
        # One notice per person and reset, also for the global cap.
        notify = notice and await self.ledger.claim_notice(f"{await self.payer(user)}|{cap}", resets)
        return Refusal(cap, limit, spent, resets, notify, now)

    async def report(self, user: UserRef, *, admin: bool) -> str:
        """``/usage``: today's and this month's spend against the caps."""
        limits = await self.limits(user, admin=admin)
        s: Spend = await self.ledger.spend(str(user))
        now = self.ledger.local_now()

        def of(value: float | None, fmt: str) -> str:
            return "" if value is None or limits.exempt else f" of {fmt.format(value)}"

        lines = [
            f"Your usage ({now.tzname()}):",
            (
                f"Today: ${s.day_usd:.4f}{of(limits.daily_usd, '${:.2f}')} · "
                f"{s.day_tokens:,} tokens{of(limits.daily_tokens, '{:,}')}"
            ),
            f"This month: ${s.month_usd:.4f}{of(limits.monthly_usd, '${:.2f}')}",
        ]
        if limits.exempt:
            lines.append("No personal cap (admin).")
        elif not limits.capped:
            lines.append("No personal cap is set.")
        lines.append(
            f"Daily counters reset {next_day(now):%Y-%m-%d %H:%M}, monthly {next_month(now):%Y-%m-%d}."
        )
        return "\n".join(lines)
