"""Which members an archive may hold, and reading a foreign one safely.

Extraction is defensive: only regular files and folders, no absolute paths, no ``..``,
no links or devices, only the names of a profile (below), every member's header
checked before its data is read — a bomb is refused at its first oversized header —
and nothing written before every member has been checked.

Version 2 (``export.py``)::

    mnemo-export.json  config.yaml  SOUL.md
    data/state/<table>.jsonl  data/holographic/<table>.jsonl
    memories/MEMORY.md  memories/users/<platform>/<id>/USER.md
    skills/…  media/…  providers/<name>/…

Version 1 (0.1's ``mnemo export``) had ``state.db`` (and ``providers/holographic/
facts.db``) as SQLite files instead of ``data/`` and no ``media/``.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mnemo.gateway.archive.format import BY_LABEL
from mnemo.gateway.errors import ArchiveRefused, UnsafeArchive
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.provider_config import SECRETS_FILE
from mnemo.memory.scope import validate_id

MANIFEST = "mnemo-export.json"
FORMAT = "mnemo-profile"
VERSION = 2
LEGACY = 1  # 0.1's archives: still restored
NEVER = {".env", SECRETS_FILE, "admin_token"}
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
SQLITE_MAGIC = b"SQLite format 3\x00"
# Caps on what an archive may hold (export refuses to write what a restore would refuse).
MAX_MEMBER_BYTES = 2 * 1024**3
MAX_TOTAL_BYTES = 4 * 1024**3
MAX_MEMBERS = 100_000
MAX_DEPTH = 8
_TOP_FILES = {VERSION: ("config.yaml", "SOUL.md"), LEGACY: ("config.yaml", "SOUL.md", "state.db")}
_TOP_DIRS = {
    VERSION: ("memories", "skills", "providers", "media", "data"),
    LEGACY: ("memories", "skills", "providers"),
}
_TABLE_MEMBERS = {t.member for t in BY_LABEL.values()}


def size_text(n: int) -> str:
    return f"{n / 1024**2:,.0f} MB" if n >= 1024**2 else f"{n:,} bytes"


def check_name(path: PurePosixPath) -> None:
    """Each part a safe folder or file name (no control characters, ``..``, separators)."""
    parts = path.parts
    if len(parts) > MAX_DEPTH:
        raise ArchiveRefused(f"{str(path)!r} is nested deeper than {MAX_DEPTH} folders")
    for part in parts:
        try:
            validate_id("file name", part)
        except InvalidIdentifier as e:
            raise ArchiveRefused(f"{str(path)!r}: {e}") from None


def in_layout(path: PurePosixPath, is_dir: bool, version: int) -> bool:
    parts = path.parts
    top = parts[0]
    if len(parts) == 1:
        return (top in _TOP_FILES[version] and not is_dir) or (top in _TOP_DIRS[version] and is_dir)
    if top not in _TOP_DIRS[version]:
        return False
    if top == "memories":
        if parts[1] == "users":
            return len(parts) <= 4 if is_dir else (len(parts) == 5 and parts[4] == "USER.md")
        return not is_dir and parts[1:] == ("MEMORY.md",)
    if top == "data":
        return (is_dir and len(parts) == 2 and parts[1] in ("state", "holographic")) or (
            not is_dir and path.as_posix() in _TABLE_MEMBERS
        )
    return True  # skills/, media/, providers/


def is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(16) == SQLITE_MAGIC


@dataclass(frozen=True, slots=True)
class Member:
    info: tarfile.TarInfo
    path: PurePosixPath


@dataclass(frozen=True, slots=True)
class Checked:
    """An archive's members (the manifest aside) and its manifest, all checked."""

    members: list[Member]
    manifest: dict[str, Any]

    @property
    def version(self) -> int:
        return int(self.manifest["version"])


def open_archive(archive: Path) -> tarfile.TarFile:
    if not archive.is_file():
        raise ArchiveRefused(f"{archive}: no such file")
    try:
        return tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as e:
        raise UnsafeArchive(f"{archive}: not a readable .tar.gz: {e}") from None


def check_members(tar: tarfile.TarFile) -> Checked:
    """Validate every member before anything is written; raise ``UnsafeArchive``."""
    members: list[Member] = []
    seen_manifest = False
    names: set[PurePosixPath] = set()
    total = count = 0
    # Header by header (never getmembers()): a bomb is refused at its first oversized
    # header, before its data is decompressed, let alone written.
    while (info := _next(tar)) is not None:
        count += 1
        if count > MAX_MEMBERS:
            raise UnsafeArchive(f"more than {MAX_MEMBERS:,} entries: not a mnemo export")
        if info.issparse():
            raise UnsafeArchive(f"{info.name!r} is a sparse file; only plain files are allowed")
        if info.size > MAX_MEMBER_BYTES:
            raise UnsafeArchive(
                f"{info.name!r} is {size_text(info.size)}; a member may be at most {size_text(MAX_MEMBER_BYTES)}"
            )
        total += info.size
        if total > MAX_TOTAL_BYTES:
            raise UnsafeArchive(
                f"the archive unpacks to over {size_text(MAX_TOTAL_BYTES)}, the most an import takes"
            )
        raw = info.name
        if raw.startswith(("/", "\\")) or "\\" in raw or (len(raw) > 1 and raw[1] == ":"):
            raise UnsafeArchive(f"absolute or non-POSIX path in archive: {raw!r}")
        parts = [p for p in PurePosixPath(raw).parts if p != "."]
        if not parts or ".." in parts:
            raise UnsafeArchive(f"path escapes the home folder: {raw!r}")
        if not (info.isfile() or info.isdir()):
            raise UnsafeArchive(f"{raw!r} is a link or special file; only files and folders are allowed")
        path = PurePosixPath(*parts)
        try:
            check_name(path)
        except ArchiveRefused as e:
            raise UnsafeArchive(str(e)) from None
        if path in names:
            raise UnsafeArchive(f"{raw!r} appears twice in the archive")
        names.add(path)
        if path.name in NEVER:
            raise UnsafeArchive(f"{raw!r} must never be imported (secrets stay on their machine)")
        if str(path) == MANIFEST:
            seen_manifest = True
            continue
        if not (in_layout(path, info.isdir(), VERSION) or in_layout(path, info.isdir(), LEGACY)):
            raise UnsafeArchive(f"{raw!r} is not part of a mnemo profile")
        members.append(Member(info, path))
    if not seen_manifest:
        raise UnsafeArchive(f"no {MANIFEST}: not a mnemo export")
    try:
        manifest = json.loads(_read(tar, MANIFEST))
    except (ValueError, UnicodeDecodeError) as e:
        raise UnsafeArchive(f"{MANIFEST} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UnsafeArchive("not a mnemo profile export")
    version = manifest.get("version")
    if version not in (VERSION, LEGACY):
        raise UnsafeArchive(
            f"export format version {version!r} is not supported (this mnemo reads {LEGACY} and {VERSION})"
        )
    for m in members:
        if not in_layout(m.path, m.info.isdir(), version):
            raise UnsafeArchive(f"{m.path} does not belong in an archive of format version {version}")
    return Checked(members, manifest)


def _next(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    try:
        return tar.next()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise UnsafeArchive(f"the archive is damaged: {e}") from None


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    try:
        f = tar.extractfile(name)
        if f is None:
            raise UnsafeArchive(f"{name} is not a file")
        return f.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise UnsafeArchive(f"the archive is damaged: {e}") from None


def check_room(where: Path, needed: int) -> None:
    existing = next(p for p in (where, *where.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise UnsafeArchive(
            f"the archive unpacks to {size_text(needed)}, but {existing} has only {size_text(free)} free"
        )


def extract(tar: tarfile.TarFile, members: list[Member], staging: Path) -> list[PurePosixPath]:
    """Write the checked members under ``staging`` (files 0600, folders 0700); the files."""
    written: list[PurePosixPath] = []
    try:
        for m in members:
            target = staging.joinpath(*m.path.parts)
            if m.info.isdir():
                target.mkdir(parents=True, exist_ok=True, mode=0o700)
                continue
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            source = tar.extractfile(m.info)
            if source is None:
                raise UnsafeArchive(f"{m.path} cannot be read")
            with source, open(target, "xb") as out:
                shutil.copyfileobj(source, out)
            os.chmod(target, 0o600)
            written.append(m.path)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise UnsafeArchive(f"the archive is damaged: {e}") from None
    return written
