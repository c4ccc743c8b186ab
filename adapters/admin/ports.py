"""What the dashboard needs from the rest of mnemo, handed over by the composition root
(``mnemo/app.py`` → ``mnemo/dashboard.py``).

The objects the CLI and the tools already use (the session store, the curated memory,
``SkillStore``, ``CronJobs``, ``JobQueue``, ``BudgetGate``, the linked identities) are
passed as they are, by their ports, so every write goes through the one code path they
share and every read is the configured backend's. What lives in the composition root
(who the people are, the profile's daily totals, the backups) comes through
``ProfileReads``: the same reads as ``mnemo users``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.people.directory import PersonFacts
from mnemo.gateway.people.links import LinkRepository
from mnemo.memory.journal import JournalRepository, ProposalRepository
from mnemo.memory.policy import PolicyRepository
from mnemo.memory.ports import CuratedRepository, SearchRepository, SessionStorage
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore


@dataclass(frozen=True, slots=True)
class DayActivity:
    day: date
    messages: int
    cost_usd: float


@dataclass(frozen=True, slots=True)
class BackupStatus:
    path: str
    size: int
    created: datetime
    verified: bool
    detail: str  # "N files checked" or why verification failed


class ProfileReads(Protocol):
    """Reads whose code lives in the composition root (``mnemo users``, backups)."""

    async def people(self) -> list[str]:
        """Everyone with a session, a profile or spend, as ``PLATFORM:ID``."""
        ...

    async def person(self, user: UserRef) -> PersonFacts:
        """Sessions and messages written of one account (``mnemo users show``)."""
        ...

    async def has_profile(self, owner: UserRef) -> bool:
        """Whether exactly this account keeps a USER.md."""
        ...

    async def chats(self) -> list[str]:
        """Every chat key (the search scopes)."""
        ...

    async def daily(self, days: int) -> list[DayActivity]:
        """Messages and cost per local day, the last ``days`` days, oldest first."""
        ...

    async def last_backup(self) -> BackupStatus | None: ...


@dataclass(frozen=True)
class AdminDeps:
    settings: Settings
    store: SessionStorage
    search: SearchRepository
    files: CuratedRepository  # resolves a linked account's USER.md to its person's
    skills: SkillStore
    cron: CronJobs
    jobs: JobQueue
    reads: ProfileReads
    health: Callable[[], Awaitable[dict[str, Any]]]
    is_admin: Callable[[str, str], bool]  # (platform, user_id): an access.admins entry
    budgets: BudgetGate
    links: LinkRepository  # linked identities (/link): who owns a shared USER.md
    journal: JournalRepository | None = None  # memory history with provenance, revert
    policies: PolicyRepository | None = None  # a person's memory policy, shown with their history
    proposals: ProposalRepository | None = None  # memory changes waiting for a decision
