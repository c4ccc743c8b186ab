"""What a storage backend offers archives (``Backend.archive()`` in ``gateway/storage.py``).

``mnemo/archives`` (export, backups, restore, the erasure's scrub) is the only caller;
it runs these in a worker thread: every method blocks. Errors are ``ArchiveRefused``
(a store that cannot be read or written, with the reason in one line) and
``UnsafeArchive`` (an archive whose rows are not what the format allows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from mnemo.gateway.archive.format import Row, Table


@dataclass(frozen=True, slots=True)
class Source:
    """Where a snapshot's rows come from, for the manifest (shown, never branched on)."""

    backend: str  # "sqlite" | "postgresql"
    schema: str  # its schema, in words: "13 steps, the last 0013_jobs_dedupe_key"


class Snapshot(Protocol):
    """One consistent read of a profile's data: a backend's (``ArchiveStore.snapshot``)
    or an unpacked archive's. Rows come in load order with normalized values
    (``format.normalize``); ``curated`` gives each curated file as (its path under
    ``memories/``: ``MEMORY.md`` or ``users/PLATFORM/ID/USER.md``, its text)."""

    source: Source

    def tables(self) -> Sequence[Table]:
        """The archive tables this snapshot holds (the holographic ones only where the
        profile has facts), in load order."""
        ...

    def rows(self, table: Table) -> Iterator[Row]: ...

    def curated(self) -> Iterator[tuple[PurePosixPath, str]]: ...


@dataclass(frozen=True, slots=True)
class Contents:
    """What a store holds: rows per table label, curated files (or rows)."""

    rows: dict[str, int] = field(default_factory=dict)
    curated: int = 0

    @property
    def holds_data(self) -> bool:
        return self.curated > 0 or any(self.rows.values())

    def describe(self) -> str:
        parts = [f"{n:,} {label.split('/')[-1]}" for label, n in self.rows.items() if n]
        if self.curated:
            parts.append(f"{self.curated} curated memory file{'s' if self.curated != 1 else ''}")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a restore wrote: rows per table label, curated files (or rows)."""

    rows: dict[str, int]
    curated: int


class ArchiveStore(Protocol):
    """A backend's side of archives. ``owned`` are the paths under the home that are
    the store's (its database files, what an earlier backend left there, the curated
    folder): never archived as files, the snapshot stands for them."""

    name: str
    owned: tuple[Path, ...]

    def contents(self) -> Contents:
        """What the store holds now, read-only (creates nothing)."""
        ...

    def snapshot(self) -> AbstractContextManager[Snapshot]:
        """One consistent read while the bot may write (SQLite: the online backup API;
        PostgreSQL: one REPEATABLE READ, READ ONLY transaction)."""
        ...

    def load(self, source: Snapshot, *, aside: Path) -> Loaded:
        """Replace the store's data with ``source``'s, all or nothing: what it held is
        kept under ``aside`` first (SQLite: its files moved there; PostgreSQL: its rows
        as JSON lines), and a failed load leaves it as it was."""
        ...
