"""What the dashboard needs from the rest of mnemo, handed over by the composition root
(``mnemo/app.py`` → ``mnemo/dashboard.py``).

The objects the CLI and the tools already use (``SessionStore``, ``MemoryFiles``,
``SkillStore``, ``CronJobs``, ``JobQueue``, ``BudgetGate``) are passed as they are, so
every write goes through the one code path they share. What lives in the composition
root (who the people are, the profile's daily totals, the backups) comes through
``ProfileReads``.
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
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.scope import UserRef
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import SessionStore
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

    async def person(self, user: UserRef) -> dict[str, int]:
        """``sessions`` and ``messages`` counts of one person (``mnemo users show``)."""
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
    store: SessionStore
    search: SessionSearch
    files: MemoryFiles
    skills: SkillStore
    cron: CronJobs
    jobs: JobQueue
    reads: ProfileReads
    health: Callable[[], Awaitable[dict[str, Any]]]
    is_admin: Callable[[str, str], bool]  # (platform, user_id): an access.admins entry
    budgets: BudgetGate | None = None  # None on PostgreSQL
    # Every account of a user's person, the user included (linked identities, /link);
    # None where accounts are not linked (PostgreSQL).
    linked: Callable[[UserRef], Awaitable[tuple[UserRef, ...]]] | None = None
