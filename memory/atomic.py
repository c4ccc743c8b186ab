"""Crash-safe replacement of small files that several processes write.

Used by the curated memory files (and meant for skills and other hand-readable files):

* :func:`exclusive_lock` takes an ``fcntl.flock`` on a separate lock file. The lock file is
  separate because the data file is *replaced* on every write; a lock on the data file
  would lock an inode that the next writer no longer sees. It is opened with
  ``O_NOFOLLOW`` and mode 0600, so a symlink planted there cannot make us create or lock
  a file elsewhere. The kernel drops the lock when its holder dies, even by ``kill -9``.
* :func:`replace_file` writes a temp file in the same folder (same filesystem, so the
  rename is atomic), fsyncs it, ``os.replace``s it over the target and fsyncs the folder.
  A reader sees the old bytes or the new bytes, never a mix; a writer killed at any point
  leaves one of the two plus, at worst, a stale temp file that the next locked write
  removes.
* :func:`ensure_folder` creates a folder only after checking that it resolves inside a
  given root, and checks again afterwards (a symlink swapped in meanwhile).

Failures that a caller should report rather than crash on raise ``MemoryRefused``; plain
I/O errors propagate as ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mnemo.memory.errors import MemoryRefused


def ensure_folder(folder: Path, root: Path | None = None) -> None:
    """``mkdir -p`` with mode 0700, refusing a folder that resolves outside ``root``."""

    def check() -> None:
        if root is not None and not folder.resolve().is_relative_to(root.resolve()):
            raise MemoryRefused(f"{folder} resolves outside {root}; refusing to write there.")

    check()
    # Path.mkdir(parents=True) gives the parents default permissions; every folder made
    # here is private, since folder names are user ids.
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)
    check()


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, timeout: float = 10.0) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path`` (created 0600, never through a symlink)."""
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MemoryRefused(f"{lock_path.name} is a symbolic link; refusing to use it as a lock.") from e
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MemoryRefused(f"{lock_path.name} is not a regular file; refusing to use it as a lock.")
        _acquire(fd, lock_path, timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, lock_path: Path, timeout: float) -> None:
    # Polling with a deadline rather than a blocking flock: a stuck holder (a hung process
    # on a network disk) must fail one write, not hang a worker thread for ever.
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise MemoryRefused(
                    f"{lock_path.name} is held by another writer for over {timeout:g} s."
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.002)


def temp_prefix(path: Path) -> str:
    return f".{path.name}."


def replace_file(path: Path, data: bytes) -> None:
    """Atomically and durably make ``path`` hold ``data``. Call it under the file's lock."""
    folder = path.parent
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=temp_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename is durable only once the folder's entry is on disk.
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _remove_stale_temps(path: Path) -> None:
    # Under the lock no live writer of this file has a temp file, so any left over belongs
    # to a writer that was killed between mkstemp and the rename.
    prefix = temp_prefix(path)
    for name in os.listdir(path.parent):
        if name.startswith(prefix) and name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.parent / name)
