"""Upkeep's own caps: background memory work cannot burn a person's tokens unseen.

Background requests (``RequestKind.background``: flush, memory review, compression
summaries, skill review, consolidation) are billed to the session's person like any
request and meet the budgets' caps; on top of those, ``memory.upkeep.*`` caps them on
their own, so a loop or a very long chat spends a bounded amount on upkeep per day:

* ``daily_tokens_per_person`` and ``global_daily_tokens`` — checked by the budget gate
  (``BudgetGate.admit``, the one place every model request passes) for background
  charges: at a cap it raises ``OverBudget`` until the next local day, the job queue
  puts the job back for then, and no request is made. Admins are not exempt: the cap
  is a runaway guard, not a price;
* ``session_passes_per_hour`` — checked by the job before each background request of a
  session (``before_request``): over it the job waits until the oldest request of the
  window is an hour old.

The repeat guard (the same job kind for a session without a new user message) is the
queue's side: ``gateway/jobs/loop_guard.py``.

Every background request is recorded here after it is counted in the session's usage
(``record``, a second write: a crash between the two leaves one request out of
upkeep's account, never out of the budget). ``/usage``, ``mnemo users usage`` and the
dashboard read ``spend`` to show upkeep apart from the conversation. The clock is the
ledger's, so tests cross midnight or an hour without sleeping.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mnemo.gateway.budgets.charge import Charge, RequestKind
from mnemo.gateway.budgets.ledger import BudgetRepository, UpkeepSpend
from mnemo.gateway.config import UpkeepSettings
from mnemo.gateway.errors import OverBudget
from mnemo.gateway.logs import get_logger
from mnemo.memory.scope import UserRef
from mnemo.memory.usage import Usage

log = get_logger(__name__)

HOUR_S = 3600.0


def _next_day(now: datetime) -> datetime:
    return datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), tzinfo=now.tzinfo)


class Upkeep:
    """Collaborators: the spending ledger (``BudgetRepository``, whose upkeep rows and
    clock it uses) and the ``memory.upkeep`` settings."""

    def __init__(self, settings: UpkeepSettings, ledger: BudgetRepository) -> None:
        self.settings = settings
        self.ledger = ledger

    async def check(self, charge: Charge) -> OverBudget | None:
        """For the budget gate: the refusal of a background ``charge`` at a token cap."""
        if not charge.kind.background:
            return None
        now = self.ledger.local_now()
        glob = self.settings.global_daily_tokens
        if glob is not None:
            spent = (await self.ledger.upkeep_spend(None)).day_tokens
            if spent >= glob:
                return _refusal("this bot's daily upkeep budget", "upkeep_global_daily_tokens", glob, now)
        cap = self.settings.daily_tokens_per_person
        if cap is not None and charge.payer is not None:
            payer = await self.ledger.payer(str(charge.payer))
            spent = (await self.ledger.upkeep_spend(payer)).day_tokens
            if spent >= cap:
                return _refusal("your daily upkeep budget", "upkeep_daily_tokens", cap, now)
        return None

    async def before_request(self, session_id: str, kind: RequestKind) -> None:
        """Raises ``OverBudget`` (wait, nothing sent) when ``session_id`` made
        ``session_passes_per_hour`` background requests in the last hour."""
        limit = self.settings.session_passes_per_hour
        if limit is None:
            return
        now = self.ledger.local_now().timestamp()
        recent = await self.ledger.upkeep_requests_since(session_id, now - HOUR_S)
        if len(recent) < limit:
            return
        wait = max(1.0, recent[-limit] + HOUR_S - now)
        log.info("upkeep_passes_per_hour", session=session_id, kind=kind.value, limit=limit, wait_s=wait)
        raise OverBudget(
            f"this conversation's background work is at {limit} requests an hour",
            "upkeep_session_passes_per_hour",
            self.ledger.local_now() + timedelta(seconds=wait),
            wait,
        )

    async def record(self, session_id: str, kind: RequestKind, payer: UserRef | None, usage: Usage) -> None:
        await self.ledger.record_upkeep(session_id, kind.value, None if payer is None else str(payer), usage)

    async def spend(self, user: UserRef | None) -> UpkeepSpend:
        """``user``'s upkeep (their linked accounts' too); None: the whole bot's."""
        if user is None:
            return await self.ledger.upkeep_spend(None)
        return await self.ledger.upkeep_spend(await self.ledger.payer(str(user)))


def _refusal(what: str, cap: str, limit: int, now: datetime) -> OverBudget:
    resets = _next_day(now)
    return OverBudget(
        f"{what} ({limit:,} tokens) is used up; background memory work waits until {resets:%Y-%m-%d %H:%M}",
        cap,
        resets,
        max(1.0, (resets - now).total_seconds()),
    )
