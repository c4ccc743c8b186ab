"""What people send besides text: images and documents, made ready for the model.

An adapter downloads an attachment through its platform's API (``ports.FetchesMedia``);
``MediaStore.take`` decides what the model can take of it:

* **images** (JPEG, PNG, GIF, WebP) are checked (``gateway.images``: what a decode would
  cost is read from the header before anything is decoded, so no image can take more
  than ``images.MAX_DECODE_BYTES``), scaled so the long side is at most
  ``MAX_IMAGE_SIDE`` px (Claude scales larger images down anyway; sending them costs
  upload time and tokens for nothing), and stored;
* **PDFs** up to ``MAX_PDF_BYTES`` and ``pdfs.MAX_PDF_PAGES`` pages (counted from the
  bytes within a memory bound, ``gateway.pdfs``) are stored and sent as document blocks;
* what is stored is first admitted by ``media.quota`` (``gateway.media_quota``: bytes per
  person and for the bot, per day and in total); over a limit the file is a note;
* **text-like files** (txt, md, csv, json, source code) are inlined into the turn's text
  up to ``MAX_INLINE_CHARS``, with a note when cut;
* anything else, or anything broken, becomes a short note in the turn's text: no file
  can fail the turn, its caption is always answered.

Every platform's file name goes through ``clean_file_name`` before it is stored or
shown (the adapters call it when they build an ``Attachment``; ``take`` again).

Files live under ``$MNEMO_HOME/media/`` (directory 0700, files 0600), named by the
content's hash, and are referenced from the user message's ``meta["media"]`` — written
whole (a temporary file renamed into place), so nothing is stored half. ``blocks`` turns
a stored reference back into content blocks; ``model_input`` decides which turns still
get them (the last ``media.history_images``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemo.gateway.images import MAX_IMAGE_SIDE, ImageRefused, read_image
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media_quota import MediaKind, MediaQuota
from mnemo.gateway.pdfs import MAX_PDF_PAGES, PdfUnreadable, count_pages

log = get_logger(__name__)

MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # the Bot API's getFile limit
MAX_PDF_BYTES = 32 * 1024 * 1024  # the Messages API's request size limit for a PDF
MAX_INLINE_CHARS = 50_000
MAX_ATTACHMENTS_PER_TURN = 10
IMAGE_TOKENS_UNKNOWN = 1600  # an image of about 1.2 megapixels, the API's usual ceiling
PDF_PAGE_TOKENS = 1500  # text and page image of one PDF page

IMAGE_TYPES = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp"}
MAX_NAME_CHARS = 200
# Not shown, never stored: control and format characters (NUL, escapes, bidi overrides
# that make "evil\u202etxt.exe" read as "evilexe.txt"), line and paragraph separators,
# surrogates, private-use and unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
TEXT_SUFFIXES = frozenset(
    [
        ".txt",
        ".md",
        ".markdown",
        ".csv",
        ".tsv",
        ".json",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".log",
        ".xml",
        ".html",
        ".css",
        ".py",
        ".js",
        ".ts",
        ".tsx",
        ".jsx",
        ".java",
        ".c",
        ".h",
        ".cpp",
        ".hpp",
        ".cs",
        ".go",
        ".rs",
        ".rb",
        ".php",
        ".sh",
        ".sql",
        ".kt",
        ".swift",
        ".lua",
        ".r",
        ".tex",
    ]
)
OLD_IMAGE = "[an image was shared here earlier; it is no longer shown]"
OLD_DOCUMENT = "[a PDF was shared here earlier; it is no longer shown]"
CANNOT_READ = "I can't read this kind of file"


def ref_tokens(ref: Mapping[str, Any]) -> int:
    """Roughly what the API counts for a stored attachment: an image width × height / 750
    after scaling its long side to ``MAX_IMAGE_SIDE`` (``IMAGE_TOKENS_UNKNOWN`` for a
    reference stored without its size), a PDF ``PDF_PAGE_TOKENS`` per page."""
    if ref.get("kind") != "image":
        return PDF_PAGE_TOKENS * max(1, int(ref.get("pages") or 1))
    width, height = int(ref.get("width") or 0), int(ref.get("height") or 0)
    if width <= 0 or height <= 0:
        return IMAGE_TOKENS_UNKNOWN
    scale = min(1.0, MAX_IMAGE_SIDE / max(width, height))
    return max(1, int(width * scale * height * scale / 750))


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one attachment became: stored references for ``meta["media"]`` and text for
    the turn (inlined file contents or a note)."""

    refs: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""


def clean_file_name(raw: str) -> str:
    """A platform's file name as mnemo stores and shows it: the last path component
    only (no ``/`` or ``\\``), without control, format or separator characters, other
    spaces as plain spaces, at most ``MAX_NAME_CHARS`` characters with the extension
    kept; never ``.`` or ``..``. ``""`` when nothing is left (callers have a default)."""
    kept = "".join(
        " " if ch.isspace() else ch
        for ch in raw
        if ch.isspace() or unicodedata.category(ch) not in _HIDDEN_CATEGORIES
    )
    name = kept.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if name in (".", ".."):
        return ""
    if len(name) > MAX_NAME_CHARS:
        suffix = Path(name).suffix
        suffix = suffix if len(suffix) <= 16 else ""
        name = name[: MAX_NAME_CHARS - len(suffix)].rstrip() + suffix
    return name


def note(name: str, what: str) -> Prepared:
    label = f" ({name})" if name else ""
    return Prepared(text=f"[attachment{label}: {what}]")


def _keep(data: bytes, ext: str, kind: str, media_type: str, name: str) -> _ToKeep:
    file = f"{hashlib.sha256(data).hexdigest()[:32]}.{ext}"
    ref = {"kind": kind, "file": file, "media_type": media_type, "name": name, "bytes": len(data)}
    return _ToKeep(data, file, ref)


@dataclass(frozen=True, slots=True)
class _ToKeep:
    """A file ``prepare`` decided to store, before it is written: ``file`` is its name
    under ``media/`` (the content's hash), ``ref`` what the message will carry."""

    data: bytes
    file: str
    ref: dict[str, Any]


class MediaStore:
    """Collaborators: ``home`` (files under ``$MNEMO_HOME/media``) and, when set, the
    ``quota`` every stored file is admitted by first (``gateway/media_quota.py``)."""

    def __init__(self, home: Path, *, history_images: int = 3, quota: MediaQuota | None = None) -> None:
        self.root = Path(home) / "media"
        self.history_images = history_images
        self.quota = quota

    # --- preparing a new attachment -----------------------------------------------------
    async def take(self, owner: str, kind: str, name: str, media_type: str, data: bytes) -> Prepared:
        """What one attachment ``owner`` (``PLATFORM:ID``) sent becomes, stored within
        their quota. Never raises: a file that cannot be read, is over a quota, or cannot
        be written is a note, and the rest of the message is answered."""
        name = clean_file_name(name)
        try:
            read = await asyncio.to_thread(self._read, kind, name, media_type, data)
        except Exception as e:  # the file boundary: a reader's bug must not fail the turn
            log.error("media_read_failed", kind=kind, error=f"{type(e).__name__}: {e}")
            return note(name, "could not be read")
        if isinstance(read, Prepared):
            return read
        if self.quota is not None:
            try:
                exceeded = await self.quota.admit(owner, MediaKind.STORED, read.file, len(read.data))
            except Exception as e:  # the database is down: not kept, and said so
                log.error("media_quota_check_failed", error=f"{type(e).__name__}: {e}")
                return note(name, "could not be kept just now; send it again later")
            if exceeded is not None:
                return note(name, f"not kept: {exceeded.text}")
        try:
            await asyncio.to_thread(self._write, read)
        except OSError as e:  # a full or read-only disk: reported, and the count given back
            log.error("media_store_failed", error=f"{type(e).__name__}: {e}")
            if self.quota is not None:
                await self.quota.release(MediaKind.STORED, [read.file])
            return note(name, "could not be stored")
        return Prepared(refs=[read.ref])

    def prepare(self, kind: str, name: str, media_type: str, data: bytes) -> Prepared:
        """``take`` without a quota, blocking (run it in a thread)."""
        read = self._read(kind, clean_file_name(name), media_type, data)
        if isinstance(read, Prepared):
            return read
        self._write(read)
        return Prepared(refs=[read.ref])

    def _read(self, kind: str, name: str, media_type: str, data: bytes) -> Prepared | _ToKeep:
        """A note or inlined text, or the file to store (blocking). Never raises for
        what is in the file."""
        if len(data) > MAX_DOWNLOAD_BYTES:
            return note(name, "too large (over 20 MB), not read")
        suffix = Path(name).suffix.lower()
        if kind == "photo" or media_type.startswith("image/"):
            return self._image(name, data)
        if media_type == "application/pdf" or suffix == ".pdf":
            return self._pdf(name, data)
        if media_type.startswith("text/") or suffix in TEXT_SUFFIXES or media_type == "application/json":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return note(name, "not valid UTF-8 text, not read")
            cut = ""
            if len(text) > MAX_INLINE_CHARS:
                text, cut = (
                    text[:MAX_INLINE_CHARS],
                    f"\n[cut: only the first {MAX_INLINE_CHARS:,} characters of {len(data):,} bytes are shown]",
                )
            return Prepared(text=f"[file {name or 'attachment'}]\n```\n{text}\n```{cut}")
        return note(name, CANNOT_READ)

    def _image(self, name: str, data: bytes) -> Prepared | _ToKeep:
        try:
            picture = read_image(data)
        except ImageRefused as e:
            return note(name, str(e))
        keep = _keep(picture.data, IMAGE_TYPES[picture.media_type], "image", picture.media_type, name)
        keep.ref["width"], keep.ref["height"] = picture.width, picture.height  # for the preflight
        return keep

    def _pdf(self, name: str, data: bytes) -> Prepared | _ToKeep:
        if not data.startswith(b"%PDF-"):
            return note(name, "not a readable PDF")
        if b"/Encrypt" in data[-4096:] or b"/Encrypt" in data[:4096]:
            return note(name, "the PDF is encrypted; I can't read it")
        if len(data) > MAX_PDF_BYTES:
            return note(name, "the PDF is too large for me to read")
        try:
            pages = count_pages(data)
        except PdfUnreadable as e:
            return note(name, str(e))
        if pages > MAX_PDF_PAGES:
            return note(name, f"the PDF has {pages:,} pages; I can read at most {MAX_PDF_PAGES}")
        keep = _keep(data, "pdf", "document", "application/pdf", name)
        keep.ref["pages"] = pages
        return keep

    def _write(self, keep: _ToKeep) -> None:
        """The file, whole (a temporary file renamed into place), once per content."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        path = self.root / keep.file
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(keep.data)
            os.replace(tmp, path)

    # --- what they cost -----------------------------------------------------------------
    def shown_tokens(self, rows: Sequence[Any]) -> int:
        """The estimated tokens of the images and PDFs a request built from ``rows`` sends
        (the last ``history_images`` user turns with media, as ``model_input`` picks
        them): text estimates do not see them, and one image costs as much as pages of text."""
        with_media = [r for r in rows if r.role == "user" and r.meta.get("media")]
        return sum(
            ref_tokens(ref) for r in with_media[-max(1, self.history_images) :] for ref in r.meta["media"]
        )

    # --- back to content blocks ---------------------------------------------------------
    def blocks(self, refs: list[Mapping[str, Any]], *, show: bool) -> list[dict[str, Any]]:
        """Content blocks for a stored message's media: the files themselves, or when
        ``show`` is false (an older turn) or a file is gone, a short placeholder."""
        out: list[dict[str, Any]] = []
        for ref in refs:
            placeholder = OLD_IMAGE if ref.get("kind") == "image" else OLD_DOCUMENT
            path = self.root / str(ref.get("file", ""))
            if not show or not path.is_file() or "/" in str(ref.get("file", "")):
                out.append({"type": "text", "text": placeholder})
                continue
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            block_type = "image" if ref.get("kind") == "image" else "document"
            out.append(
                {
                    "type": block_type,
                    "source": {"type": "base64", "media_type": ref["media_type"], "data": data},
                }
            )
        return out
