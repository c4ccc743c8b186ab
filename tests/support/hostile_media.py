"""Files that attack the media path, built byte by byte so that making one costs
nothing: images whose header declares far more pixels than their data holds (or holds
them compressed to almost nothing), a progressive "JPEG bomb", and PDFs with many
pages, written plainly or packed into compressed object streams."""

from __future__ import annotations

import io
import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header says ``width``×``height`` (RGB) with a few bytes of pixels: a
    few hundred bytes in all. Valid chunk by chunk; decoding would run out of data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" * 64)
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", pixels) + _chunk(b"IEND", b"")


def png_solid(width: int, height: int) -> bytes:
    """A complete, valid RGB PNG of one colour: 12000×12000 compresses to about 420 KB.
    Built a row at a time, so making it takes almost no memory."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    deflate = zlib.compressobj(9)
    row = b"\x00" + b"\x20\x80\xe0" * width  # filter byte "none", then the pixels
    body = b"".join([*(deflate.compress(row) for _ in range(height)), deflate.flush()])
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int, *, progressive: bool) -> bytes:
    """A real 64×64 JPEG whose frame header is rewritten to declare ``width``×``height``.
    A progressive one makes libjpeg allocate coefficients for the whole declared image
    however small it is decoded: the classic JPEG bomb."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (30, 160, 90)).save(out, "JPEG", progressive=progressive, quality=60)
    data = out.getvalue()
    i = 2
    while i + 4 <= len(data):
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):  # SOF: length, precision, height, width
            return data[: i + 5] + struct.pack(">HH", height, width) + data[i + 9 :]
        i += 2 + length
    raise AssertionError("no frame header in the JPEG Pillow wrote")


def pdf(
    pages: int, *, object_stream: bool = False, one_page_object: bool = False, count: int | None = None
) -> bytes:
    """A PDF of ``pages`` blank pages. ``object_stream``: the page tree and the pages
    packed into one compressed object stream (PDF 1.5), so none of them shows in the
    file's bytes. ``one_page_object``: the tree lists a single page object ``pages``
    times. ``count``: what the tree root's ``/Count`` claims (default: the truth)."""
    leaves = 1 if one_page_object else pages
    kids = " ".join(f"{3 if one_page_object else 3 + n} 0 R" for n in range(pages))
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{kids}] /Count {pages if count is None else count} >>".encode(),
    }
    for n in range(leaves):
        objects[3 + n] = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"
    out = io.BytesIO()
    out.write(b"%PDF-1.5\n")
    if not object_stream:
        for number, body in objects.items():
            out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    else:
        packed = [(number, body) for number, body in objects.items() if number != 1]
        offsets, position = [], 0
        for number, body in packed:
            offsets.append(f"{number} {position}")
            position += len(body) + 1
        header = (" ".join(offsets) + "\n").encode()
        stream = zlib.compress(header + b"".join(body + b"\n" for _, body in packed))
        out.write(b"1 0 obj\n" + objects[1] + b"\nendobj\n")
        number = 3 + leaves
        out.write(
            b"%d 0 obj\n<< /Type /ObjStm /N %d /First %d /Filter /FlateDecode /Length %d >>\nstream\n"
            % (number, len(packed), len(header), len(stream))
            + stream
            + b"\nendstream\nendobj\n"
        )
    out.write(b"trailer\n<< /Root 1 0 R >>\n%%EOF\n")
    return out.getvalue()
