"""Writing an archive (``mnemo export``, every backup): the backend's snapshot as JSON
lines, the profile's files, the manifest; secrets left out (``secrets.py``).

The archive is written to a temporary file beside ``dest`` and renamed into place, so
a reader never sees half of one; nothing is written when anything is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from mnemo import __version__
from mnemo.archives.layout import (
    FORMAT,
    MANIFEST,
    MAX_MEMBER_BYTES,
    MAX_MEMBERS,
    MAX_TOTAL_BYTES,
    NEVER,
    SIDE_SUFFIXES,
    VERSION,
    check_name,
    in_layout,
    is_sqlite,
    size_text,
)
from mnemo.archives.secrets import Secrets, collect, redact_config, redact_provider_config
from mnemo.gateway.archive.folder import dump
from mnemo.gateway.archive.format import MEMORIES
from mnemo.gateway.archive.ports import ArchiveStore, Source
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import ArchiveRefused
from mnemo.memory.discovery import discover
from mnemo.memory.provider_config import CONFIG_FILE

log = structlog.get_logger(__name__)

COMPRESS_LEVEL = 6  # gzip: most of 9's size at a third of its time


@dataclass(frozen=True, slots=True)
class Exported:
    path: Path
    files: int  # members besides the manifest
    rows: dict[str, int]  # per table label
    curated: int
    source: Source
    left_out: list[str]  # what ``secrets.Secrets.lines`` said

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def check_target(dest: Path, force: bool) -> None:
    """Where the archive goes: a file name in an existing folder, not overwritten
    without ``force``. Raises ``ArchiveRefused``."""
    if dest.is_dir():
        raise ArchiveRefused(
            f"{dest} is a folder: give the archive a file name, e.g. {dest / 'mnemo-profile.tar.gz'}"
        )
    if not dest.parent.is_dir():
        raise ArchiveRefused(f"folder {dest.parent} does not exist: create it first, or choose another path")
    if (dest.exists() or dest.is_symlink()) and not force:
        raise ArchiveRefused(f"{dest} already exists: use --force to overwrite it")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- the profile's files ---------------------------------------------------------------
def _skipped(path: Path) -> bool:
    return path.name in NEVER or path.name.endswith((".lock", *SIDE_SUFFIXES)) or path.is_symlink()


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
            if not _skipped(path):
                yield path


def _provider_files(home: Path, secrets: Secrets) -> tuple[list[Path], dict[Path, set[str]]]:
    """Every file a provider lists in ``backup_paths`` plus its ``config.json``; and per
    ``config.json`` the fields its schema marks secret."""
    out: list[Path] = []
    secret_fields: dict[Path, set[str]] = {}
    root = (home / "providers").resolve()
    for info in discover(home):
        if info.factory is None:
            continue
        provider = info.factory()
        config = home / "providers" / info.name / CONFIG_FILE
        secret_fields[config] = {f.key for f in provider.get_config_schema() if f.secret}
        for path in [*provider.backup_paths(home), config]:
            path = Path(path)
            if not path.resolve().is_relative_to(root):
                log.warning(
                    "provider backup path outside providers/ ignored", provider=info.name, path=str(path)
                )
                continue
            out.extend(_walk(path))
    return out, secret_fields


def _files(
    settings: Settings, owned: tuple[Path, ...], secrets: Secrets
) -> tuple[list[Path], dict[Path, set[str]]]:
    home = settings.home
    found: list[Path] = []
    soul = settings.soul_path
    if soul.is_file() and not soul.is_symlink():
        found.append(soul)
    for folder in (settings.skills_dir, home / "media"):
        found.extend(_walk(folder))
    provider, secret_fields = _provider_files(home, secrets)
    found.extend(provider)
    owned_resolved = [p.resolve() for p in owned]
    taken: list[Path] = []
    for path in dict.fromkeys(found):
        resolved = path.resolve()
        if any(resolved == o or resolved.is_relative_to(o) for o in owned_resolved):
            continue  # the backend's own (its snapshot stands for it)
        rel = PurePosixPath(path.relative_to(home).as_posix())
        try:
            check_name(rel)
        except ArchiveRefused as e:
            log.warning("file not exported", path=str(path), reason=str(e))
            continue
        if not in_layout(rel, False, VERSION):
            log.warning("file not exported: not part of a mnemo profile", path=str(path))
            continue
        taken.append(path)
    return taken, secret_fields


def _sqlite_copy(src: Path, dst: Path) -> None:
    """A consistent copy of a provider's live SQLite file through the online backup API."""
    source = sqlite3.connect(f"{src.resolve().as_uri()}?mode=ro", uri=True)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
    finally:
        target.close()
        source.close()


# --- the archive -------------------------------------------------------------------------
class _Members:
    """The members gathered in a scratch folder or taken from the home as they are."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.items: dict[str, Path] = {}
        self.total = 0

    def add(self, name: str, path: Path) -> None:
        size = path.stat().st_size
        if size > MAX_MEMBER_BYTES:
            raise ArchiveRefused(
                f"{name} is {size_text(size)}; an archive member may be at most {size_text(MAX_MEMBER_BYTES)}"
            )
        self.total += size
        if self.total > MAX_TOTAL_BYTES:
            raise ArchiveRefused(
                f"the profile is over {size_text(MAX_TOTAL_BYTES)}, the most an archive may hold"
            )
        if len(self.items) + 2 > MAX_MEMBERS:
            raise ArchiveRefused(f"the profile has over {MAX_MEMBERS:,} files, the most an archive may hold")
        self.items[name] = path

    def staged(self, name: str, data: bytes) -> Path:
        path = self.scratch.joinpath("files", *PurePosixPath(name).parts)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(data)
        return path


def _scrub_file(members: _Members, secrets: Secrets, name: str, path: Path, *, in_place: bool) -> Path:
    """``path`` with every secret value replaced (a scratch copy, or ``path`` itself when
    it is already a scratch file)."""
    if not secrets.values:
        return path
    data = path.read_bytes()
    clean, n = secrets.scrub(data)
    if not n:
        return path
    secrets.replaced[name] = secrets.replaced.get(name, 0) + n
    if in_place:
        path.write_bytes(clean)
        return path
    return members.staged(name, clean)


def export_profile(
    settings: Settings,
    store: ArchiveStore,
    dest: Path,
    *,
    force: bool = False,
    source: Source | None = None,
    config_text: str | None = None,
    left_out: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> Exported:
    """Write the archive of the profile ``settings`` names, its data read through
    ``store`` (the configured backend's). Raises ``ArchiveRefused`` with nothing written.

    A backup rewritten by the erasure keeps what its original said: ``source`` (the
    backend it was taken from) stands in for the snapshot's, ``config_text`` for the
    profile's ``config.yaml`` (redacted again), ``left_out`` adds to what this export
    leaves out, and ``extra`` to the manifest."""
    dest = dest.absolute()
    check_target(dest, force)
    dest = dest.resolve()
    secrets = collect(settings)
    secrets.left_out.extend(x for x in left_out if x not in secrets.left_out)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".mnemo-export-") as tmp:
        scratch = Path(tmp)
        members = _Members(scratch)
        with store.snapshot() as snapshot:
            dumped = dump(snapshot, scratch / "data-root")
            origin = source or snapshot.source
        root = scratch / "data-root"
        for written in dumped.tables:
            path = root.joinpath(*PurePosixPath(written.table.member).parts)
            members.add(
                written.table.member, _scrub_file(members, secrets, written.table.member, path, in_place=True)
            )
        for rel in dumped.curated:
            name = f"{MEMORIES}/{rel.as_posix()}"
            path = root.joinpath(MEMORIES, *rel.parts)
            members.add(name, _scrub_file(members, secrets, name, path, in_place=True))
        config = settings.config_path
        if config_text is None and config.is_file() and not config.is_symlink():
            config_text = config.read_text(encoding="utf-8-sig")
        if config_text is not None:
            redacted = redact_config(config_text, secrets)
            if redacted is not None:
                members.add("config.yaml", members.staged("config.yaml", redacted.encode("utf-8")))
        files, secret_fields = _files(settings, store.owned, secrets)
        for path in files:
            name = path.relative_to(settings.home).as_posix()
            if path in secret_fields:
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    data = None
                if isinstance(data, dict):
                    clean = redact_provider_config(data, secret_fields[path], path.parent.name, secrets)
                    path = members.staged(name, json.dumps(clean, indent=2).encode("utf-8"))
            elif is_sqlite(path):
                copy = scratch / f"db-{len(members.items)}.db"
                try:
                    _sqlite_copy(path, copy)
                except sqlite3.DatabaseError as e:
                    raise ArchiveRefused(f"{name} cannot be read as a database: {e}") from None
                path = copy
            members.add(
                name, _scrub_file(members, secrets, name, path, in_place=path.is_relative_to(scratch))
            )
        rows = {w.table.label: w.rows for w in dumped.tables}
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "mnemo_version": __version__,
            "source": {"backend": origin.backend, "schema": origin.schema},
            "tables": {w.table.label: {"member": w.table.member, "rows": w.rows} for w in dumped.tables},
            "curated": [rel.as_posix() for rel in dumped.curated],
            "files": sorted(members.items),
            "sha256": {name: file_sha256(path) for name, path in sorted(members.items.items())},
            "left_out": secrets.lines(),
            **(extra or {}),
        }
        _write_tar(dest, manifest, members.items)
    return Exported(dest, len(members.items), rows, len(dumped.curated), origin, secrets.lines())


def _write_tar(dest: Path, manifest: dict[str, Any], items: dict[str, Path]) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    now = int(time.time())

    def private(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o700 if info.isdir() else 0o600
        return info

    try:
        with tarfile.open(tmp_name, "w:gz", compresslevel=COMPRESS_LEVEL) as tar:
            data = json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8")
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(data), now, 0o600
            tar.addfile(info, io.BytesIO(data))
            for name, path in sorted(items.items()):
                tar.add(path, arcname=name, recursive=False, filter=private)
        os.chmod(tmp_name, 0o600)
        os.replace(tmp_name, dest)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
