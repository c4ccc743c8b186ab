"""``mnemo export FILE`` / ``mnemo import FILE``: move a whole profile between machines.
(``mnemo import --from hermes|openclaw PATH`` moves in from another agent instead: it
adds to this profile, see ``mnemo/importers/``.)

The archive is a ``.tar.gz`` holding, relative to ``$MNEMO_HOME``:

* ``mnemo-export.json`` — manifest (format, version, creation time, file list, sha256 per file);
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
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.discovery import discover
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.provider_config import CONFIG_FILE, SECRETS_FILE
from mnemo.memory.scope import validate_id

log = structlog.get_logger(__name__)

MANIFEST = "mnemo-export.json"
FORMAT = "mnemo-profile"
VERSION = 1
TOP_FILES = ("config.yaml", "SOUL.md", "state.db")
TOP_DIRS = ("memories", "skills", "providers")
NEVER = {".env", SECRETS_FILE}
_SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
# Caps on what an archive may hold (export refuses to write what import would refuse).
MAX_MEMBER_BYTES = 2 * 1024**3
MAX_TOTAL_BYTES = 4 * 1024**3
MAX_MEMBERS = 100_000
MAX_DEPTH = 8
# The tables every mnemo state.db has (memory/migrations.py 0001).
_STATE_TABLES = {"sessions", "messages"}


class BackupRefused(Exception):
    """An export or import that would write a bad backup or a broken profile."""


def _size(n: int) -> str:
    return f"{n / 1024**2:,.0f} MB" if n >= 1024**2 else f"{n:,} bytes"


def check_name(path: PurePosixPath) -> None:
    """Each part a safe folder or file name (no control characters, ``..``, separators);
    the path within the known layout: ``memories/MEMORY.md``,
    ``memories/users/PLATFORM/USER/USER.md``, ``skills/…``, ``providers/NAME/…``."""
    parts = path.parts
    if len(parts) > MAX_DEPTH:
        raise BackupRefused(f"{str(path)!r} is nested deeper than {MAX_DEPTH} folders")
    for part in parts:
        try:
            validate_id("file name", part)
        except InvalidIdentifier as e:
            raise BackupRefused(f"{str(path)!r}: {e}") from None


def in_layout(path: PurePosixPath, is_dir: bool) -> bool:
    parts = path.parts
    top = parts[0]
    if len(parts) == 1:
        return (top in TOP_FILES and not is_dir) or (top in TOP_DIRS and is_dir)
    if top == "memories":
        if parts[1] == "users":
            return len(parts) <= 4 if is_dir else (len(parts) == 5 and parts[4] == "USER.md")
        return not is_dir and parts[1:] == ("MEMORY.md",)
    return top in ("skills", "providers")


def _is_database(rel: PurePosixPath, path: Path) -> bool:
    if rel.as_posix() == "state.db" or rel.name.endswith(_DB_SUFFIXES):
        return True
    return rel.parts[0] == "providers" and _is_sqlite(path)


def verify_database(rel: PurePosixPath, path: Path) -> None:
    """Refuse a database that is not SQLite, fails ``quick_check``, or (``state.db``)
    is not a mnemo state database."""
    from mnemo.gateway.storage_sqlite import quick_check

    if not _is_sqlite(path):
        raise BackupRefused(
            f"{rel} is not a SQLite database ({_size(path.stat().st_size)} of something else)"
        )
    try:
        problems = quick_check(path, limit=3)
        if not problems and rel.as_posix() == "state.db":
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                version = conn.execute("PRAGMA user_version").fetchone()[0]
            finally:
                conn.close()
            if not _STATE_TABLES <= tables or version < 1:
                raise BackupRefused(
                    f"{rel} is a SQLite database, but not a mnemo state.db (no sessions/messages tables)"
                )
    except sqlite3.DatabaseError as e:
        raise BackupRefused(f"{rel} is not a usable database: {e}") from None
    if problems:
        raise BackupRefused(f"{rel} is damaged (quick_check: {'; '.join(problems)})")


def register(subparsers: Any) -> None:
    exp = subparsers.add_parser("export", help="write the whole profile to a .tar.gz (no secrets)")
    exp.add_argument("file", metavar="FILE")
    exp.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    exp.set_defaults(handler=_export)
    imp = subparsers.add_parser(
        "import",
        help="restore a profile exported with `mnemo export`, or move in from Hermes Agent or OpenClaw",
        description="Without --from: restore FILE, an archive written by `mnemo export`. With --from: read a Hermes "
        "Agent profile (~/.hermes, or its backup .zip/.tar.gz) or an OpenClaw folder (~/.openclaw, or a workspace) "
        "and add its memory, persona, skills and conversations to this profile (see the README).",
    )
    imp.add_argument("file", metavar="FILE")
    imp.add_argument(
        "--force", action="store_true", help="import into a non-empty home (replaced files are kept aside)"
    )
    imp.add_argument(
        "--from",
        dest="source_kind",
        choices=("hermes", "openclaw"),
        help="FILE is a Hermes Agent profile or an OpenClaw folder, not a mnemo export",
    )
    imp.add_argument(
        "--user",
        metavar="PLATFORM:ID",
        help="with --from: whose USER.md the source's profile becomes (required for hermes)",
    )
    imp.add_argument(
        "--chat-map",
        metavar="SOURCE=TARGET",
        action="append",
        help="with --from: put the conversations of SOURCE (as the dry run lists it) in mnemo chat TARGET "
        "(PLATFORM:CHAT_ID or a session key); repeatable",
    )
    imp.add_argument(
        "--chat-map-file",
        metavar="FILE",
        action="append",
        help="with --from: SOURCE=TARGET lines (# comments) read from FILE",
    )
    imp.add_argument(
        "--dry-run", action="store_true", help="with --from: print what would be imported, write nothing"
    )
    imp.add_argument("--json", action="store_true", help="with --from: print the receipt as JSON")
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
                log.warning(
                    "provider backup path outside providers/ ignored", provider=info.name, path=str(path)
                )
                continue
            out.extend(_walk(path))
    return out


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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
    taken: list[Path] = []
    for path in dict.fromkeys(files):
        rel = PurePosixPath(path.relative_to(home).as_posix())
        try:
            check_name(rel)
        except BackupRefused as e:
            log.warning("file not exported", path=str(path), reason=str(e))
            continue
        if not in_layout(rel, is_dir=False):
            log.warning("file not exported: not part of a mnemo profile", path=str(path))
            continue
        taken.append(path)
    return taken


def check_target(dest: Path, force: bool) -> None:
    """Where the archive goes: a file name in an existing folder, not overwritten
    without ``force``. Raises ``BackupRefused``."""
    if dest.is_dir():
        raise BackupRefused(
            f"{dest} is a folder: give the archive a file name, e.g. {dest / 'mnemo-profile.tar.gz'}"
        )
    if not dest.parent.is_dir():
        raise BackupRefused(f"folder {dest.parent} does not exist: create it first, or choose another path")
    if (dest.exists() or dest.is_symlink()) and not force:
        raise BackupRefused(f"{dest} already exists: use --force to overwrite it")


def export_profile(home: Path, dest: Path, force: bool = False) -> list[str]:
    """Write the archive atomically; returns the member names (manifest excluded).

    Every database is copied (online backup API) and verified first; sizes are capped
    like import caps them. Raises ``BackupRefused`` with nothing written."""
    home = home.resolve()
    dest = dest.absolute()
    check_target(dest, force)
    dest = dest.resolve()
    files = [f for f in collect(home) if f.resolve() != dest]
    names = [f.relative_to(home).as_posix() for f in files]
    if len(files) + 1 > MAX_MEMBERS:
        raise BackupRefused(f"the profile has {len(files):,} files; an export holds at most {MAX_MEMBERS:,}")
    with tempfile.TemporaryDirectory() as scratch:
        sources: list[Path] = []
        checksums: dict[str, str] = {}
        total = 0
        for path, name in zip(files, names, strict=True):
            rel = PurePosixPath(name)
            source = path
            if _is_sqlite(path):
                source = Path(scratch) / f"{len(sources)}.db"
                try:
                    _sqlite_copy(path, source)
                except sqlite3.DatabaseError as e:
                    raise BackupRefused(f"{rel} cannot be read as a database: {e}") from None
            if _is_database(rel, source):
                verify_database(rel, source)
            size = source.stat().st_size
            if size > MAX_MEMBER_BYTES:
                raise BackupRefused(
                    f"{rel} is {_size(size)}; an export member may be at most {_size(MAX_MEMBER_BYTES)}"
                )
            total += size
            if total > MAX_TOTAL_BYTES:
                raise BackupRefused(
                    f"the profile is over {_size(MAX_TOTAL_BYTES)}, the most an export may hold"
                )
            sources.append(source)
            checksums[name] = file_sha256(source)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
        try:
            with tarfile.open(tmp_name, "w:gz") as tar:
                manifest = {
                    "format": FORMAT,
                    "version": VERSION,
                    "created_at": time.time(),
                    "files": names,
                    "sha256": checksums,
                }
                data = json.dumps(manifest, indent=2).encode()
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(data))
                for source, name in zip(sources, names, strict=True):
                    tar.add(source, arcname=name, recursive=False)
            os.replace(tmp_name, dest)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return names


def _export(args: argparse.Namespace, settings: Settings) -> int:
    try:
        names = export_profile(settings.home, Path(args.file).expanduser(), args.force)
    except BackupRefused as e:
        raise CommandError(f"export refused: {e}", EXIT_REFUSED) from None
    print(f"exported {len(names)} files from {settings.home} to {args.file} (no .env or provider secrets)")
    return EXIT_OK


# --- import ------------------------------------------------------------------------
class UnsafeArchive(BackupRefused):
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
                f"{info.name!r} is {_size(info.size)}; a member may be at most {_size(MAX_MEMBER_BYTES)}"
            )
        total += info.size
        if total > MAX_TOTAL_BYTES:
            raise UnsafeArchive(
                f"the archive unpacks to over {_size(MAX_TOTAL_BYTES)}, the most an import takes"
            )
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
        try:
            check_name(path)
        except BackupRefused as e:
            raise UnsafeArchive(str(e)) from None
        if path in names:
            raise UnsafeArchive(f"{raw!r} appears twice in the archive")
        names.add(path)
        if path.name in NEVER:
            raise UnsafeArchive(f"{raw!r} must never be imported (secrets stay on their machine)")
        if str(path) == MANIFEST:
            seen_manifest = True
            continue
        if not in_layout(path, is_dir=info.isdir()):
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
        raise UnsafeArchive(
            f"export format version {manifest.get('version')!r} is not supported (expected {VERSION})"
        )
    return members


def _next(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    try:
        return tar.next()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise UnsafeArchive(f"the archive is damaged: {e}") from None


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
        raise FileExistsError(
            f"{home} is not empty; use --force to import anyway (replaced files are kept aside)"
        )
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as e:
        raise UnsafeArchive(f"{archive}: not a readable .tar.gz: {e}") from e
    with tar:
        members = check_members(tar)
        _check_room(home, sum(m.info.size for m in members))
        created = not home.exists()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = Path(tempfile.mkdtemp(dir=home, prefix=".import-"))
        try:
            try:
                written = _extract(tar, members, staging)
            except (tarfile.TarError, EOFError, zlib.error) as e:
                raise UnsafeArchive(f"the archive is damaged: {e}") from None
            for rel in written:  # before anything of the home is touched
                if _is_database(rel, staging.joinpath(*rel.parts)):
                    try:
                        verify_database(rel, staging.joinpath(*rel.parts))
                    except BackupRefused as e:
                        raise UnsafeArchive(str(e)) from None
            replaced = _install(staging, home, written)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if created:
                shutil.rmtree(home, ignore_errors=True)  # refused: leave no empty home behind
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return len(written), replaced


def _check_room(home: Path, needed: int) -> None:
    where = next(p for p in (home, *home.parents) if p.exists())
    free = shutil.disk_usage(where).free
    if needed > free:
        raise UnsafeArchive(
            f"the archive unpacks to {_size(needed)}, but {where} has only {_size(free)} free"
        )


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
        ensure_folder(dest.parent)
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
        ensure_folder(target.parent)  # every missing level 0700 (mkdir's parents=True gives 0755)
        os.replace(staging.joinpath(*rel.parts), target)
    return aside if moved_aside else None


def _import(args: argparse.Namespace, settings: Settings) -> int:
    if args.source_kind is not None:
        from mnemo.importers.command import import_foreign

        return import_foreign(args, settings)
    extra = [
        flag
        for flag, on in (
            ("--user", args.user),
            ("--chat-map", args.chat_map),
            ("--chat-map-file", args.chat_map_file),
            ("--dry-run", args.dry_run),
            ("--json", args.json),
        )
        if on
    ]
    if extra:
        raise CommandError(f"{', '.join(extra)}: only with --from hermes|openclaw", EXIT_USAGE)
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
    print(
        "secrets were not part of the export: recreate .env (and provider secrets with `mnemo providers setup`)"
    )
    return EXIT_OK
