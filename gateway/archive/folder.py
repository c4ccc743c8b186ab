"""An archive's data as files in a folder: written from any ``Snapshot`` (``dump``) and
read back as one (``FolderSnapshot``). The tables are ``data/<group>/<table>.jsonl``
(``format.py``), the curated memory ``memories/MEMORY.md`` and
``memories/users/PLATFORM/ID/USER.md`` — the layout of the SQLite home, so a person can
read them as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from mnemo.gateway.archive.format import MEMORIES, Row, Table, Written, read_table, write_table
from mnemo.gateway.archive.ports import Snapshot, Source
from mnemo.gateway.errors import UnsafeArchive
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef


@dataclass(frozen=True, slots=True)
class Dumped:
    tables: list[Written]
    curated: list[PurePosixPath]  # paths under ``memories/``


def curated_path(rel: PurePosixPath) -> UserRef | None:
    """The owner a curated file's path names: None for ``MEMORY.md``, the account for
    ``users/PLATFORM/ID/USER.md``. Raises ``UnsafeArchive`` for any other path."""
    parts = rel.parts
    if parts == ("MEMORY.md",):
        return None
    if len(parts) == 4 and parts[0] == "users" and parts[3] == "USER.md":
        try:
            return UserRef(parts[1], parts[2])
        except InvalidIdentifier as e:
            raise UnsafeArchive(f"{MEMORIES}/{rel}: {e}") from None
    raise UnsafeArchive(f"{MEMORIES}/{rel} is not a curated memory file")


def user_file(user: UserRef) -> PurePosixPath:
    return PurePosixPath("users", user.platform, user.user_id, "USER.md")


def dump(snapshot: Snapshot, folder: Path) -> Dumped:
    """Write ``snapshot`` into ``folder`` (files 0600, folders 0700)."""
    ensure_folder(folder)
    written = [write_table(folder, table, snapshot.rows(table)) for table in snapshot.tables()]
    curated: list[PurePosixPath] = []
    for rel, text in snapshot.curated():
        curated_path(rel)
        path = folder.joinpath(MEMORIES, *rel.parts)
        ensure_folder(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        curated.append(rel)
    for path in folder.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    return Dumped(written, curated)


@dataclass
class FolderSnapshot:
    """The data of an unpacked archive, as a ``Snapshot`` a store can load."""

    folder: Path
    source: Source
    held: Sequence[Table]  # the tables its manifest lists, in load order
    curated_files: Sequence[PurePosixPath] = field(default_factory=list)

    def tables(self) -> Sequence[Table]:
        return self.held

    def rows(self, table: Table) -> Iterator[Row]:
        return read_table(self.folder, table)

    def curated(self) -> Iterator[tuple[PurePosixPath, str]]:
        for rel in self.curated_files:
            curated_path(rel)
            path = self.folder.joinpath(MEMORIES, *rel.parts)
            try:
                yield rel, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UnsafeArchive(f"{MEMORIES}/{rel} is not UTF-8 text") from None
