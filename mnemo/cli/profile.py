"""``mnemo export FILE`` / ``mnemo import FILE``: move a whole profile between machines.

The archive is a ``.tar.gz`` holding, relative to ``$MNEMO_HOME``:

* ``mnemo-export.json`` — manifest (format, version, creation time, file list);
* ``config.yaml``, ``SOUL.md``, ``memories/``, ``skills/``;
* ``state.db`` — copied with SQLite's online backup API, so a running gateway's
  database is captured consistently (WAL content included, no torn pages);
* provider data — every path a provider lists in ``backup_paths`` (SQLite files again
  through the backup API) plus its ``providers/<name>/config.json``.

Never included: ``.env``, providers' ``secrets.json``, lock files, SQLite ``-wal`` /
``-shm`` side files, symbolic links. Secrets stay on the old machine.

Import refuses a home that holds anything but ``.env`` unless ``--force``; with it,
everything the archive replaces is first moved to ``.replaced-<time>/`` inside the home.
Extraction is defensive: only regular files and folders, no absolute paths, no ``..``,
no links or devices, only the top-level names above, nothing written before every
member has been checked. Stop the gateway before importing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sqlite3
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.discovery import discover
from mnemo.memory.provider_config import CONFIG_FILE, SECRETS_FILE

log = structlog.get_logger(__name__)

MANIFEST = "mnemo-export.json"
FORMAT = "mnemo-profile"
VERSION = 1
TOP_FILES = ("config.yaml", "SOUL.md", "state.db")
TOP_DIRS = ("memories", "skills", "providers")
NEVER = {".env", SECRETS_FILE}
_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def register(subparsers: Any) -> None:
    exp = subparsers.add_parser("export", help="write the whole profile to a .tar.gz (no secrets)")
    exp.add_argument("file", metavar="FILE")
    exp.set_defaults(handler=_export)
    imp = subparsers.add_parser("import", help="restore a profile exported with `mnemo export`")
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--force", action="store_true", help="import into a non-empty home (replaced files are kept aside)")
    imp.set_defaults(handler=_import)


# --- export ------------------------------------------------------------------------
def _excluded(path: Path) -> bool:
    return path.name in NEVER or path.name.endswith((".lock", *_SIDE_SUFFIXES)) or path.is_symlink()


def _walk(root: Path) -> Iterator[Path]:
    if root.is_symlink():
        log.warning("symbolic link not exported", path=str(root))
        return
    if root.is_file():
        yield root
        return
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (base / d).is_symlink())
        for name in sorted(filenames):
            path = base / name
            if _excluded(path):
                continue
            yield path


def _provider_paths(home: Path) -> list[Path]:
    out: list[Path] = []
    for info in discover(home):
        if info.factory is None:
            continue
        provider = info.factory()
        config = home / "providers" / info.name / CONFIG_FILE
        candidates = [*provider.backup_paths(home), config]
        for path in candidates:
            path = Path(path)
            if not path.resolve().is_relative_to((home / "providers").resolve()):
                log.warning("provider backup path outside providers/ ignored", provider=info.name, path=str(path))
                continue
            out.extend(_walk(path))
    return out


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(16) == _SQLITE_MAGIC


def _sqlite_copy(src: Path, dst: Path) -> None:
    """A consistent copy of a live database through the online backup API."""
    source = sqlite3.connect(f"{src.resolve().as_uri()}?mode=ro", uri=True)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        # The copy is a single self-contained file: no WAL beside it.
        target.execute("PRAGMA journal_mode=DELETE")
    finally:
        target.close()
        source.close()


def collect(home: Path) -> list[Path]:
    """Every file the export takes, as absolute paths under ``home``."""
    files: list[Path] = []
    for name in TOP_FILES:
        path = home / name
        if path.is_file() and not path.is_symlink():
            files.append(path)
    for name in ("memories", "skills"):
        files.extend(_walk(home / name))
    files.extend(_provider_paths(home))
    return list(dict.fromkeys(files))


def export_profile(home: Path, dest: Path) -> list[str]:
    """Write the archive atomically; returns the member names (manifest excluded)."""
    home = home.resolve()
    dest = dest.resolve()
    files = [f for f in collect(home) if f.resolve() != dest]
    names = [f.relative_to(home).as_posix() for f in files]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory() as scratch, tarfile.open(tmp_name, "w:gz") as tar:
            manifest = {"format": FORMAT, "version": VERSION, "created_at": time.time(), "files": names}
            data = json.dumps(manifest, indent=2).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
            for path, name in zip(files, names, strict=True):
                source = path
                if _is_sqlite(path):
                    source = Path(scratch) / f"{len(os.listdir(scratch))}.db"
                    _sqlite_copy(path, source)
                tar.add(source, arcname=name, recursive=False)
        os.replace(tmp_name, dest)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return names


def _export(args: argparse.Namespace, settings: Settings) -> int:
    names = export_profile(settings.home, Path(args.file))
    print(f"exported {len(names)} files from {settings.home} to {args.file} (no .env or provider secrets)")
    return EXIT_OK


# --- import ------------------------------------------------------------------------
class UnsafeArchive(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Member:
    info: tarfile.TarInfo
    path: PurePosixPath


def check_members(tar: tarfile.TarFile) -> list[Member]:
    """Validate every member before anything is written; raise ``UnsafeArchive``."""
    members: list[Member] = []
    seen_manifest = False
    names: set[PurePosixPath] = set()
    for info in tar.getmembers():
        raw = info.name
        if raw.startswith(("/", "\\")) or "\\" in raw or (len(raw) > 1 and raw[1] == ":"):
            raise UnsafeArchive(f"absolute or non-POSIX path in archive: {raw!r}")
        path = PurePosixPath(raw)
        parts = [p for p in path.parts if p != "."]
        if not parts or ".." in parts:
            raise UnsafeArchive(f"path escapes the home folder: {raw!r}")
        if not (info.isfile() or info.isdir()):
            raise UnsafeArchive(f"{raw!r} is a link or special file; only files and folders are allowed")
        path = PurePosixPath(*parts)
        if path in names:
            raise UnsafeArchive(f"{raw!r} appears twice in the archive")
        names.add(path)
        if path.name in NEVER:
            raise UnsafeArchive(f"{raw!r} must never be imported (secrets stay on their machine)")
        top = parts[0]
        if str(path) == MANIFEST:
            seen_manifest = True
            continue
        if not ((top in TOP_FILES and len(parts) == 1 and info.isfile()) or top in TOP_DIRS):
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
    if manifest.get("version") != VERSION:
        raise UnsafeArchive(f"export format version {manifest.get('version')!r} is not supported (expected {VERSION})")
    return members


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    if f is None:
        raise UnsafeArchive(f"{name} is not a file")
    return f.read()


def home_is_empty(home: Path) -> bool:
    return not home.exists() or all(p.name == ".env" for p in home.iterdir())


def import_profile(home: Path, archive: Path, force: bool = False) -> tuple[int, Path | None]:
    """Restore ``archive`` into ``home``; returns (files written, folder of replaced
    files or None). Raises ``UnsafeArchive`` or ``FileExistsError``."""
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: no such file")
    if not force and not home_is_empty(home):
        raise FileExistsError(f"{home} is not empty; use --force to import anyway (replaced files are kept aside)")
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as e:
        raise UnsafeArchive(f"{archive}: not a readable .tar.gz: {e}") from e
    with tar:
        members = check_members(tar)
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = Path(tempfile.mkdtemp(dir=home, prefix=".import-"))
        try:
            written = _extract(tar, members, staging)
            replaced = _install(staging, home, written)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return len(written), replaced


def _extract(tar: tarfile.TarFile, members: list[Member], staging: Path) -> list[PurePosixPath]:
    written: list[PurePosixPath] = []
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
    return written


def _install(staging: Path, home: Path, files: list[PurePosixPath]) -> Path | None:
    """Move staged files into place; whatever they replace goes to ``.replaced-*``."""
    aside = home / time.strftime(".replaced-%Y%m%d-%H%M%S")
    moved_aside = False

    def set_aside(path: Path) -> None:
        nonlocal moved_aside
        if not path.exists() and not path.is_symlink():
            return
        dest = aside / path.relative_to(home)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
        moved_aside = True

    # memories/ and skills/ are replaced as whole trees, so a file deleted on the old
    # machine does not survive here; providers/ is merged (it holds local secrets).
    for top in ("memories", "skills"):
        if any(f.parts[0] == top for f in files):
            set_aside(home / top)
    for rel in files:
        target = home.joinpath(*rel.parts)
        set_aside(target)
        for suffix in _SIDE_SUFFIXES:
            # A stale WAL next to a replaced database would be replayed into it.
            set_aside(target.with_name(target.name + suffix))
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(staging.joinpath(*rel.parts), target)
    return aside if moved_aside else None


def _import(args: argparse.Namespace, settings: Settings) -> int:
    try:
        count, replaced = import_profile(settings.home, Path(args.file), args.force)
    except FileNotFoundError as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    except FileExistsError as e:
        raise CommandError(str(e), EXIT_REFUSED) from None
    except UnsafeArchive as e:
        raise CommandError(f"refused: {e}", EXIT_REFUSED) from None
    print(f"imported {count} files into {settings.home}")
    if replaced is not None:
        print(f"replaced files were moved to {replaced}")
    print("secrets were not part of the export: recreate .env (and provider secrets with `mnemo providers setup`)")
    return EXIT_OK
