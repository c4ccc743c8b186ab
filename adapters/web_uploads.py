"""Files sent from the web chat: ``POST /upload?user=<id>``, then a message frame naming it.

The page posts the file's bytes as the request body (``Content-Type`` the file's type,
``X-File-Name`` its URI-encoded name) and gets ``{"id", "name", "kind", "size",
"media_type"}`` back, or ``{"error": "<one clear line>"}`` with 413 (over
``MAX_UPLOAD_BYTES``, an image too large to decode, or the person's or the bot's total
space for files used up: ``media.quota``), 429 (a daily limit of ``media.quota``, with
``Retry-After`` until local midnight), 415 (an image format other than JPEG, PNG, GIF,
WebP) or 400 (a damaged image, an empty file). It then sends ``{"type": "message", "id": …, "text":
<caption, may be empty>, "attachments": [<upload id>, …]}`` on the websocket; the
gateway downloads each through ``WebAdapter.fetch_media`` and ``gateway.media``
prepares it like a Telegram or Discord attachment (images as image blocks, PDFs as
document blocks, text files inlined, anything else a note).

Uploads are kept on disk (``<dir>/<user>/<sha256>.bin`` and a ``.json`` sidecar, 0600 in
0700 folders), so a message still in the inbox after a restart can be read, and count
against ``media.quota`` as ``web:<user>``'s while they are kept. An upload is removed a
day after it was made, whoever made it, by the upload sweep
(``gateway.jobs.housekeeping.UploadSweep``, through ``prune``). An upload id is only
valid for the user who made it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mnemo.gateway.events import Attachment
from mnemo.gateway.images import ImageRefused, Refusal, media_type_of
from mnemo.gateway.media import clean_file_name

MAX_UPLOAD_BYTES = 10 * 1024 * 1024
UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
_CHUNK = 64 * 1024


class UploadRefused(Exception):
    """A file the web chat does not take; ``status`` is the HTTP answer, the message is
    shown to the user as is."""

    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


def too_large(size: int) -> UploadRefused:
    return UploadRefused(
        413, f"the file is too large ({_mb(size)}; at most {MAX_UPLOAD_BYTES // (1024 * 1024)} MB)"
    )


def file_name(raw: str) -> str:
    """The uploaded file's name as shown to the model (``gateway.media.clean_file_name``
    of the URI-decoded header)."""
    return clean_file_name(unquote(raw or "")) or "upload"


_REFUSAL_STATUS = {Refusal.TOO_LARGE: 413, Refusal.FORMAT: 415, Refusal.DAMAGED: 400}


def check_image(data: bytes) -> str:
    """The image's media type, from its header (nothing is decoded); raises
    ``UploadRefused`` for a damaged file, a format the model cannot take, or an image
    too large to read (``gateway.images``)."""
    try:
        return media_type_of(data)
    except ImageRefused as e:
        raise UploadRefused(_REFUSAL_STATUS[e.refusal], str(e)) from e


@dataclass(frozen=True, slots=True)
class Upload:
    id: str
    name: str
    kind: str  # "photo" or "document"
    size: int
    media_type: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "media_type": self.media_type,
        }

    def attachment(self, user: str) -> Attachment:
        return Attachment(
            kind=self.kind,
            name=self.name,
            size=self.size,
            ref=f"{user}/{self.id}",
            media_type=self.media_type,
        )


class UploadStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _folder(self, user: str) -> Path:
        folder = self.root / user
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(folder, 0o700)
        return folder

    @staticmethod
    def check(name: str, declared_type: str, data: bytes) -> Upload:
        """What the upload will be, checked but not yet kept (blocking: run it in a
        thread); raises ``UploadRefused``."""
        if not data:
            raise UploadRefused(400, "the file is empty")
        if len(data) > MAX_UPLOAD_BYTES:
            raise too_large(len(data))
        declared = declared_type.split(";", 1)[0].strip().lower()
        if declared.startswith("image/"):
            kind, media_type = "photo", check_image(data)
        else:
            kind, media_type = "document", declared or "application/octet-stream"
        return Upload(hashlib.sha256(data).hexdigest()[:32], name, kind, len(data), media_type)

    def keep(self, user: str, upload: Upload, data: bytes) -> None:
        """Write a checked upload (blocking)."""
        folder = self._folder(user)
        self._write(folder / f"{upload.id}.bin", data)
        self._write(folder / f"{upload.id}.json", json.dumps(upload.as_dict()).encode())

    def save(self, user: str, name: str, declared_type: str, data: bytes) -> Upload:
        """``check`` and ``keep`` in one (blocking), without a quota."""
        upload = self.check(name, declared_type, data)
        self.keep(user, upload, data)
        return upload

    def get(self, user: str, upload_id: str) -> Upload | None:
        if not UPLOAD_ID.fullmatch(upload_id):
            return None
        try:
            meta = json.loads((self.root / user / f"{upload_id}.json").read_text(encoding="utf-8"))
            return Upload(
                upload_id, str(meta["name"]), str(meta["kind"]), int(meta["size"]), str(meta["media_type"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read(self, ref: str) -> bytes:
        """The bytes of ``<user>/<upload id>`` (blocking); raises ``FileNotFoundError``."""
        user, _, upload_id = ref.partition("/")
        if not UPLOAD_ID.fullmatch(upload_id) or "/" in user or not user or user.startswith("."):
            raise FileNotFoundError(f"not an upload: {ref!r}")
        return (self.root / user / f"{upload_id}.bin").read_bytes()

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def prune(self, older_than: float) -> list[str]:
        """Remove every user's uploads last written before ``older_than`` (a Unix time;
        blocking); returns them as ``<user>/<upload id>``."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for folder in self.root.iterdir():
            if not folder.is_dir() or folder.is_symlink():
                continue
            for path in folder.iterdir():
                try:
                    if path.stat().st_mtime >= older_than:
                        continue
                    path.unlink()
                except FileNotFoundError:
                    continue
                if path.suffix == ".bin" and UPLOAD_ID.fullmatch(path.stem):
                    removed.append(f"{folder.name}/{path.stem}")
        return removed


async def read_body(content: Any, declared_length: int | None) -> bytes:
    """The request body, refused as soon as it passes ``MAX_UPLOAD_BYTES``."""
    if declared_length is not None and declared_length > MAX_UPLOAD_BYTES:
        raise too_large(declared_length)
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(_CHUNK):
        size += len(chunk)
        if size > MAX_UPLOAD_BYTES:
            raise too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)
