"""What people send, read defensively (``gateway.images``, ``gateway.pdfs``,
``gateway.media.clean_file_name``): hostile or broken bytes give one refusal and never
any other exception; no file name carries a control character or a path."""

from __future__ import annotations

import io
import unicodedata
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mnemo.gateway.images import MAX_IMAGE_SIDE, ImageRefused, Refusal, media_type_of, read_image
from mnemo.gateway.media import MAX_NAME_CHARS, MediaStore, clean_file_name
from mnemo.gateway.pdfs import MAX_INFLATED_BYTES, PdfUnreadable, count_pages
from tests.support.hostile_media import jpeg_declaring, pdf, png_declaring


def _saved(fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 90)).save(out, fmt, **options)
    return out.getvalue()


SAMPLES = {
    "png": _saved("PNG"),
    "jpeg": _saved("JPEG"),
    "progressive": _saved("JPEG", progressive=True),
    "gif": _saved("GIF"),
    "webp": _saved("WEBP"),
}


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A sample image with bytes overwritten, cut short, or its header's size rewritten."""
    data = bytearray(SAMPLES[draw(st.sampled_from(sorted(SAMPLES)))])
    for _ in range(draw(st.integers(0, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=damaged())
def test_a_damaged_image_is_read_or_refused_never_an_other_error(data: bytes) -> None:
    try:
        picture = read_image(data)
    except ImageRefused:
        return
    assert max(picture.width, picture.height) <= MAX_IMAGE_SIDE


# gateway.images silences this warning once per process; pytest resets filters per test.
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@settings(max_examples=100, deadline=None)
@given(
    width=st.integers(1, 70_000),
    height=st.integers(1, 70_000),
    kind=st.sampled_from(["png", "jpeg", "progressive"]),
)
def test_a_declared_size_decides_before_anything_is_decoded(width: int, height: int, kind: str) -> None:
    data = (
        png_declaring(width, height)
        if kind == "png"
        else jpeg_declaring(min(width, 65_535), min(height, 65_535), progressive=kind == "progressive")
    )
    try:
        media_type_of(data)
    except ImageRefused as e:
        assert e.refusal in (Refusal.TOO_LARGE, Refusal.DAMAGED)


@pytest.mark.parametrize(
    "data",
    [
        png_declaring(50_000, 50_000),
        png_declaring(12_000, 12_000),
        jpeg_declaring(6000, 6000, progressive=True),
    ],
    ids=["pillow-bomb-error", "png-over-the-bound", "jpeg-coefficients"],
)
def test_bombs_are_too_large_to_read(data: bytes) -> None:
    with pytest.raises(ImageRefused) as refused:
        read_image(data)
    assert refused.value.refusal is Refusal.TOO_LARGE
    assert str(refused.value).startswith("this image is too large to read")


@settings(max_examples=60, deadline=None)
@given(
    pages=st.integers(1, 400),
    object_stream=st.booleans(),
    one_page_object=st.booleans(),
    lie=st.booleans(),
)
def test_a_pdfs_pages_are_counted_however_it_hides_them(
    pages: int, object_stream: bool, one_page_object: bool, lie: bool
) -> None:
    data = pdf(pages, object_stream=object_stream, one_page_object=one_page_object, count=1 if lie else None)
    assert count_pages(data) == pages


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400), pages=st.integers(1, 5), object_stream=st.booleans())
def test_any_bytes_give_a_page_count_or_one_refusal(data: bytes, pages: int, object_stream: bool) -> None:
    sample = pdf(pages, object_stream=object_stream)
    packed = (  # an object stream whose header and objects are these bytes
        b"%PDF-1.5\n1 0 obj\n<< /Type /ObjStm /N 2 /First 9 >>\nstream\n"
        + zlib.compress(data)
        + b"\nendstream\nendobj\n"
    )
    for candidate in (
        data,
        sample[: len(data)] + data,
        sample.replace(b"stream\n", b"stream\n" + data[:8]),
        packed,
    ):
        try:
            assert count_pages(candidate) >= 1
        except PdfUnreadable:
            pass


def test_an_object_stream_inflating_past_the_bound_is_refused() -> None:
    bomb = zlib.compress(b" " * (MAX_INFLATED_BYTES + 1), 9)
    data = (
        b"%PDF-1.5\n1 0 obj\n<< /Type /ObjStm /N 1 /First 4 /Filter /FlateDecode >>\nstream\n"
        + bomb
        + b"\nendstream\nendobj\n"
    )
    with pytest.raises(PdfUnreadable, match="too large"):
        count_pages(data)


def test_a_pdf_over_the_page_limit_is_a_note_and_is_not_stored(tmp_path: Path) -> None:
    store = MediaStore(tmp_path)
    refused = store.prepare("document", "book.pdf", "application/pdf", pdf(101))
    assert refused.refs == []
    assert refused.text == "[attachment (book.pdf): the PDF has 101 pages; I can read at most 100]"
    taken = store.prepare("document", "short.pdf", "application/pdf", pdf(100, object_stream=True))
    assert taken.refs[0]["pages"] == 100
    assert not (tmp_path / "media" / "x").exists()


# -- file names --------------------------------------------------------------------------

HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


@settings(max_examples=500, deadline=None)
@given(
    raw=st.text(max_size=300)
    | st.lists(st.sampled_from(["../", "..\\", "\x00", "/", "a", ".", "\u202e", "\n"])).map("".join)
)
def test_a_clean_file_name_has_no_path_and_no_hidden_character(raw: str) -> None:
    name = clean_file_name(raw)
    assert "/" not in name and "\\" not in name
    assert not any(unicodedata.category(ch) in HIDDEN for ch in name)
    assert name == name.strip() and name not in (".", "..")
    assert len(name) <= MAX_NAME_CHARS
    assert clean_file_name(name) == name  # cleaning twice changes nothing


@settings(max_examples=200, deadline=None)
@given(raw=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 ._()-]{0,60}\.(pdf|png|txt)", fullmatch=True))
def test_an_ordinary_file_name_is_kept_as_it_is(raw: str) -> None:
    assert clean_file_name(raw) == raw.strip()


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("../../x\x00evil.txt", "xevil.txt"),
        ("C:\\Users\\me\\report.pdf", "report.pdf"),
        ("evil\u202etxt.exe", "eviltxt.exe"),
        ("two\nlines.md", "two lines.md"),
        ("..", ""),
        ("a" * 300 + ".pdf", "a" * (MAX_NAME_CHARS - 4) + ".pdf"),
    ],
)
def test_file_names_as_stored(raw: str, clean: str) -> None:
    assert clean_file_name(raw) == clean
