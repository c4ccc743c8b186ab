"""Automatic backups: the ``mnemo export`` archive, on a schedule, verified, pruned.

* ``backup.schedule`` (crontab, default ``0 4 * * *`` in ``gateway.timezone``),
  ``backup.keep`` (default 7), ``backup.dir`` (default ``$MNEMO_HOME/backups/``, 0700);
* a backup is ``export_profile`` (mnemo/cli/profile.py: databases through SQLite's
  online backup API, written to a temp file and renamed), then ``verify_archive`` on the
  finished file, then pruning of the oldest ``mnemo-backup-*.tar.gz`` beyond ``keep``;
* ``verify_archive`` checks the archive's members like an import does, every file's
  sha256 against the manifest, and every database with ``quick_check``;
* ``restore`` is ``import_profile(..., force=True)`` into a stopped profile (the profile
  lock must be free): everything it replaces is kept in ``.replaced-<time>/``.

``BackupScheduler`` runs in ``open_app``'s lifecycle with an injected clock and sleep,
so tests move time instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from mnemo.cli.profile import (
    MANIFEST,
    BackupRefused,
    UnsafeArchive,
    _extract,
    _is_database,
    check_members,
    export_profile,
    file_sha256,
    import_profile,
    verify_database,
)
from mnemo.gateway.config import Settings
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.scope import UserRef

log = structlog.get_logger(__name__)

PREFIX = "mnemo-backup-"
SUFFIX = ".tar.gz"
Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]


def backup_dir(settings: Settings) -> Path:
    folder = (
        settings.backup.dir.expanduser() if settings.backup.dir is not None else settings.home / "backups"
    )
    ensure_folder(folder)
    os.chmod(folder, 0o700)
    return folder


@dataclass(frozen=True, slots=True)
class Backup:
    path: Path
    size: int
    created: datetime


def list_backups(folder: Path) -> list[Backup]:
    """The backups in ``folder``, oldest first (by the time in their name)."""
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(f"{PREFIX}*{SUFFIX}")):
        stamp = path.name[len(PREFIX) : -len(SUFFIX)]
        try:
            created = datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            continue
        if path.is_file() and not path.is_symlink():
            out.append(Backup(path, path.stat().st_size, created))
    return out


def verify_archive(archive: Path) -> int:
    """Open ``archive`` and check every member: safe layout, sha256 as in the manifest,
    every database intact. Returns the number of files; raises ``BackupRefused``."""
    if not archive.is_file():
        raise BackupRefused(f"{archive}: no such file")
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as e:
        raise UnsafeArchive(f"{archive}: not a readable .tar.gz: {e}") from None
    with tar, tempfile.TemporaryDirectory() as scratch:
        members = check_members(tar)
        f = tar.extractfile(MANIFEST)
        manifest = json.loads(f.read()) if f is not None else {}
        checksums = manifest.get("sha256")
        if not isinstance(checksums, dict):
            raise BackupRefused(
                f"{archive.name} has no checksums in its manifest (written before checksums were stored)"
            )
        try:
            written = _extract(tar, members, Path(scratch))
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise UnsafeArchive(f"the archive is damaged: {e}") from None
        names = {rel.as_posix() for rel in written}
        missing = sorted(set(manifest.get("files", [])) - names)
        if missing:
            raise BackupRefused(f"files listed in the manifest are missing: {', '.join(missing[:5])}")
        for rel in written:
            path = Path(scratch).joinpath(*rel.parts)
            expected = checksums.get(rel.as_posix())
            if expected is None:
                raise BackupRefused(f"{rel} has no checksum in the manifest")
            if file_sha256(path) != expected:
                raise BackupRefused(f"{rel} does not match its checksum: the archive is corrupted")
            if _is_database(rel, path):
                verify_database(rel, path)
    return len(written)


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete the oldest backups beyond ``keep``; returns what was deleted."""
    backups = list_backups(folder)
    removed = [b.path for b in backups[: max(0, len(backups) - keep)]]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def backup_now(settings: Settings, now: datetime) -> Path:
    """Write, verify and prune one backup; returns its path. A backup that fails its
    verification is deleted and the error raised (``BackupRefused``)."""
    folder = backup_dir(settings)
    dest = folder / f"{PREFIX}{now.astimezone(UTC):%Y%m%d-%H%M%S}{SUFFIX}"
    export_profile(settings.home, dest, force=True)
    os.chmod(dest, 0o600)
    try:
        verify_archive(dest)
    except BackupRefused:
        dest.unlink(missing_ok=True)
        raise
    removed = prune(folder, settings.backup.keep)
    log.info("backup_written", path=str(dest), pruned=[p.name for p in removed])
    return dest


def restore(settings: Settings, archive: Path) -> tuple[int, Path | None]:
    """Import ``archive`` into the (stopped) profile, keeping what it replaces."""
    from mnemo.profile_lock import ProfileInUse, try_hold

    verify_archive(archive)
    with try_hold(settings.home) as held:
        if not held:
            raise ProfileInUse(settings.home, None)
        return import_profile(settings.home, archive, force=True)


async def _real_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BackupScheduler:
    """Takes a backup at every ``backup.schedule`` time while the app runs."""

    def __init__(self, settings: Settings, *, clock: Clock = _utc_now, sleep: Sleep = _real_sleep) -> None:
        from mnemo.gateway.cron.schedules import cron_trigger, zone

        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._trigger = cron_trigger(settings.backup.schedule, zone(settings.gateway.timezone))
        self._task: asyncio.Task[None] | None = None
        self.last: Path | None = None
        self.last_error: str | None = None

    def next_run(self, after: datetime) -> datetime:
        """The first scheduled time strictly after ``after`` (APScheduler's own answer
        includes ``after`` itself, which would take the same backup again)."""
        fire: datetime | None = self._trigger.get_next_fire_time(  # APScheduler 3 is untyped
            None, after.replace(microsecond=0) + timedelta(seconds=1)
        )
        assert fire is not None  # a crontab expression always fires again
        return fire.astimezone(UTC)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="backup-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        due = self.next_run(self._clock())
        while True:
            now = self._clock()
            if now < due:
                await self._sleep(min((due - now).total_seconds(), 3600.0))
                continue
            try:
                self.last = await asyncio.to_thread(backup_now, self._settings, due)
                self.last_error = None
            except Exception as e:  # a failed backup must not end the schedule
                self.last_error = str(e)
                log.error(
                    "backup_failed",
                    error=str(e),
                    exc_info=not isinstance(e, BackupRefused | OSError),
                )
            due = self.next_run(max(now, due))


def scrub_backups(settings: Settings, accounts: Sequence[UserRef], *, delete: bool) -> int:
    """Erasure in the backups (``gateway/people/erasure.py`` calls it through the hook
    the app gives it): every backup archive is restored into a scratch home, the people
    ``accounts`` are erased there like in the live profile (rows, files, compaction),
    and the archive is written again, verified and put in place of the old one. Returns
    the number of archives (to be) rewritten; an archive that cannot be read is logged
    and left as it is (it is not a backup mnemo can restore either)."""
    from mnemo.gateway.budgets.ledger import SqliteBudgets
    from mnemo.gateway.config import load_settings
    from mnemo.gateway.people.erasure import Erasure
    from mnemo.gateway.people.erasure_state import StateData
    from mnemo.gateway.storage import state_database

    folder = (
        settings.backup.dir.expanduser() if settings.backup.dir is not None else settings.home / "backups"
    )
    archives = [b.path for b in list_backups(folder)]
    if not delete:
        return len(archives)
    done = 0
    for archive in archives:
        with tempfile.TemporaryDirectory(prefix=".scrub-", dir=archive.parent) as scratch:
            home = Path(scratch) / "home"
            try:
                import_profile(home, archive)
            except (UnsafeArchive, OSError) as e:
                log.warning("backup_not_scrubbed", path=str(archive), error=str(e))
                continue
            inner = load_settings(home, environ={})

            async def erase(inner: Settings) -> None:
                db = state_database(inner.state_db)
                await db.open()
                try:
                    erasure = Erasure(StateData(db, inner, SqliteBudgets(db)), inner)
                    for user in accounts:
                        await erasure.erase(user)
                finally:
                    await db.close()

            if inner.state_db.exists():
                asyncio.run(erase(inner))
            fresh = archive.with_name(f".{archive.name}.scrubbed")
            export_profile(home, fresh, force=True)
            os.chmod(fresh, 0o600)
            verify_archive(fresh)
            os.replace(fresh, archive)
            done += 1
    log.info("backups_scrubbed", archives=done, accounts=[str(a) for a in accounts])
    return done


def scrubber(settings: Settings) -> Callable[[tuple[UserRef, ...], bool], Awaitable[int]]:
    """``scrub_backups`` as the erasure's hook (off the event loop)."""

    async def scrub(accounts: tuple[UserRef, ...], delete: bool) -> int:
        return await asyncio.to_thread(scrub_backups, settings, accounts, delete=delete)

    return scrub
