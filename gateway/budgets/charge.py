"""Who pays for a model request: the ``Charge`` every ``LLMClient.create`` call carries.

The client hands it to its ``RequestGate`` (``BudgetGate`` in a running bot) before
the request is sent, so the caps apply to every request, whatever asked for it: a
turn, a cron run, delegated work, and background work (flush, memory review,
compression summaries, skill review, search digests). ``charge`` is a required
argument of ``create``: a new kind of request cannot be written without saying whose
it is.

A tool's own request during a turn (the search digest, delegated work) is the turn's:
the agent wraps each tool call in ``billed_to(Billing(…))`` and the tool asks
``on_behalf_of_turn(kind)`` for its charge — outside a turn that is nobody's, which
only the global cap limits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from mnemo.memory.scope import UserRef


class RequestKind(StrEnum):
    TURN = "turn"  # answering a message
    CRON = "cron"  # a scheduled run
    DELEGATE = "delegate"  # delegated work (a sub-agent)
    DIGEST = "digest"  # session_search's summary of its hits
    FLUSH = "flush"  # memory flush before compression / at session end
    REVIEW = "review"  # memory review (the nudge)
    SUMMARY = "summary"  # compression summary
    SKILL_REVIEW = "skill_review"  # may keep a procedure as a skill
    CONSOLIDATION = "consolidation"  # proposes tidying a memory file (memory.consolidation)

    @property
    def background(self) -> bool:
        """Work nobody waits for: at a cap it waits for the reset instead of answering."""
        return self in (
            RequestKind.FLUSH,
            RequestKind.REVIEW,
            RequestKind.SUMMARY,
            RequestKind.SKILL_REVIEW,
            RequestKind.CONSOLIDATION,
        )


@dataclass(frozen=True, slots=True)
class Charge:
    """One request's payer. ``payer`` None: nobody (a shared room's background work),
    limited by the global cap only; ``admin``: exempt from per-person caps by default."""

    kind: RequestKind
    payer: UserRef | None = None
    admin: bool = False

    def as_kind(self, kind: RequestKind) -> Charge:
        return replace(self, kind=kind)


class RequestGate(Protocol):
    """Called by ``LLMClient.create`` before every request (and before its retries'
    first attempt only). Returns to let it go; raises ``gateway.errors.OverBudget`` when
    a cap forbids it — then no request is made."""

    async def admit(self, charge: Charge) -> None: ...


class Unmetered:
    """A gate that admits everything: for a client outside a running bot (benchmarks,
    tests of the client itself). ``mnemo run``, ``chat`` and ``demo`` use ``BudgetGate``."""

    async def admit(self, charge: Charge) -> None:
        return None


UNMETERED = Unmetered()


@dataclass(frozen=True, slots=True)
class Billing:
    """Where a request made on a turn's behalf by a tool is counted, and who pays."""

    session_id: str
    payer: str | None  # PLATFORM:ID
    admin: bool = False

    def charge(self, kind: RequestKind) -> Charge:
        return Charge(kind, UserRef.parse(self.payer) if self.payer else None, self.admin)


_BILLING: ContextVar[Billing | None] = ContextVar("mnemo_billing", default=None)


@contextlib.contextmanager
def billed_to(billing: Billing) -> Iterator[None]:
    """The agent wraps each tool call in this, so a tool's own LLM requests are counted
    against the same session and person as the turn's."""
    token = _BILLING.set(billing)
    try:
        yield
    finally:
        _BILLING.reset(token)


def current_billing() -> Billing | None:
    return _BILLING.get()


def on_behalf_of_turn(kind: RequestKind) -> Charge:
    """The charge of a tool's own request (``DIGEST``, ``DELEGATE``): the running turn's
    payer, or nobody outside a turn."""
    billing = current_billing()
    return billing.charge(kind) if billing is not None else Charge(kind)
