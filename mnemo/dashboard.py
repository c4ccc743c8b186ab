"""Wiring of the admin dashboard (``mnemo.adapters.admin``): its sign-in token and the
reads whose code lives in the composition root.

The token is ``web.admin_token`` or, when that is unset, ``$MNEMO_HOME/admin_token``,
which ``mnemo run`` writes (mode 0600) the first time and prints once
(``ensure_admin_token``). It is never logged.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemo.adapters.admin.ports import BackupStatus, DayActivity
from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.budgets.ledger import EVERYONE, BudgetRepository
from mnemo.gateway.config import Settings
from mnemo.gateway.people.directory import Directory, PersonFacts
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:
    from mnemo.adapters.admin.dashboard import AdminDashboard
    from mnemo.gateway.webserver import WebServer

TOKEN_FILE = "admin_token"


def admin_token_path(settings: Settings) -> Path:
    return settings.home / TOKEN_FILE


def configured_admin_token(settings: Settings) -> str | None:
    """``web.admin_token``, else the token file's content, else None."""
    if settings.web.admin_token is not None:
        return settings.web.admin_token.get_secret_value()
    path = admin_token_path(settings)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return token or None


def ensure_admin_token(settings: Settings) -> str | None:
    """Generate and store the token when none is configured; return it only then (the
    caller prints it once), None when one already existed."""
    if configured_admin_token(settings) is not None:
        return None
    token = secrets.token_urlsafe(24)
    path = admin_token_path(settings)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def token_notice(path: Path, token: str, *, terminal: bool) -> str:
    """What ``mnemo run`` says about a token it just generated: the token itself only
    on a terminal — under systemd or docker stderr is a log, and secrets never reach
    logs — else where to read it."""
    if terminal:
        return f"admin dashboard token (stored in {path}, shown only this once): {token}"
    return (
        f"admin dashboard token generated and stored in {path} (0600); not shown here because"
        " stderr is not a terminal"
    )


@dataclass
class ProfileStats:
    """``ProfileReads`` on the configured backend: the people directory (the same reads
    as ``mnemo users``), the budget ledger's daily totals (payer ``*``) and the backups
    folder. Nothing here depends on which backend it is."""

    settings: Settings
    directory: Directory
    ledger: BudgetRepository
    _verified: tuple[str, float, bool, str] | None = None

    async def people(self) -> list[str]:
        return await self.directory.everyone()

    async def person(self, user: UserRef) -> PersonFacts:
        return await self.directory.facts(user)

    async def has_profile(self, owner: UserRef) -> bool:
        return await self.directory.has_profile(owner)

    async def chats(self) -> list[str]:
        return await self.directory.chats()

    async def daily(self, days: int) -> list[DayActivity]:
        today = self.ledger.local_now().date()
        first = today - timedelta(days=days - 1)
        counts = await self.directory.messages_per_day(first, self.settings.gateway.timezone)
        cost = await self.ledger.days(EVERYONE, first)
        return [
            DayActivity(day, counts.get(day, 0), cost.get(day, 0.0))
            for day in (first + timedelta(days=i) for i in range(days))
        ]

    async def last_backup(self) -> BackupStatus | None:
        from mnemo.archives.restore import verify_archive
        from mnemo.backups import backup_folder, describe, list_backups
        from mnemo.gateway.errors import ArchiveRefused

        def look() -> BackupStatus | None:
            found = list_backups(backup_folder(self.settings))
            if not found:
                return None
            last = found[-1]
            key = (str(last.path), last.path.stat().st_mtime)
            if self._verified is None or self._verified[:2] != key:
                # The archive's own check, once per file (it was verified when written too),
                # and whether it is a backup of the profile as it runs now (its backend).
                try:
                    ok, detail = describe(self.settings, verify_archive(last.path))
                except ArchiveRefused as e:
                    ok, detail = False, str(e)
                self._verified = (*key, ok, detail)
            return BackupStatus(str(last.path), last.size, last.created, self._verified[2], self._verified[3])

        return await asyncio.to_thread(look)


def mount_dashboard(
    web: WebServer, settings: Settings, *, directory: Directory, budgets: BudgetGate, **parts: Any
) -> AdminDashboard:
    """Add ``/admin`` to the local HTTP server (before it starts). ``parts`` are the
    other ``AdminDeps`` collaborators the app built (store, search, files, skills, cron,
    jobs, health, is_admin, links)."""
    from mnemo.adapters.admin.dashboard import AdminDashboard
    from mnemo.adapters.admin.ports import AdminDeps

    reads = ProfileStats(settings, directory, budgets.ledger)
    deps = AdminDeps(settings=settings, reads=reads, budgets=budgets, **parts)
    return AdminDashboard(web, deps, token=configured_admin_token(settings))
