"""Automatic backups: the ``mnemo export`` archive (``mnemo/archives``), on a schedule,
verified, pruned — on whichever backend the profile runs.

* ``backup.schedule`` (crontab, default ``0 4 * * *`` in ``gateway.timezone``),
  ``backup.keep`` (default 7), ``backup.dir`` (default ``$MNEMO_HOME/backups/``, 0700);
* a backup is ``export_profile`` from the configured backend's snapshot (SQLite's
  online backup API, or one REPEATABLE READ transaction on PostgreSQL), written to a
  temp file and renamed, then ``verify_archive`` on the finished file, then pruning of
  the oldest ``mnemo-backup-*.tar.gz`` beyond ``keep``;
* ``restore`` is ``restore_archive`` into a profile no bot serves (the profile lock on
  SQLite, no live replica on PostgreSQL); a target that holds data needs ``force``,
  and everything it replaces is kept in ``.replaced-<time>/``.

``BackupScheduler`` runs in ``open_app``'s lifecycle with an injected clock and sleep,
so tests move time instead of waiting for it. With replicas (PostgreSQL) each takes
the schedule's slot under the backend's shared lock, and a slot already written by
another replica sharing the home is not written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import structlog

from mnemo.archives.export import Exported, export_profile
from mnemo.archives.restore import Restored, Verified, restore_archive, unpack, verify_archive
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import ArchiveRefused
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.scope import UserRef

log = structlog.get_logger(__name__)

PREFIX = "mnemo-backup-"
SUFFIX = ".tar.gz"
Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]
SharedLock = Callable[[str], AbstractAsyncContextManager[None]]
BACKUP_LOCK = "mnemo.backup"
T = TypeVar("T")


def backup_folder(settings: Settings) -> Path:
    return settings.backup.dir.expanduser() if settings.backup.dir is not None else settings.home / "backups"


def backup_dir(settings: Settings) -> Path:
    folder = backup_folder(settings)
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


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete the oldest backups beyond ``keep``; returns what was deleted."""
    backups = list_backups(folder)
    removed = [b.path for b in backups[: max(0, len(backups) - keep)]]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def backup_path(settings: Settings, when: datetime) -> Path:
    return backup_dir(settings) / f"{PREFIX}{when.astimezone(UTC):%Y%m%d-%H%M%S}{SUFFIX}"


def backup_now(settings: Settings, now: datetime) -> Exported:
    """Write, verify and prune one backup of the configured backend. A backup that fails
    its verification is deleted and the error raised (``ArchiveRefused``)."""
    from mnemo.gateway.storage import backend_for

    dest = backup_path(settings, now)
    exported = export_profile(settings, backend_for(settings).archive(), dest, force=True)
    try:
        verify_archive(dest)
    except ArchiveRefused:
        dest.unlink(missing_ok=True)
        raise
    removed = prune(dest.parent, settings.backup.keep)
    log.info(
        "backup_written",
        path=str(dest),
        backend=exported.source.backend,
        rows=exported.total_rows,
        pruned=[p.name for p in removed],
    )
    return exported


def run_blocking(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from blocking code, in a thread of its own (the
    caller may itself be running inside an event loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


@contextlib.contextmanager
def nobody_serving(settings: Settings) -> Iterator[None]:
    """Hold what keeps a bot from serving the profile for the block: the profile lock
    on SQLite (``ProfileInUse`` when a bot holds it); on PostgreSQL, refuse while any
    replica is live (``ArchiveRefused``)."""
    from mnemo.gateway.errors import StartupError
    from mnemo.gateway.storage import backend_for
    from mnemo.profile_lock import serving

    backend = backend_for(settings)
    with serving(settings.home, shared_database=backend.replicated):
        try:
            now = run_blocking(lambda: backend.serving(lambda: None))
        except StartupError as e:
            raise ArchiveRefused(str(e)) from None
        if now.running:
            who = ", ".join(str(r.get("replica_id")) for r in now.replicas)
            raise ArchiveRefused(f"the bot is running on this database ({who}): stop every replica first")
        yield


def restore(settings: Settings, archive: Path, *, force: bool = False) -> Restored:
    """Restore ``archive`` into the profile (see ``nobody_serving``)."""
    import shutil

    from mnemo.gateway.storage import backend_for

    created = not settings.home.exists()
    try:
        with nobody_serving(settings):
            return restore_archive(settings, backend_for(settings).archive(), archive, force=force)
    except BaseException:
        if created:  # refused: leave no home behind (the profile lock made one)
            shutil.rmtree(settings.home, ignore_errors=True)
        raise


def describe(settings: Settings, verified: Verified) -> tuple[bool, str]:
    """Whether a verified backup is one of this profile as it runs now, in words: an
    archive taken on another backend (before ``mnemo migrate``) lacks everything since."""
    from mnemo.gateway.storage import backend_for

    configured = backend_for(settings).name
    taken = verified.source.backend
    if taken != configured:
        return False, (
            f"taken from {taken}, but this profile now runs on {configured}: it lacks everything "
            "since the move — take a backup now (mnemo backup now)"
        )
    return True, f"{verified.files} files checked, {verified.rows:,} rows ({taken})"


async def _real_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BackupScheduler:
    """Takes a backup at every ``backup.schedule`` time while the app runs. ``lock``:
    the backend's lock shared by every replica (None: one process owns the store)."""

    def __init__(
        self,
        settings: Settings,
        *,
        lock: SharedLock | None = None,
        clock: Clock = _utc_now,
        sleep: Sleep = _real_sleep,
    ) -> None:
        from mnemo.gateway.cron.schedules import cron_trigger, zone

        self._settings = settings
        self._lock = lock
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

    async def _take(self, due: datetime) -> None:
        if self._lock is None:
            self.last = (await asyncio.to_thread(backup_now, self._settings, due)).path
            return
        async with self._lock(BACKUP_LOCK):
            if (await asyncio.to_thread(backup_path, self._settings, due)).exists():
                return  # another replica sharing this home wrote this slot
            self.last = (await asyncio.to_thread(backup_now, self._settings, due)).path

    async def _loop(self) -> None:
        due = self.next_run(self._clock())
        while True:
            now = self._clock()
            if now < due:
                await self._sleep(min((due - now).total_seconds(), 3600.0))
                continue
            try:
                await self._take(due)
                self.last_error = None
            except Exception as e:  # a failed backup must not end the schedule
                self.last_error = str(e)
                log.error("backup_failed", error=str(e), exc_info=not isinstance(e, ArchiveRefused | OSError))
            due = self.next_run(max(now, due))


def scrub_backups(settings: Settings, accounts: Sequence[UserRef], *, delete: bool) -> int:
    """Erasure in the backups (``gateway/people/erasure.py`` calls it through the hook
    the app gives it), whichever backend an archive was taken from: every archive is
    restored into a scratch SQLite home, the people ``accounts`` are erased there like
    in the live profile (rows, files, compaction), and the archive is written again —
    keeping its source, time, config.yaml and what it left out — verified and put in
    place of the old one. Returns the number of archives (to be) rewritten; an archive
    that cannot be read is logged and left as it is (no backup mnemo can restore either)."""
    archives = [b.path for b in list_backups(backup_folder(settings))]
    if not delete:
        return len(archives)
    done = 0
    for archive in archives:
        if _scrub_one(archive, frozenset(accounts)):
            done += 1
    log.info("backups_scrubbed", archives=done, accounts=[str(a) for a in accounts])
    return done


def _scrub_one(archive: Path, accounts: AbstractSet[UserRef]) -> bool:
    from mnemo.gateway.config import load_settings
    from mnemo.gateway.storage_sqlite import SqliteBackend

    with tempfile.TemporaryDirectory(prefix=".scrub-", dir=archive.parent) as scratch:
        home = Path(scratch) / "home"
        try:
            original = unpack(archive, Path(scratch) / "original")
            inner = load_settings(home, environ={})
            store = SqliteBackend(inner).archive()
            restored = restore_archive(inner, store, archive)
        except (ArchiveRefused, OSError) as e:
            log.warning("backup_not_scrubbed", path=str(archive), error=str(e))
            return False
        run_blocking(lambda: _erase(inner, accounts))
        config = original.folder / "config.yaml"
        fresh = archive.with_name(f".{archive.name}.scrubbed")
        export_profile(
            inner,
            store,
            fresh,
            force=True,
            source=restored.source,
            config_text=config.read_text(encoding="utf-8") if config.is_file() else None,
            left_out=original.left_out,
            extra={
                "created_at": original.manifest.get("created_at"),
                "scrubbed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        verify_archive(fresh)
        os.replace(fresh, archive)
    return True


async def _erase(inner: Settings, accounts: AbstractSet[UserRef]) -> None:
    from mnemo.gateway.budgets.ledger import SqliteBudgets
    from mnemo.gateway.people.erasure import Erasure
    from mnemo.gateway.people.erasure_state import StateData
    from mnemo.gateway.storage import state_database

    db = state_database(inner.state_db)
    await db.open()
    try:
        erasure = Erasure(StateData(db, inner, SqliteBudgets(db)), inner)
        for user in sorted(accounts, key=str):
            await erasure.erase(user)
    finally:
        await db.close()


def scrubber(settings: Settings) -> Callable[[tuple[UserRef, ...], bool], Awaitable[int]]:
    """``scrub_backups`` as the erasure's hook (off the event loop)."""

    async def scrub(accounts: tuple[UserRef, ...], delete: bool) -> int:
        return await asyncio.to_thread(scrub_backups, settings, accounts, delete=delete)

    return scrub
