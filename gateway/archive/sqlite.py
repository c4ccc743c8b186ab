"""SQLite's side of archives (``ArchiveStore`` of ``ports.py``): ``state.db``, the
holographic ``facts.db`` and the curated files under ``memories/``.

* **Snapshot**: each database copied with SQLite's online backup API (WAL content
  included, no torn page, while the bot writes), the copy brought to this mnemo's
  schema (an archive of 0.1 holds an older ``state.db``), then read. The curated files
  are read as they are (every write of one is an atomic rename).
* **Load**: the new ``state.db``, ``facts.db`` and ``memories/`` are built beside the
  old ones (``.restore-*``) — tables created by the migrations, rows inserted in one
  transaction per database, the search indexes filled by their triggers — and only
  then swapped in; the old ones move to ``aside``. A failed load removes what it built
  and leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mnemo.gateway.archive.folder import curated_path, user_file
from mnemo.gateway.archive.format import (
    FACT_TABLES,
    HOLOGRAPHIC,
    STATE_TABLES,
    Row,
    Table,
    normalize,
)
from mnemo.gateway.archive.ports import Contents, Loaded, Snapshot, Source
from mnemo.gateway.errors import ArchiveRefused
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.db import create_private_database
from mnemo.memory.errors import InvalidIdentifier, StoreError
from mnemo.memory.migrations import Migration, migrate
from mnemo.memory.scope import UserRef

SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
BATCH = 1000


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    try:
        conn.execute(f'SELECT rowid FROM "{table}" LIMIT 0')
    except sqlite3.OperationalError:
        return False
    return True


def _schema(conn: sqlite3.Connection) -> str:
    try:
        row = conn.execute(
            "SELECT version, name FROM schema_migrations ORDER BY version DESC LIMIT 1"
        ).fetchone()
    except sqlite3.OperationalError:
        row = None
    return f"{row[0]} steps, the last {row[1]}" if row else "no schema"


def curated_files(memories: Path) -> list[tuple[PurePosixPath, Path]]:
    """The curated files under ``memories`` (their archive path, their file)."""
    out: list[tuple[PurePosixPath, Path]] = []
    shared = memories / "MEMORY.md"
    if shared.is_file() and not shared.is_symlink():
        out.append((PurePosixPath("MEMORY.md"), shared))
    for path in sorted((memories / "users").glob("*/*/USER.md")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            ref = UserRef(path.parent.parent.name, path.parent.name)
        except InvalidIdentifier:
            continue  # not a name mnemo writes: it never reads it either
        out.append((user_file(ref), path))
    return out


@dataclass
class _Snapshot:
    source: Source
    state: sqlite3.Connection | None
    facts: sqlite3.Connection | None
    memories: Path

    def tables(self) -> Sequence[Table]:
        return [*(STATE_TABLES if self.state else ()), *(FACT_TABLES if self.facts else ())]

    def rows(self, table: Table) -> Iterator[Row]:
        conn = self.facts if table.group == HOLOGRAPHIC else self.state
        if conn is None:
            return
        present = set(_columns(conn, table.name))
        if not present:
            return
        cols = [c for c in table.columns if c.name in present]
        order = "rowid" if _has_rowid(conn, table.name) else ", ".join(f'"{k}"' for k in table.key)
        names = ", ".join(f'"{c.name}"' for c in cols)
        for values in conn.execute(f'SELECT {names} FROM "{table.name}" ORDER BY {order}'):
            yield {c.name: normalize(c.kind, v) for c, v in zip(cols, values, strict=True)}

    def curated(self) -> Iterator[tuple[PurePosixPath, str]]:
        for rel, path in curated_files(self.memories):
            try:
                yield rel, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ArchiveRefused(f"{path} is not UTF-8 text: fix or remove it, then try again") from None


class SqliteArchive:
    """``state.db``, ``facts.db`` and ``memories/`` of one home (or of an unpacked
    archive of 0.1, which has the same three); ``migrations`` is ``state.db``'s list
    (``gateway/storage.py`` assembles it: this sub-package sits below it)."""

    name = "sqlite"

    def __init__(
        self, state_db: Path, facts_db: Path, memories: Path, migrations: Sequence[Migration]
    ) -> None:
        self.migrations = tuple(migrations)
        self.state_db = state_db
        self.facts_db = facts_db
        self.memories = memories
        self.owned: tuple[Path, ...] = (state_db, facts_db, memories)

    # --- reads -----------------------------------------------------------------------
    def contents(self) -> Contents:
        rows: dict[str, int] = {}
        for path, tables in ((self.state_db, STATE_TABLES), (self.facts_db, FACT_TABLES)):
            if not path.is_file():
                continue
            try:
                conn = _ro(path)
                try:
                    existing = {
                        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                    }
                    for t in tables:
                        if t.name in existing:
                            rows[t.label] = int(
                                conn.execute(f'SELECT count(*) FROM "{t.name}"').fetchone()[0]
                            )
                finally:
                    conn.close()
            except sqlite3.DatabaseError as e:
                raise ArchiveRefused(f"{path} cannot be read ({e})") from None
        return Contents(rows, len(curated_files(self.memories)))

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        with tempfile.TemporaryDirectory(prefix="mnemo-snapshot-") as scratch:
            state = self._copy(self.state_db, Path(scratch) / "state.db", self._migrate_state)
            facts = self._copy(self.facts_db, Path(scratch) / "facts.db", self._migrate_facts)
            try:
                source = Source(self.name, _schema(state) if state is not None else "no state.db")
                yield _Snapshot(source, state, facts, self.memories)
            finally:
                for conn in (state, facts):
                    if conn is not None:
                        conn.close()

    def _copy(self, src: Path, dst: Path, migrate: Callable[[Path], None]) -> sqlite3.Connection | None:
        """A consistent copy of ``src`` (None when it does not exist), at this mnemo's schema."""
        if not src.is_file():
            return None
        try:
            source = _ro(src)
            target = sqlite3.connect(dst)
            try:
                source.backup(target)
            finally:
                target.close()
                source.close()
            migrate(dst)
            return sqlite3.connect(dst, check_same_thread=False)
        except (sqlite3.DatabaseError, StoreError) as e:
            raise ArchiveRefused(f"{src} cannot be read as a mnemo database ({e})") from None

    def _migrate_state(self, path: Path) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"sessions", "messages"} <= tables:
                raise StoreError("not a mnemo state.db: no sessions and messages tables")
            migrate(conn, self.migrations, path=path)
        finally:
            conn.close()

    @staticmethod
    def _migrate_facts(path: Path) -> None:
        from mnemo.providers.holographic.store import FactStore

        store = FactStore(path)
        store.open()
        store.close()

    # --- load ------------------------------------------------------------------------
    def load(self, source: Snapshot, *, aside: Path) -> Loaded:
        staged = {
            self.state_db: self.state_db.with_name(".restore-state.db"),
            self.facts_db: self.facts_db.with_name(".restore-facts.db"),
            self.memories: self.memories.with_name(".restore-memories"),
        }
        for path in staged.values():
            _remove(path)
        try:
            tables = list(source.tables())
            state = [t for t in tables if t in STATE_TABLES]
            rows = _load_state(staged[self.state_db], source, state, self.migrations)
            held = [t for t in tables if t in FACT_TABLES]
            if held:
                rows |= _load_facts(staged[self.facts_db], source, held)
            curated = _load_curated(staged[self.memories], source)
        except BaseException:
            for path in staged.values():
                _remove(path)
            raise
        for live, new in staged.items():  # the old ones aside, then the new ones in
            for path in (live, *(live.with_name(live.name + s) for s in SIDE_SUFFIXES)):
                if path.exists() or path.is_symlink():
                    home = self.state_db.parent
                    dest = aside / path.relative_to(home) if path.is_relative_to(home) else aside / path.name
                    ensure_folder(dest.parent)
                    os.replace(path, dest)
            if new.exists():
                ensure_folder(live.parent)
                os.replace(new, live)
        return Loaded(rows, curated)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        for p in (path, *(path.with_name(path.name + s) for s in SIDE_SUFFIXES)):
            p.unlink(missing_ok=True)


def _insert(conn: sqlite3.Connection, table: Table, rows: Iterator[Row]) -> int:
    """Insert ``rows`` in batches of the same columns; the number inserted."""
    n = 0
    batch: list[tuple[object, ...]] = []
    columns: tuple[str, ...] | None = None

    def flush() -> None:
        if batch and columns is not None:
            names = ", ".join(f'"{c}"' for c in columns)
            marks = ", ".join("?" for _ in columns)
            conn.executemany(f'INSERT OR REPLACE INTO "{table.name}" ({names}) VALUES ({marks})', batch)
            batch.clear()

    for row in rows:
        keys = tuple(row)
        if keys != columns or len(batch) >= BATCH:
            flush()
            columns = keys
        batch.append(tuple(row.values()))
        n += 1
    flush()
    return n


def _load_state(
    path: Path, source: Snapshot, tables: list[Table], migrations: Sequence[Migration]
) -> dict[str, int]:
    create_private_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        migrate(conn, migrations, path=path)
        counts: dict[str, int] = {}
        counters: list[tuple[int, int, str]] = []
        conn.execute("BEGIN IMMEDIATE")
        for table in tables:
            rows = source.rows(table)
            if table.name == "sessions":
                rows = _keep_counters(rows, counters)
            counts[table.label] = _insert(conn, table, rows)
        # The messages' insert trigger counted them into their sessions again: back to
        # the archived counts.
        conn.executemany("UPDATE sessions SET message_count = ?, tool_call_count = ? WHERE id = ?", counters)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as e:
        raise ArchiveRefused(f"the archive's rows do not load into a new state.db: {e}") from None
    finally:
        conn.close()
    return counts


def _keep_counters(rows: Iterator[Row], counters: list[tuple[int, int, str]]) -> Iterator[Row]:
    for row in rows:
        counters.append((row.get("message_count") or 0, row.get("tool_call_count") or 0, row["id"]))
        yield row


def _load_facts(path: Path, source: Snapshot, tables: list[Table]) -> dict[str, int]:
    from mnemo.providers.holographic.store import FactStore

    store = FactStore(path)  # the schema, the search index and its triggers
    try:
        store.open()
        store.close()
    except StoreError as e:
        raise ArchiveRefused(f"cannot create {path.name}: {e}") from None
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        counts = {t.label: _insert(conn, t, source.rows(t)) for t in tables}
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as e:
        raise ArchiveRefused(f"the archive's facts do not load into a new facts.db: {e}") from None
    finally:
        conn.close()
    return counts


def _load_curated(folder: Path, source: Snapshot) -> int:
    n = 0
    for rel, text in source.curated():
        curated_path(rel)
        path = folder.joinpath(*rel.parts)
        ensure_folder(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        n += 1
    return n
