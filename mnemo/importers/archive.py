"""Reading a source out of its backup archive (``.zip``, ``.tar.gz``/``.tgz``).

Only the files an importer asks for are written, into a scratch folder: regular files,
below the archive's profile root, under size caps. A member with an absolute path or
``..`` refuses the whole archive (it was made to escape); links and devices are never
extracted. Secrets an archive may hold (``.env``, ``auth.json``) are never asked for,
so they never leave it.
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from mnemo.importers.common import SourceProblem

MAX_MEMBER_BYTES = 2 * 1024**3
MAX_TOTAL_BYTES = 4 * 1024**3
MAX_MEMBERS = 200_000
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(ARCHIVE_SUFFIXES)


@dataclass(frozen=True, slots=True)
class _Member:
    parts: tuple[str, ...]
    size: int
    regular: bool
    open: Callable[[], IO[bytes]]


def _parts(raw: str, archive: Path) -> tuple[str, ...]:
    if raw.startswith(("/", "\\")) or "\\" in raw or (len(raw) > 1 and raw[1] == ":"):
        raise SourceProblem(f"{archive}: refused, member {raw!r} has an absolute path", usage=False)
    parts = tuple(p for p in PurePosixPath(raw).parts if p not in ("", "."))
    if ".." in parts:
        raise SourceProblem(f"{archive}: refused, member {raw!r} climbs out of the archive", usage=False)
    return parts


@contextmanager
def _members(archive: Path) -> Iterator[list[_Member]]:
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                out = []
                for entry in zf.infolist():
                    mode = entry.external_attr >> 16
                    regular = not entry.is_dir() and (mode == 0 or (mode & 0o170000) == 0o100000)

                    def open_entry(entry: zipfile.ZipInfo = entry) -> IO[bytes]:
                        return zf.open(entry)

                    out.append(_Member(_parts(entry.filename, archive), entry.file_size, regular, open_entry))
                    if len(out) > MAX_MEMBERS:
                        raise SourceProblem(f"{archive}: more than {MAX_MEMBERS:,} entries", usage=False)
                yield out
        else:
            with tarfile.open(archive, "r:gz") as tf:
                out = []
                while (info := tf.next()) is not None:

                    def opener(info: tarfile.TarInfo = info) -> IO[bytes]:
                        f = tf.extractfile(info)
                        if f is None:
                            raise SourceProblem(f"{archive}: {info.name} cannot be read", usage=False)
                        return f

                    out.append(_Member(_parts(info.name, archive), info.size, info.isfile(), opener))
                    if len(out) > MAX_MEMBERS:
                        raise SourceProblem(f"{archive}: more than {MAX_MEMBERS:,} entries", usage=False)
                yield out
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as e:
        raise SourceProblem(
            f"{archive}: the archive is damaged or not a {_kind(archive)} ({e})", usage=False
        ) from None


def _kind(archive: Path) -> str:
    return ".zip" if archive.name.lower().endswith(".zip") else ".tar.gz"


def unpack(
    archive: Path,
    into: Path,
    root_of: Callable[[tuple[str, ...]], tuple[str, ...] | None],
    wanted: Callable[[tuple[str, ...]], bool],
) -> Path:
    """Extract what ``wanted`` accepts (paths relative to the profile root) into
    ``into``; return the folder that stands for the source's root.

    ``root_of(parts)`` names the profile root a member reveals (``("backup",)`` for
    ``backup/state.db``), or None; the shortest root found wins (a backup of a home with
    named profiles holds theirs deeper down). No root at all: not that kind of archive.
    """
    with _members(archive) as members:
        roots = {r for m in members if m.regular and (r := root_of(m.parts)) is not None}
        if not roots:
            raise SourceProblem(
                f"{archive}: nothing in this archive looks like the profile folder expected", usage=True
            )
        root = min(roots, key=lambda r: (len(r), r))
        total = 0
        for m in members:
            if not m.regular or m.parts[: len(root)] != root:
                continue
            rel = m.parts[len(root) :]
            if not rel or not wanted(rel):
                continue
            if m.size > MAX_MEMBER_BYTES:
                raise SourceProblem(
                    f"{archive}: {'/'.join(m.parts)} is larger than {MAX_MEMBER_BYTES:,} bytes", usage=False
                )
            total += m.size
            if total > MAX_TOTAL_BYTES:
                raise SourceProblem(f"{archive}: unpacks to more than {MAX_TOTAL_BYTES:,} bytes", usage=False)
            target = into.joinpath(*rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with m.open() as src, open(target, "xb") as out:
                    shutil.copyfileobj(src, out)
            except FileExistsError:
                raise SourceProblem(f"{archive}: {'/'.join(m.parts)} appears twice", usage=False) from None
            except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as e:
                raise SourceProblem(f"{archive}: {'/'.join(m.parts)} is damaged ({e})", usage=False) from None
    return into
