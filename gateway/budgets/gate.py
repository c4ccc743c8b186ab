"""The budget gate: the one place that decides whether a model request may be made.

**Every request** passes ``admit(charge)``: ``LLMClient.create`` calls it before it
sends anything (``charge.py``), so turns, cron runs, delegated work and background
work (flush, memory review, compression summaries, skill review, search digests) meet
the same caps and no new kind of request can skip them. At a cap it raises
``OverBudget`` and no request is made; background work then waits in the job queue
until the cap resets (``retry_after_s``), without using up an attempt.

**Turns and cron runs** enter ``turn(user, admin=…)`` first. It yields None (go on) or
a ``Refusal`` (the person is told once per reset — per cron job for a job's runs,
``topic``), and it *admits* the run: every request made inside the block for that
person passes ``admit`` without a new check, so a turn that has started always
finishes, tool calls and their digests included. A capped person's turns run one at a
time across all their chats, checked after the previous one has been counted: that is
what keeps ten chats at once within one turn's cost of the cap, since a turn's cost is
known only when it is over. The global cap is checked before every turn too; turns of
other people already running may take it past by what they cost.

Limits: ``budgets.per_user`` unless the person has an override (``mnemo users
budget``); admins are exempt from the per-user caps by default, never from the global
one. Days and months are those of ``gateway.timezone``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from mnemo.gateway.budgets.charge import Charge
from mnemo.gateway.budgets.ledger import EVERYONE, BudgetRepository, Override, Spend
from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import BudgetSettings
from mnemo.gateway.errors import OverBudget
from mnemo.gateway.logs import get_logger
from mnemo.memory.scope import UserRef

log = get_logger(__name__)


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


def money(usd: float) -> str:
    """A cap as set: cents when it has none smaller ($5.00, $2.50), else every digit it
    has ($0.001, not "$0.00")."""
    cents = f"{usd:.2f}"
    if abs(float(cents) - usd) < 1e-9:
        return f"${cents}"
    return "$" + format(Decimal(repr(usd)), "f")  # the shortest exact digits of the float


@dataclass(frozen=True, slots=True)
class Refusal:
    cap: str  # "daily_usd" | "monthly_usd" | "daily_tokens" | "global_daily_usd"
    limit: float
    spent: float
    resets_at: datetime  # aware, in gateway.timezone
    notify: bool  # the first refusal since this cap was reached: tell the person
    checked_at: datetime

    @property
    def what(self) -> str:
        return {
            "daily_usd": f"your daily budget ({money(self.limit)})",
            "monthly_usd": f"your monthly budget ({money(self.limit)})",
            "daily_tokens": f"your daily token budget ({int(self.limit):,} tokens)",
            "global_daily_usd": f"this bot's daily budget ({money(self.limit)})",
        }[self.cap]

    @property
    def resets(self) -> str:
        """``2026-12-02 00:00 CET (in 1 min)``"""
        return f"{self.resets_at:%Y-%m-%d %H:%M} {self.resets_at.tzname()} ({_in(self.resets_at - self.checked_at)})"

    @property
    def text(self) -> str:
        return f"You've reached {self.what}, so I won't answer until it resets: {self.resets}."

    @property
    def retry_after_s(self) -> float:
        """How long background work waits: until the reset (at least a second)."""
        return max(1.0, (self.resets_at - self.checked_at).total_seconds())


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


@dataclass(slots=True)
class _Admission:
    """A turn or cron run let in by ``turn``: its person's requests pass while it runs.
    Closed when the block ends, so a task the turn started and left running (which
    inherits the context) is checked like any other request."""

    user: str
    open: bool = True


_ADMITTED: ContextVar[_Admission | None] = ContextVar("mnemo_admitted_turn", default=None)


class BudgetGate:
    """Implements the client's ``RequestGate`` (``admit``) and the pipeline's
    ``TurnBudget`` (``turn``); ``/usage`` reads ``report``."""

    def __init__(
        self, settings: BudgetSettings, ledger: BudgetRepository, upkeep: Upkeep | None = None
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.upkeep = upkeep  # memory.upkeep's caps on background work (``upkeep.py``)
        self._locks: dict[str, asyncio.Lock] = {}

    async def payer(self, user: UserRef) -> str:
        """The person whose budget it is: linked accounts share their canonical one's."""
        return await self.ledger.payer(str(user))

    async def limits(self, user: UserRef | None, *, admin: bool) -> Limits:
        if user is None:
            return Limits()  # nobody's: the global cap only
        base = self.settings.per_user
        own = await self.ledger.override(str(user)) or Override()
        return Limits(
            daily_usd=own.daily_usd if own.daily_usd is not None else base.daily_usd,
            monthly_usd=own.monthly_usd if own.monthly_usd is not None else base.monthly_usd,
            daily_tokens=own.daily_tokens if own.daily_tokens is not None else base.daily_tokens,
            exempt=admin and self.settings.admins_exempt,
        )

    async def admit(self, charge: Charge) -> None:
        """The ``RequestGate`` of the LLM client: every model request comes here first."""
        if self.upkeep is not None:
            stop = await self.upkeep.check(charge)
            if stop is not None:
                log.info(
                    "upkeep_over_cap",
                    kind=charge.kind.value,
                    payer=str(charge.payer) if charge.payer is not None else None,
                    cap=stop.cap,
                    resets_at=stop.resets_at.isoformat(),
                )
                raise stop
        admitted = _ADMITTED.get()
        if (
            admitted is not None
            and admitted.open
            and charge.payer is not None
            and str(charge.payer) == admitted.user
        ):
            return  # a request of a turn or cron run already let in
        refusal = await self._check(charge.payer, await self.limits(charge.payer, admin=charge.admin))
        if refusal is None:
            return
        log.info(
            "request_over_budget",
            kind=charge.kind.value,
            payer=str(charge.payer) if charge.payer is not None else None,
            cap=refusal.cap,
            resets_at=refusal.resets_at.isoformat(),
        )
        raise OverBudget(refusal.text, refusal.cap, refusal.resets_at, refusal.retry_after_s)

    @contextlib.asynccontextmanager
    async def turn(self, user: UserRef, *, admin: bool, topic: str = "") -> AsyncIterator[Refusal | None]:
        """Around a turn or a cron run (module docstring). ``topic`` keys the once-per-
        reset notice apart from the person's turn notice (``cron:JOB``)."""
        limits = await self.limits(user, admin=admin)
        # One lock per capped person for the life of the process (a few bytes each).
        lock = self._locks.setdefault(await self.payer(user), asyncio.Lock()) if limits.capped else None
        async with lock if lock is not None else contextlib.nullcontext():
            refusal = await self._check(user, limits)
            if refusal is not None:
                # One notice per person and reset (and topic), also for the global cap.
                key = f"{await self.payer(user)}|{refusal.cap}" + (f"|{topic}" if topic else "")
                yield replace(refusal, notify=await self.ledger.claim_notice(key, refusal.resets_at))
                return
            admission = _Admission(str(user))
            token = _ADMITTED.set(admission)
            try:
                yield None
            finally:
                admission.open = False
                _ADMITTED.reset(token)

    async def check(self, user: UserRef, *, admin: bool) -> Refusal | None:
        """The caps of ``turn`` for a request made inside a running turn (a delegated
        sub-agent): without the turn's lock, which the caller holds, and without using
        up the person's one notice."""
        return await self._check(user, await self.limits(user, admin=admin))

    async def _check(self, user: UserRef | None, limits: Limits) -> Refusal | None:
        now = self.ledger.local_now()
        glob = self.settings.global_.daily_usd
        if glob is not None:
            spent = (await self.ledger.spend(EVERYONE)).day_usd
            if spent >= glob:
                return Refusal("global_daily_usd", glob, spent, next_day(now), False, now)
        if user is None or not limits.capped:
            return None
        s = await self.ledger.spend(await self.payer(user))
        for cap, limit, spent, resets in (
            ("monthly_usd", limits.monthly_usd, s.month_usd, next_month(now)),
            ("daily_usd", limits.daily_usd, s.day_usd, next_day(now)),
            ("daily_tokens", limits.daily_tokens, s.day_tokens, next_day(now)),
        ):
            if limit is not None and spent >= limit:
                return Refusal(cap, float(limit), float(spent), resets, False, now)
        return None

    async def report(self, user: UserRef, *, admin: bool) -> str:
        """``/usage``: today's and this month's spend against the caps."""
        limits = await self.limits(user, admin=admin)
        s: Spend = await self.ledger.spend(str(user))
        now = self.ledger.local_now()

        def of(value: float | None, show: Callable[[float], str]) -> str:
            return "" if value is None or limits.exempt else f" of {show(value)}"

        lines = [
            f"Your usage ({now.tzname()}):",
            (
                f"Today: ${s.day_usd:.4f}{of(limits.daily_usd, money)} · "
                f"{s.day_tokens:,} tokens{of(limits.daily_tokens, lambda n: f'{int(n):,}')}"
            ),
            f"This month: ${s.month_usd:.4f}{of(limits.monthly_usd, money)}",
        ]
        if limits.exempt:
            lines.append("No personal cap (admin).")
        elif not limits.capped:
            lines.append("No personal cap is set.")
        if self.upkeep is not None:
            lines.extend(await self._upkeep_lines(user))
        lines.append(
            f"Daily counters reset {next_day(now):%Y-%m-%d %H:%M}, monthly {next_month(now):%Y-%m-%d}."
        )
        return "\n".join(lines)

    async def _upkeep_lines(self, user: UserRef) -> list[str]:
        """Background memory work apart (it is part of the totals above)."""
        assert self.upkeep is not None
        u = await self.upkeep.spend(user)
        cap = self.upkeep.settings.daily_tokens_per_person
        conversation = (await self.ledger.spend(str(user))).day_usd - u.day_usd
        lines = [
            f"Conversation today: ${max(0.0, conversation):.4f}",
            (
                f"Upkeep today (background memory work): ${u.day_usd:.4f} · {u.day_tokens:,} tokens"
                + (f" of {cap:,}" if cap is not None else "")
                + f" · {u.requests_today} requests; this month ${u.month_usd:.4f}"
            ),
        ]
        if u.kinds:
            lines.append(
                "  "
                + ", ".join(
                    f"{k.kind} {k.requests}× ${k.cost_usd:.4f} ({k.cache_read_share:.0%} from cache)"
                    for k in u.kinds
                )
            )
        return lines
