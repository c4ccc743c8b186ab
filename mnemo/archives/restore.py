"""Verifying and restoring an archive (``mnemo import FILE``, ``mnemo backup verify|
restore``), on whichever backend the target profile is configured for: a PostgreSQL
archive restores into a SQLite home and a SQLite one into PostgreSQL.

* **Verify** unpacks into a scratch folder and checks every member against the
  manifest's sha256, that nothing is missing or extra, every table's row count and
  that every row is what the format allows; a version-1 archive's databases with
  ``quick_check``.
* **Restore** verifies the same way into a staging folder inside the home, refuses a
  target that holds data (rows, curated memory, facts, a persona, skills or media)
  unless ``force``, then loads the rows through the target's ``ArchiveStore`` (all or
  nothing) and moves the files into place. With ``force`` what it replaces is kept in
  ``.replaced-<time>/``. A version-1 archive (0.1's ``state.db``) is read as the
  SQLite snapshot it is, so it restores into either backend too.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mnemo.archives.layout import (
    LEGACY,
    MANIFEST,
    SIDE_SUFFIXES,
    check_members,
    check_room,
    extract,
    is_sqlite,
    open_archive,
)
from mnemo.archives.secrets import restored_config
from mnemo.gateway.archive.folder import FolderSnapshot, curated_path
from mnemo.gateway.archive.format import BY_LABEL, MEMORIES, count_lines, tables_named
from mnemo.gateway.archive.ports import ArchiveStore, Loaded, Snapshot, Source
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import ArchiveRefused, UnsafeArchive
from mnemo.memory.atomic import ensure_folder


@dataclass(frozen=True, slots=True)
class Unpacked:
    """An archive checked and unpacked into ``folder``."""

    folder: Path
    manifest: dict[str, Any]
    files: list[PurePosixPath]

    @property
    def version(self) -> int:
        return int(self.manifest["version"])

    @property
    def source(self) -> Source:
        src = self.manifest.get("source")
        if isinstance(src, dict):
            return Source(str(src.get("backend", "?")), str(src.get("schema", "?")))
        return Source("sqlite", "format version 1")

    @property
    def rows(self) -> int:
        tables = self.manifest.get("tables") or {}
        return sum(int(t.get("rows", 0)) for t in tables.values())

    @property
    def left_out(self) -> list[str]:
        return [str(x) for x in self.manifest.get("left_out") or []]

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        """The archive's data as a snapshot a store loads."""
        if self.version == LEGACY:
            from mnemo.gateway.archive.sqlite import SqliteArchive
            from mnemo.gateway.storage import STATE_MIGRATIONS

            legacy = SqliteArchive(
                self.folder / "state.db",
                self.folder / "providers" / "holographic" / "facts.db",
                self.folder / MEMORIES,
                STATE_MIGRATIONS,
            )
            with legacy.snapshot() as snap:
                yield snap
            return
        tables = tables_named(list(self.manifest.get("tables") or {}))
        curated = [PurePosixPath(str(c)) for c in self.manifest.get("curated") or []]
        yield FolderSnapshot(self.folder, self.source, tables, curated)


def unpack(archive: Path, folder: Path) -> Unpacked:
    """Check ``archive``, write it under ``folder`` and verify what was written: every
    checksum, the file list, every table's rows. Raises ``UnsafeArchive``/``ArchiveRefused``."""
    with open_archive(archive) as tar:
        checked = check_members(tar)
        check_room(folder, sum(m.info.size for m in checked.members))
        written = extract(tar, checked.members, folder)
    manifest = checked.manifest
    checksums = manifest.get("sha256")
    if not isinstance(checksums, dict):
        raise ArchiveRefused(
            f"{archive.name} has no checksums in its manifest (written before checksums were stored)"
        )
    names = {rel.as_posix() for rel in written}
    missing = sorted(set(manifest.get("files") or []) - names)
    if missing:
        raise ArchiveRefused(f"files listed in the manifest are missing: {', '.join(missing[:5])}")
    from mnemo.archives.export import file_sha256

    for rel in written:
        expected = checksums.get(rel.as_posix())
        if expected is None:
            raise ArchiveRefused(f"{rel} has no checksum in the manifest")
        if file_sha256(folder.joinpath(*rel.parts)) != expected:
            raise ArchiveRefused(f"{rel} does not match its checksum: the archive is corrupted")
    unpacked = Unpacked(folder, manifest, written)
    if unpacked.version == LEGACY:
        _verify_legacy(unpacked)
    else:
        _verify_tables(unpacked, names)
    return unpacked


def _verify_tables(unpacked: Unpacked, names: set[str]) -> None:
    tables = unpacked.manifest.get("tables")
    if not isinstance(tables, dict):
        raise UnsafeArchive(f"{MANIFEST} lists no tables")
    for label, entry in tables.items():
        table = BY_LABEL.get(label)
        if table is None:
            raise UnsafeArchive(
                f"table {label!r} is unknown to this mnemo (an archive from a newer version?)"
            )
        rows = entry.get("rows") if isinstance(entry, dict) else None
        if table.member not in names or not isinstance(rows, int):
            raise UnsafeArchive(f"{table.member} is missing, or the manifest gives no row count for it")
        found = count_lines(unpacked.folder.joinpath(*PurePosixPath(table.member).parts))
        if found != rows:
            raise ArchiveRefused(f"{table.member} holds {found:,} rows, the manifest says {rows:,}")
    for rel in unpacked.manifest.get("curated") or []:
        curated_path(PurePosixPath(str(rel)))
        if f"{MEMORIES}/{rel}" not in names:
            raise UnsafeArchive(f"{MEMORIES}/{rel} is listed in the manifest but missing")
    with unpacked.snapshot() as snapshot:  # every row decodes (kinds, known columns)
        for table in snapshot.tables():
            for _ in snapshot.rows(table):
                pass
        for _ in snapshot.curated():
            pass


def _verify_legacy(unpacked: Unpacked) -> None:
    """Version 1: every database sound (``quick_check``), ``state.db`` a mnemo one."""
    from mnemo.gateway.storage_sqlite import quick_check

    for rel in unpacked.files:
        path = unpacked.folder.joinpath(*rel.parts)
        database = rel.as_posix() == "state.db" or rel.name.endswith((".db", ".sqlite", ".sqlite3"))
        if not database and not (rel.parts[0] == "providers" and is_sqlite(path)):
            continue
        if not is_sqlite(path):
            raise UnsafeArchive(f"{rel} is not a SQLite database")
        try:
            problems = quick_check(path, limit=3)
            if not problems and rel.as_posix() == "state.db":
                conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
                try:
                    tables = {
                        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                    }
                finally:
                    conn.close()
                if not {"sessions", "messages"} <= tables:
                    raise UnsafeArchive(
                        f"{rel} is a SQLite database, but not a mnemo state.db (no sessions/messages tables)"
                    )
        except sqlite3.DatabaseError as e:
            raise UnsafeArchive(f"{rel} is not a usable database: {e}") from None
        if problems:
            raise UnsafeArchive(f"{rel} is damaged (quick_check: {'; '.join(problems)})")


def source_of(archive: Path) -> str:
    """The backend an archive was taken from, read from its manifest alone ("?" when it
    cannot be read: ``verify`` says why)."""
    import json

    try:
        with open_archive(archive) as tar:
            f = tar.extractfile(MANIFEST)
            manifest = json.loads(f.read()) if f is not None else {}
    except (ArchiveRefused, KeyError, ValueError, OSError):
        return "?"
    if manifest.get("version") == LEGACY:
        return "sqlite"
    source = manifest.get("source")
    return str(source.get("backend", "?")) if isinstance(source, dict) else "?"


@dataclass(frozen=True, slots=True)
class Verified:
    files: int
    rows: int
    source: Source
    version: int


def verify_archive(archive: Path) -> Verified:
    """Everything ``unpack`` checks, in a scratch folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="mnemo-verify-") as scratch:
        try:
            unpacked = unpack(archive, Path(scratch) / "archive")
        except (OSError, sqlite3.Error) as e:
            raise UnsafeArchive(f"the archive cannot be unpacked: {e}") from None
        return Verified(len(unpacked.files), unpacked.rows, unpacked.source, unpacked.version)


# --- restore --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Restored:
    files: int
    loaded: Loaded
    source: Source
    replaced: Path | None  # where what it replaced was kept
    left_out: list[str]  # what the archive left out (secrets to set again)


_PROFILE_FILES = ("SOUL.md",)
_PROFILE_DIRS = ("skills", "media")


def profile_files(home: Path) -> list[str]:
    """The persona, skills and media a home holds (what a restore would replace)."""
    found = [name for name in _PROFILE_FILES if (home / name).exists()]
    found += [f"{d}/" for d in _PROFILE_DIRS if (home / d).is_dir() and any((home / d).iterdir())]
    return found


def restore_archive(
    settings: Settings, store: ArchiveStore, archive: Path, *, force: bool = False
) -> Restored:
    """Restore ``archive`` into the profile of ``settings`` (its rows through ``store``,
    the configured backend's). The caller makes sure no bot serves it meanwhile."""
    home = settings.home
    if not archive.is_file():
        raise ArchiveRefused(f"{archive}: no such file")
    held = _what_it_holds(store, home)
    if held and not force:
        raise ArchiveRefused(
            f"{home} already holds data ({held}); use --force to restore over it (what it replaces is kept aside)"
        )
    created = not home.exists()
    ensure_folder(home)
    staging = Path(tempfile.mkdtemp(dir=home, prefix=".import-"))
    try:
        try:
            unpacked = unpack(archive, staging)
        except (OSError, sqlite3.Error) as e:
            raise UnsafeArchive(f"the archive cannot be unpacked: {e}") from None
        aside = home / time.strftime(".replaced-%Y%m%d-%H%M%S")
        with unpacked.snapshot() as snapshot:
            loaded = store.load(snapshot, aside=aside)
        files = [f for f in unpacked.files if _is_profile_file(f, unpacked.version)]
        _install(staging, home, files, aside)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(home, ignore_errors=True)  # refused: leave no empty home behind
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return Restored(len(files), loaded, unpacked.source, aside if aside.exists() else None, unpacked.left_out)


def _what_it_holds(store: ArchiveStore, home: Path) -> str:
    try:
        contents = store.contents()
        held = contents.describe() if contents.holds_data else ""
    except ArchiveRefused as e:
        held = f"a store that cannot be read: {e}"
    files = profile_files(home)
    return ", ".join(x for x in (held, ", ".join(files)) if x)


def _is_profile_file(rel: PurePosixPath, version: int) -> bool:
    """A file ``_install`` puts in place: not the rows (the store loaded them), not the
    curated files (idem), not a version-1 database."""
    top = rel.parts[0]
    if top in ("data", MEMORIES) or rel.as_posix() == "state.db":
        return False
    return not (version == LEGACY and rel.as_posix() == "providers/holographic/facts.db")


def _install(staging: Path, home: Path, files: list[PurePosixPath], aside: Path) -> None:
    """Move the staged files into place; whatever they replace goes under ``aside``.
    ``skills/`` and ``media/`` are replaced as whole trees (a file deleted on the old
    machine does not survive here); ``providers/`` is merged (it holds local secrets);
    ``config.yaml`` is merged with the target's (``secrets.restored_config``)."""

    def set_aside(path: Path) -> None:
        if not path.exists() and not path.is_symlink():
            return
        dest = aside / path.relative_to(home)
        ensure_folder(dest.parent)
        os.replace(path, dest)

    for top in _PROFILE_DIRS:
        set_aside(home / top)
    for rel in files:
        target = home.joinpath(*rel.parts)
        staged = staging.joinpath(*rel.parts)
        if rel.as_posix() == "config.yaml":
            current = target.read_text(encoding="utf-8-sig") if target.is_file() else None
            merged = restored_config(staged.read_text(encoding="utf-8"), current)
            if merged == current:
                continue
            staged.write_text(merged, encoding="utf-8")
        set_aside(target)
        for suffix in SIDE_SUFFIXES:  # a stale WAL beside a replaced database would be replayed into it
            set_aside(target.with_name(target.name + suffix))
        ensure_folder(target.parent)  # every missing level 0700
        os.replace(staged, target)
