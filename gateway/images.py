"""Reading an image someone sent without letting it take the process's memory.

``Image.open`` reads only the header; decoding allocates for the size the header
*declares*, whatever the file's length: a 420 KB PNG declaring 12000×12000 decodes to
576 MB, a few hundred bytes can declare 50000×50000. So what a decode will cost is
worked out from the header first, and an image that would cost more is refused before
a byte of it is decoded ("this image is too large to read"):

* PNG, GIF and WebP decode whole, 4 bytes per pixel (Pillow keeps RGB in 4): at most
  ``MAX_DECODE_PIXELS`` (12.6 megapixels, ``MAX_DECODE_BYTES``);
* a JPEG decodes at 1/2, 1/4 or 1/8 scale when it only has to be shrunk (``draft``:
  libjpeg scales while it decodes), so a large baseline photo costs its reduced size,
  held to the same bound; but a progressive or multi-scan JPEG also keeps the DCT
  coefficients of the whole declared image (2 bytes per coefficient, per component and
  its sampling) — the classic "JPEG bomb" — at most ``MAX_COEFFICIENT_BYTES`` of them.

With scaling's copies that keeps one image under about 80 MB (``bench/media_memory.py``).

Pillow's own guard, ``Image.MAX_IMAGE_PIXELS``, is set to ``MAX_DECLARED_PIXELS``, the
largest declared size any image could pass with (a baseline JPEG at 1/8 scale); ``open``
itself raises ``DecompressionBombError`` above twice that, which is caught like every
other decoding error. Every failure is an ``ImageRefused`` with one
short reason; nothing else escapes ``read_image``.
"""

from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from mnemo.gateway.logs import get_logger

if TYPE_CHECKING:
    from PIL.Image import Image as PilImage

log = get_logger(__name__)

MAX_IMAGE_SIDE = 1568  # Claude scales larger images down anyway
MAX_DECODE_BYTES = 48 * 1024 * 1024  # the decoded pixels of one image
MAX_DECODE_PIXELS = MAX_DECODE_BYTES // 4  # 12.6 megapixels (4096×3072) at 4 bytes each
MAX_COEFFICIENT_BYTES = 48 * 1024 * 1024  # a progressive JPEG's coefficients (a 16 MP photo)
MAX_DECLARED_PIXELS = 64 * MAX_DECODE_PIXELS  # a JPEG decoded at 1/8 scale
FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


class Refusal(Enum):
    """Why an image is not read."""

    TOO_LARGE = "too_large"
    DAMAGED = "damaged"
    FORMAT = "format"


class ImageRefused(Exception):
    """The message is the one short line the user and the model see."""

    def __init__(self, refusal: Refusal, detail: str = "") -> None:
        if refusal is Refusal.TOO_LARGE:
            line = "this image is too large to read" + (f" ({detail})" if detail else "")
        elif refusal is Refusal.FORMAT:
            line = (
                f"an image format I can't read ({detail + '; ' if detail else ''}JPEG, PNG, GIF and WebP are)"
            )
        else:
            line = "the image is damaged or not an image"
        super().__init__(line)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Picture:
    """An image ready to store: its bytes (scaled when it was larger than
    ``MAX_IMAGE_SIDE``), media type and size in pixels."""

    data: bytes
    media_type: str
    width: int
    height: int


@functools.cache
def _pillow() -> None:
    """Pillow's process-wide guard, set once. Its warning (between the limit and twice
    it) is silenced: the header check refuses every such image before decoding, so the
    warning would only repeat that on stderr."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_DECLARED_PIXELS
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def read_image(data: bytes) -> Picture:
    """Check ``data`` and scale it to ``MAX_IMAGE_SIDE`` (blocking: run it in a thread).
    Raises ``ImageRefused``."""
    try:
        return _read(data)
    except ImageRefused:
        raise
    except Exception as e:  # the decoding boundary: whatever Pillow raises on hostile input
        from PIL import Image

        if isinstance(e, Image.DecompressionBombError):
            raise ImageRefused(Refusal.TOO_LARGE) from e
        log.info("image_unreadable", error=f"{type(e).__name__}: {e}")
        raise ImageRefused(Refusal.DAMAGED) from e


def media_type_of(data: bytes) -> str:
    """The media type of an image that ``read_image`` would take, checked without
    decoding it (the web upload's early answer). Raises ``ImageRefused``."""
    try:
        with _open(data) as img:
            return _checked(img, data)
    except ImageRefused:
        raise
    except Exception as e:  # the decoding boundary, as in read_image
        from PIL import Image

        if isinstance(e, Image.DecompressionBombError):
            raise ImageRefused(Refusal.TOO_LARGE) from e
        raise ImageRefused(Refusal.DAMAGED) from e


def _open(data: bytes) -> PilImage:
    _pillow()
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _checked(img: PilImage, data: bytes) -> str:
    """The media type, once the header says the image is one we read and can afford;
    ``verify`` then checks the file's structure without decoding pixels."""
    media_type = FORMATS.get(img.format or "")
    if media_type is None:
        raise ImageRefused(Refusal.FORMAT, img.format or "unknown")
    # The least a decode can cost: 4 bytes per pixel (Pillow keeps RGB in 4), a JPEG's
    # at 1/8 scale at best; and a progressive JPEG's coefficients, whatever the scale.
    pixels = img.width * img.height // (64 if img.format == "JPEG" else 1)
    if pixels > MAX_DECODE_PIXELS or _coefficient_bytes(img, data) > MAX_COEFFICIENT_BYTES:
        raise ImageRefused(Refusal.TOO_LARGE, f"{img.width}×{img.height} pixels")
    img.verify()
    return media_type


def _read(data: bytes) -> Picture:
    with _open(data) as img:
        media_type = _checked(img, data)
    with _open(data) as img:
        width, height = img.size
        if max(width, height) <= MAX_IMAGE_SIDE or getattr(img, "is_animated", False):
            return Picture(data, media_type, width, height)
        if img.format == "JPEG":
            # libjpeg decodes at the smallest of 1/2, 1/4, 1/8 that still covers the
            # target; thumbnail() then resizes from less than twice its size.
            img.draft(None, _fit(width, height))
        if img.width * img.height > MAX_DECODE_PIXELS:  # a JPEG too long and thin to reduce
            raise ImageRefused(Refusal.TOO_LARGE, f"{width}×{height} pixels")
        img.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
        out = io.BytesIO()
        if media_type == "image/jpeg":
            img.convert("RGB").save(out, "JPEG", quality=85)
        else:
            img.save(out, img.format)
        return Picture(out.getvalue(), media_type, img.width, img.height)


def _fit(width: int, height: int) -> tuple[int, int]:
    scale = MAX_IMAGE_SIDE / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _coefficient_bytes(img: PilImage, data: bytes) -> int:
    """The whole-image coefficient buffer libjpeg allocates for a progressive or
    multi-scan JPEG (at full declared size, whatever the draft scale); 0 otherwise."""
    if img.format != "JPEG" or not (img.info.get("progressive") or _scans(data) > 1):
        return 0
    layers: list[tuple[int, int, int, int]] = getattr(img, "layer", [])
    if not layers:
        return 2 * 4 * img.width * img.height  # unknown sampling: assume 4 full components
    h_max = max(h for _, h, _, _ in layers)
    v_max = max(v for _, _, v, _ in layers)
    share = sum(h * v for _, h, v, _ in layers) / (h_max * v_max)
    return int(2 * img.width * img.height * share)


def _scans(data: bytes) -> int:
    """How many scans (SOS segments) a JPEG has: the header's segments are walked by
    their lengths up to the first scan (an EXIF thumbnail is a JPEG of its own inside
    APP1), then every SOS marker after it is counted (entropy-coded data escapes 0xFF)."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xDA:
            return 1 + data.count(b"\xff\xda", i + 2)
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 1
