"""``state.db``: one process-wide SQLite database, one writer thread, readers off the loop.

Every table in ``state.db`` (sessions, messages, inbox, and later outbox, jobs, cron
jobs) goes through this object. The rules it enforces, and why:

* **One writer connection on one dedicated thread.** Writes from every coroutine of
  the process are queued onto a single-thread executor, so they never contend with
  each other inside the process; ``BUSY`` can only come from *another* process.
* **``BEGIN IMMEDIATE`` per write.** The write lock is taken at the start of the
  transaction, so a transaction never fails half-way when it upgrades from read to
  write. ``fn(conn)`` runs inside ``BEGIN IMMEDIATE … COMMIT``; an exception rolls it
  back and propagates unchanged.
* **Group commit.** Writes queued while the writer is busy are committed together,
  each inside its own ``SAVEPOINT``: every write stays all-or-nothing and its caller
  alone sees its error, but concurrent chats share one commit (and one FTS5 segment
  flush). No caller is answered before the commit that holds its write.
* **Jittered application retry on ``SQLITE_BUSY``** (20-150 ms sleeps, bounded, then
  ``StoreBusy``), over a short SQLite busy timeout: SQLite's own busy handler sleeps
  on a fixed schedule, and several processes waiting on the same schedule wake in a
  convoy. ``fn`` may therefore run more than once and must only touch ``conn``.
* **WAL + ``synchronous=NORMAL``**: a commit is durable against a process crash (the
  only crash the gateway has to survive without fsync on every commit) and readers
  never block the writer.
* **Passive checkpoints** every 50 writes and at close. Never ``TRUNCATE``: it waits
  for readers and was reported to corrupt large databases under load.
* **Readers** run on a small thread pool, each thread with its own connection
  (``query_only``), so a long search never stalls the event loop or the writer.

Usage from async code::

    db = Database(settings.state_db, migrations=STATE_MIGRATIONS)
    await db.open()                                     # folder, WAL, migrations
    new_id = await db.write(lambda c: c.execute("INSERT …").lastrowid)
    rows = await db.read(lambda c: c.execute("SELECT …").fetchall())
    await db.close()

and from synchronous code (the CLI, a worker process): ``open_sync`` / ``write_sync``
/ ``read_sync`` / ``close_sync`` do the same through the same threads (never call them
from inside a running event loop: they block).

``migrations`` is the ordered list of the whole file; memory does not know the gateway's
tables, so the caller passes it (``gateway/storage.py``: ``STATE_MIGRATIONS`` and
``state_database(path)``, which every process opening ``state.db`` uses).

A component with its own tables (outbox, jobs, cron jobs) defines its migrations in a
``schema.py`` beside its code, appends them to that list, and keeps its SQL in small
functions of a connection, passed to ``write`` (anything that changes data; keep it
short, it holds the write lock) or ``read`` (one consistent snapshot per call). It never opens its own connection to
``state.db``: one writer per process is what makes ``BUSY`` impossible inside it.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from mnemo.memory.atomic import ensure_folder
from mnemo.memory.errors import StoreBusy, StoreError
from mnemo.memory.migrations import Migration, migrate

T = TypeVar("T")
log = structlog.get_logger(__name__)

_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
Outcome = tuple[bool, Any]  # (succeeded, value or exception) of one write in a group


def create_private_database(path: Path) -> None:
    """Create a database's folders (0700) and the empty file itself (0600) before SQLite
    opens it. The files hold conversations: SQLite would create the file 0644 minus the
    umask, and its ``-wal`` / ``-shm`` files take the database file's mode, so setting
    that one mode here (with ``fchmod``, whatever the umask) covers all three. An
    existing file is left as it is."""
    ensure_folder(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def is_busy(err: sqlite3.Error) -> bool:
    """True when ``err`` is SQLITE_BUSY/LOCKED (any extended code), from its error code."""
    code = getattr(err, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _BUSY_CODES


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid of the row the ``INSERT`` just run on ``cur`` added (``lastrowid`` is
    typed optional: it is ``None`` only before any statement ran)."""
    if cur.lastrowid is None:
        raise StoreError("the INSERT reported no row id")
    return cur.lastrowid


@dataclass(slots=True)
class _Job:
    """One queued write and whoever waits for it: a coroutine (``loop`` set, asyncio
    future) or a thread (``loop`` None, concurrent future)."""

    fn: Callable[[sqlite3.Connection], Any]
    loop: asyncio.AbstractEventLoop | None
    fut: asyncio.Future[Any] | Future[Any]

    def claim(self) -> bool:
        """False when the waiter gave up before the write started."""
        if isinstance(self.fut, Future):
            return self.fut.set_running_or_notify_cancel()
        return not self.fut.cancelled()

    def settle(self, outcome: Outcome) -> None:
        ok, value = outcome
        if self.fut.done():  # cancelled while it ran; the write itself stands
            return
        if ok:
            self.fut.set_result(value)
        else:
            self.fut.set_exception(value)


def _settle_all(items: list[tuple[_Job, Outcome]]) -> None:
    for job, outcome in items:
        job.settle(outcome)


class Database:
    """The shared ``state.db`` handle. Create one per process; ``open`` before use."""

    def __init__(
        self,
        path: Path | str,
        *,
        migrations: Sequence[Migration],
        readers: int = 2,
        busy_timeout_ms: int = 1000,
        max_busy_retries: int = 40,
        checkpoint_every: int = 50,
        max_group: int = 64,
        mmap_bytes: int = 256 * 1024 * 1024,
        reader_cache_kib: int = 16 * 1024,
    ) -> None:
        self.path = Path(path)
        self._migrations = tuple(migrations)
        self._readers = readers
        self._busy_timeout_ms = busy_timeout_ms
        self._max_busy_retries = max_busy_retries
        self._checkpoint_every = checkpoint_every
        self._writer: ThreadPoolExecutor | None = None
        self._reader_pool: ThreadPoolExecutor | None = None
        self._wconn: sqlite3.Connection | None = None
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._writes_since_checkpoint = 0
        self._max_group = max_group
        self._mmap_bytes = mmap_bytes
        self._reader_cache_kib = reader_cache_kib
        self._pending: list[_Job] = []
        self._pending_lock = threading.Lock()
        self._draining = False
        self._writer_thread: int | None = None
        self.busy_retries = 0  # total BUSY retries so far (for benchmarks and tests)
        self.round_trips = 0  # reads and writes handed to a database thread (for benchmarks and tests)
        self.schema_version = 0

    # --- lifecycle ----------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._writer is not None

    async def open(self) -> None:
        await asyncio.to_thread(self.open_sync)

    def open_sync(self) -> None:
        """Create the folder, switch to WAL and apply pending migrations. Idempotent."""
        if self._writer is not None:
            return
        create_private_database(self.path)
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemo-db-writer")
        try:
            self.schema_version = writer.submit(self._open_writer).result()
        except BaseException:
            writer.shutdown(wait=True)
            raise
        self._writer = writer
        self._reader_pool = ThreadPoolExecutor(
            max_workers=self._readers, thread_name_prefix="mnemo-db-reader"
        )

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves; check_same_thread=False
        # only so close() may run from another thread after the pools are drained.
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout_ms / 1000
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _open_writer(self) -> int:
        self._writer_thread = threading.get_ident()
        conn = self._connect()
        try:
            mode = self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL (journal_mode={mode})")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = self._retry(lambda: migrate(conn, self._migrations, path=self.path))
        except BaseException:
            conn.close()
            raise
        self._wconn = conn
        return version

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Passive checkpoint, then close every connection. Idempotent."""
        writer, pool = self._writer, self._reader_pool
        if writer is None:
            return
        self._writer = self._reader_pool = None
        if pool is not None:
            pool.shutdown(wait=True)
        writer.submit(self._close_writer).result()
        writer.shutdown(wait=True)
        with self._conns_lock:
            conns, self._reader_conns = self._reader_conns, []
        for c in conns:
            c.close()

    def _close_writer(self) -> None:
        self.checkpoint()
        conn, self._wconn = self._wconn, None
        if conn is not None:
            conn.close()

    # --- writes -------------------------------------------------------------------
    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction on the writer thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self.round_trips += 1
        self._enqueue(_Job(fn, loop, fut))
        return await fut

    def write_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if threading.get_ident() == self._writer_thread and self._wconn is not None:
            # Called from inside a write (a file written within a transaction, e.g. a
            # link's profile merge, journaling its change): join that transaction;
            # queueing behind it would wait for ever.
            return fn(self._wconn)
        fut: Future[T] = Future()
        self.round_trips += 1
        self._enqueue(_Job(fn, None, fut))
        return fut.result()

    def _enqueue(self, job: _Job) -> None:
        if self._writer is None:
            raise StoreError(f"{self.path}: database is not open")
        with self._pending_lock:
            self._pending.append(job)
            if self._draining:
                return  # the running drain picks it up
            self._draining = True
        self._writer.submit(self._drain)

    def _drain(self) -> None:
        """Writer thread: commit queued writes in groups until the queue is empty."""
        try:
            while True:
                with self._pending_lock:
                    jobs = self._pending[: self._max_group]
                    del self._pending[: self._max_group]
                    if not jobs:
                        self._draining = False
                        return
                self._commit_group(jobs)
        except BaseException:
            with self._pending_lock:
                self._draining = False
            raise

    def _commit_group(self, jobs: list[_Job]) -> None:
        # A write whose caller was cancelled before it started is not run.
        jobs = [j for j in jobs if j.claim()]
        if not jobs:
            return
        try:
            outcomes = self._retry(lambda: self._transaction(jobs))
        except BaseException as e:
            outcomes = [(False, e)] * len(jobs)
        else:
            self._writes_since_checkpoint += 1
        # One wake-up per event loop for the whole group, not one per write.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Outcome]]] = {}
        for job, outcome in zip(jobs, outcomes, strict=True):
            if job.loop is None:
                job.settle(outcome)
            else:
                by_loop.setdefault(job.loop, []).append((job, outcome))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_all, items)
            except RuntimeError:
                # The loop has closed: nobody is waiting for these results any more.
                log.debug("db.write_result_dropped", writes=len(items))
        if self._writes_since_checkpoint >= self._checkpoint_every:
            self._writes_since_checkpoint = 0
            self.checkpoint()

    def _transaction(self, jobs: Sequence[_Job]) -> list[Outcome]:
        conn = self._wconn
        assert conn is not None, "writer connection exists while the writer thread runs"
        conn.execute("BEGIN IMMEDIATE")
        try:
            if len(jobs) == 1:
                outcomes: list[Outcome] = [(True, jobs[0].fn(conn))]
            else:
                outcomes = [self._in_savepoint(conn, j.fn) for j in jobs]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return outcomes

    @staticmethod
    def _in_savepoint(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]) -> Outcome:
        # Each write of a group is still all-or-nothing: a failing one is rolled back to
        # its savepoint and only its caller sees the error.
        conn.execute("SAVEPOINT write")
        try:
            value = fn(conn)
        except sqlite3.OperationalError as e:
            if is_busy(e):
                raise  # retry the whole group
            conn.execute("ROLLBACK TO write")
            conn.execute("RELEASE write")
            return (False, e)
        except Exception as e:
            conn.execute("ROLLBACK TO write")
            conn.execute("RELEASE write")
            return (False, e)
        conn.execute("RELEASE write")
        return (True, value)

    def checkpoint(self) -> None:
        """A passive WAL checkpoint on the writer connection (writer thread only)."""
        conn = self._wconn
        if conn is None:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as e:
            # A checkpoint is an optimisation; the write it follows has committed.
            log.warning("db.checkpoint_failed", path=str(self.path), error=str(e))

    def _retry(self, attempt: Callable[[], T]) -> T:
        for n in range(self._max_busy_retries + 1):
            try:
                return attempt()
            except sqlite3.OperationalError as e:
                if not is_busy(e):
                    raise
                if n == self._max_busy_retries:
                    raise StoreBusy(
                        f"{self.path}: still locked by another process after {n + 1} attempts; "
                        "is a second mnemo writing to the same profile?"
                    ) from e
                self.busy_retries += 1
                time.sleep(random.uniform(0.020, 0.150))
        raise AssertionError("unreachable")

    # --- reads --------------------------------------------------------------------
    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on a reader connection (a consistent snapshot per call)."""
        return await asyncio.wrap_future(self._submit_read(fn))

    def read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._submit_read(fn).result()

    def _submit_read(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        if self._reader_pool is None:
            raise StoreError(f"{self.path}: database is not open")
        self.round_trips += 1
        return self._reader_pool.submit(self._run_read, fn)

    def _run_read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            # Searches read scattered rows of a large file: memory-mapped reads skip a
            # syscall per page, and a larger cache keeps the FTS index's inner pages.
            conn.execute(f"PRAGMA mmap_size={self._mmap_bytes:d}")
            conn.execute(f"PRAGMA cache_size={-self._reader_cache_kib:d}")
            self._local.conn = conn
            with self._conns_lock:
                self._reader_conns.append(conn)

        def snapshot() -> T:
            # One read transaction: every statement in fn sees the same snapshot.
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return self._retry(snapshot)
