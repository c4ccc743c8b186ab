"""A skill shipped as a ``.zip`` or ``.tar.gz`` (``mnemo skills install``), unpacked
under limits that follow from what the store accepts, checked before anything is
written and again while each file streams out — a header may lie about its size, a
stream cannot:

* at most ``MAX_ENTRIES`` entries (files and folders);
* each file at most ``MAX_FILE_BYTES`` (a supporting file holds at most
  ``MAX_FILE_CHARS`` characters, 4 bytes each at most in UTF-8), ``SKILL.md`` at most
  ``MAX_SKILL_BYTES``;
* all files together at most ``MAX_TOTAL_BYTES``;
* only plain files and folders, no absolute path, no ``..``, no link.

A bomb (a few hundred kilobytes declaring or inflating to hundreds of megabytes) is
refused with one clear line at its first oversized entry; nothing is installed, and
memory stays bounded by one read buffer.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from mnemo.memory.skills.format import MAX_FILE_CHARS, MAX_SKILL_CHARS, SKILL_FILE, SkillRefused

MAX_ENTRIES = 256
MAX_FILE_BYTES = 4 * MAX_FILE_CHARS
MAX_SKILL_BYTES = 4 * MAX_SKILL_CHARS
MAX_TOTAL_BYTES = 8 * 1024**2
CHUNK = 64 * 1024
SUFFIXES = (".zip", ".tar.gz", ".tgz")


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(SUFFIXES)


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    is_dir: bool
    is_file: bool  # a plain file (not a link, device or anything else)
    size: int  # as the header declares it
    open: Callable[[], IO[bytes]]


def _refuse(why: str) -> SkillRefused:
    return SkillRefused(f"unsafe_archive: {why}; nothing was installed")


def _limit(name: str) -> int:
    return MAX_SKILL_BYTES if PurePosixPath(name).name == SKILL_FILE else MAX_FILE_BYTES


def _size(n: int) -> str:
    return f"{n / 1024**2:,.1f} MB" if n >= 1024**2 else f"{n:,} bytes"


@contextmanager
def _entries(path: Path) -> Iterator[Iterator[_Entry]]:
    """The archive's entries one by one, in archive order (a tar is read as a stream:
    nothing past the entry being checked is ever decompressed)."""
    if path.name.lower().endswith(".zip"):
        with zipfile.ZipFile(path) as zf:

            def zipped() -> Iterator[_Entry]:
                for info in zf.infolist():
                    mode = info.external_attr >> 16
                    kind = mode & 0o170000
                    plain = not info.is_dir() and kind in (0, 0o100000)

                    def opener(info: zipfile.ZipInfo = info) -> IO[bytes]:
                        return zf.open(info)

                    yield _Entry(info.filename, info.is_dir(), plain, info.file_size, opener)

            yield zipped()
        return
    # gzip's own reader decompresses at most what is asked for; tarfile's "r|gz" would
    # inflate each compressed block whole (up to ~10 MB from 10 kB of a bomb).
    with gzip.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tf:

        def tarred() -> Iterator[_Entry]:
            for info in tf:

                def opener(info: tarfile.TarInfo = info) -> IO[bytes]:
                    f = tf.extractfile(info)
                    if f is None:
                        raise _refuse(f"{info.name!r} cannot be read")
                    return f

                yield _Entry(
                    info.name, info.isdir(), info.isfile() and not info.issparse(), info.size, opener
                )

        yield tarred()


def _check_name(name: str) -> PurePosixPath:
    if name.startswith(("/", "\\")) or "\\" in name or "\x00" in name or (len(name) > 1 and name[1] == ":"):
        raise _refuse(f"member {name!r} has an absolute or non-POSIX path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise _refuse(f"member {name!r} climbs out of the archive")
    return PurePosixPath(*parts)


def unpack(path: Path, into: Path) -> Path:
    """Unpack the skill archive ``path`` under ``into`` within the limits above; return
    the folder holding ``SKILL.md`` (the shallowest). Raises ``SkillRefused``."""
    if not is_archive(path):
        raise SkillRefused(f"invalid_archive: {path.name}: expected a folder, a .zip or a .tar.gz")
    entries = total = 0
    try:
        with _entries(path) as members:
            for entry in members:
                entries += 1
                if entries > MAX_ENTRIES:
                    raise _refuse(f"more than {MAX_ENTRIES} entries")
                rel = _check_name(entry.name)
                target = into.joinpath(*rel.parts)
                if entry.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if not entry.is_file:
                    raise _refuse(f"member {entry.name!r} is a link or special file")
                limit = _limit(entry.name)
                if entry.size > limit:
                    raise _refuse(
                        f"{rel} unpacks to {_size(entry.size)}, more than a skill file may hold ({_size(limit)})"
                    )
                if total + entry.size > MAX_TOTAL_BYTES:
                    raise _refuse(f"the archive unpacks to more than {_size(MAX_TOTAL_BYTES)}")
                total += _copy(entry, target, rel, limit, MAX_TOTAL_BYTES - total)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError) as e:
        if isinstance(e, FileExistsError):
            raise _refuse(f"a member appears twice ({Path(e.filename or '').name})") from None
        raise SkillRefused(
            f"invalid_archive: {path.name} is damaged or not a {path.suffix} archive ({e})"
        ) from None
    found = sorted(into.rglob(SKILL_FILE), key=lambda p: len(p.parts))
    if not found:
        raise SkillRefused(f"invalid_archive: {path.name}: no {SKILL_FILE} inside")
    return found[0].parent


def _copy(entry: _Entry, target: Path, rel: PurePosixPath, limit: int, room: int) -> int:
    """Stream one file out, counting what actually comes out of the decompressor."""
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with entry.open() as source, open(target, "xb") as out:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > limit:
                out.close()
                os.unlink(target)
                raise _refuse(f"{rel} unpacks to more than {_size(limit)}, the most a skill file may hold")
            if written > room:
                out.close()
                os.unlink(target)
                raise _refuse(f"the archive unpacks to more than {_size(MAX_TOTAL_BYTES)}")
            out.write(chunk)
    return written
