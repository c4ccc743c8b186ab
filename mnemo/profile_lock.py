"""One serving process per profile: an exclusive ``flock`` on ``$MNEMO_HOME/.mnemo.lock``.

``mnemo run``, ``mnemo chat`` and ``mnemo demo`` start the gateway, and the gateway's
start takes over everything a dead process left behind: inbox rows are answered again,
outbox rows in flight are re-sent, running jobs re-queued. With two such processes on
one SQLite profile the second would answer the first one's in-flight turn a second
time. So each holds this lock for as long as it runs, and a second one is refused
("this profile is in use by PID N", exit 1). The commands meant to work beside a
running gateway (memory, cron, sessions, pair, providers, doctor, export) do not take
it; ``mnemo cron run-now`` takes it only for the minimal app it opens when no gateway
took the run (``try_hold``), and when the lock is held it leaves the run to its holder.

On PostgreSQL (``database.url``) several ``mnemo run`` replicas share one configuration
and may share one home: every claim they make (inbox rows, sends, jobs, cron slots, the
Telegram polling leader, a turn's session) is made in the database, so ``serving`` takes
no lock there; ``mnemo status`` lists them from their heartbeats instead. The SQLite
one-process rule is unchanged.

The kernel releases an ``flock`` when the process dies, however it dies, so a
``kill -9`` leaves no stale lock: the next start simply gets it. The file holds the
holder's PID for the message (written after the lock is taken; it is never trusted to
decide anything). It is created 0600 and never followed through a symbolic link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from mnemo.cli.main import EXIT_REFUSED, CommandError
from mnemo.memory.atomic import ensure_folder

LOCK_NAME = ".mnemo.lock"


class ProfileInUse(CommandError):
    def __init__(self, home: Path, pid: int | None) -> None:
        holder = f"PID {pid}" if pid is not None else "another process"
        super().__init__(
            f"this profile is in use by {holder} ({home}); stop it first, or use another --home",
            code=EXIT_REFUSED,
        )
        self.pid = pid


def _open(home: Path) -> int:
    ensure_folder(home)
    path = home / LOCK_NAME
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CommandError(f"{path} is a symbolic link; refusing to use it as the profile lock") from e
        raise
    os.fchmod(fd, 0o600)  # whatever the umask was when it was first created
    return fd


def _holder(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 32).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


@contextlib.contextmanager
def _acquire(home: Path) -> Iterator[tuple[bool, int | None]]:
    """(True, None) while this process holds the lock; (False, holder PID) when not."""
    fd = _open(home)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False, _holder(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield True, None
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(home: Path) -> Iterator[None]:
    """Hold the profile lock for the block; ``ProfileInUse`` when another process has it."""
    with _acquire(home) as (held, pid):
        if not held:
            raise ProfileInUse(home, pid)
        yield


@contextlib.contextmanager
def try_hold(home: Path) -> Iterator[bool]:
    """Hold the profile lock if it is free: True while held, False (holding nothing)
    when another process has it."""
    with _acquire(home) as (held, _):
        yield held


@contextlib.contextmanager
def serving(home: Path, *, shared_database: bool) -> Iterator[None]:
    """What ``mnemo run`` holds while it serves: the profile lock on SQLite; nothing when
    the database is shared by replicas (PostgreSQL)."""
    if shared_database:
        yield
        return
    with hold(home):
        yield


def holder(home: Path) -> int | None:
    """The PID of the process holding the profile lock, None when it is free."""
    try:
        fd = os.open(home / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:  # a shared lock is free exactly when nobody holds the exclusive one
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            return pid if pid is not None else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
