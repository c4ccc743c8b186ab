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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from mnemo.adapters.admin.ports import BackupStatus, DayActivity
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.schedules import zone
from mnemo.memory.db import Database
from mnemo.memory.scope import UserRef

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
class StateReads:
    """``ProfileReads`` on the profile's database: ``mnemo users``' own queries, the
    budgets' ``usage_days`` (payer ``*``) and the backups folder."""

    settings: Settings
    db: Database
    sqlite: bool = True
    _verified: tuple[str, float, bool, str] | None = None

    async def people(self) -> list[str]:
        if not self.sqlite:
            return []
        from mnemo.cli.users import _people

        return await _people(self.db, self.settings)

    async def person(self, user: UserRef) -> dict[str, int]:
        if not self.sqlite:
            return {}
        from mnemo.cli.users import _facts

        return await _facts(self.db, user)

    async def chats(self) -> list[str]:
        if not self.sqlite:
            return []
        return await self.db.read(
            lambda c: [r[0] for r in c.execute("SELECT chat_key FROM chats ORDER BY chat_key")]
        )

    async def daily(self, days: int) -> list[DayActivity]:
        tz = zone(self.settings.gateway.timezone)
        today = datetime.now(tz).date()
        first = today - timedelta(days=days - 1)
        if not self.sqlite:
            return [DayActivity(first + timedelta(days=i), 0, 0.0) for i in range(days)]
        since = datetime.combine(first, datetime.min.time(), tz).astimezone(zone("UTC")).isoformat()

        def q(conn: Any) -> tuple[list[str], dict[str, float]]:
            stamps = [
                r[0] for r in conn.execute("SELECT created_at FROM messages WHERE created_at >= ?", (since,))
            ]
            cost = {
                r[0]: float(r[1])
                for r in conn.execute(
                    "SELECT day, cost_usd FROM usage_days WHERE payer = '*' AND day >= ?",
                    (first.isoformat(),),
                )
            }
            return stamps, cost

        stamps, cost = await self.db.read(q)
        counts: dict[str, int] = {}
        for stamp in stamps:
            day = datetime.fromisoformat(stamp).astimezone(tz).date().isoformat()
            counts[day] = counts.get(day, 0) + 1
        out = []
        for i in range(days):
            day = (first + timedelta(days=i)).isoformat()
            out.append(DayActivity(first + timedelta(days=i), counts.get(day, 0), cost.get(day, 0.0)))
        return out

    async def last_backup(self) -> BackupStatus | None:
        from mnemo.backups import backup_dir, list_backups, verify_archive
        from mnemo.cli.profile import BackupRefused

        def look() -> BackupStatus | None:
            found = list_backups(backup_dir(self.settings))
            if not found:
                return None
            last = found[-1]
            key = (str(last.path), last.path.stat().st_mtime)
            if self._verified is None or self._verified[:2] != key:
                try:  # the archive's own check, once per file (it was verified when written too)
                    ok, detail = True, f"{verify_archive(last.path)} files checked"
                except BackupRefused as e:
                    ok, detail = False, str(e)
                self._verified = (*key, ok, detail)
            return BackupStatus(str(last.path), last.size, last.created, self._verified[2], self._verified[3])

        return await asyncio.to_thread(look)


def mount_dashboard(web: Any, settings: Settings, *, sqlite: bool, db: Database, **parts: Any) -> Any:
    """Add ``/admin`` to the local HTTP server (before it starts). ``parts`` are the
    ``AdminDeps`` collaborators the app built (store, search, files, skills, cron, jobs,
    health, is_admin, budgets)."""
    from mnemo.adapters.admin.dashboard import AdminDashboard
    from mnemo.adapters.admin.ports import AdminDeps

    deps = AdminDeps(settings=settings, reads=StateReads(settings, db, sqlite), **parts)
    return AdminDashboard(web, deps, token=configured_admin_token(settings))
