"""How many pages a PDF has, read from its bytes within a fixed memory bound.

The Messages API takes at most ``MAX_PDF_PAGES`` pages in a request, and a PDF that is
stored is re-sent with later turns: one with more pages must be refused before it is
stored, or every request of the conversation would fail. A PDF library would parse the
whole cross-reference table into objects (pypdf: 1.5 s and 78 MB for a 2.5 MB file of
20,000 blank pages), so the page tree is read from the raw bytes instead. A PDF may
hide its objects in compressed object streams (``/Type /ObjStm``, PDF 1.5): those are
inflated one at a time with ``zlib``'s output bounded, at most ``MAX_INFLATED_BYTES``
in all.

The count is the largest of three readings, so that neither a lying ``/Count`` nor a
page tree that lists one page object many times passes as short:

* the page objects (``/Type /Page``);
* the page references in the tree's ``/Kids`` arrays;
* the ``/Count`` of the page tree's nodes (``/Type /Pages``).
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MAX_PDF_PAGES = 100  # the Messages API's limit for the PDFs of one request
MAX_INFLATED_BYTES = 32 * 1024 * 1024

_OBJECT_END = re.compile(rb"\bendobj\b")
_STREAM = re.compile(rb"\bstream\r?\n")
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z0-9])")
_PAGES = re.compile(rb"/Type\s*/Pages(?![A-Za-z0-9])")
_COUNT = re.compile(rb"/Count\s+(\d{1,12})")
_KIDS = re.compile(rb"/Kids\s*\[([^\]]*)\]")
_REFERENCE = re.compile(rb"\d+\s+\d+\s+R\b")
_OBJECT_STREAM = re.compile(rb"/Type\s*/ObjStm(?![A-Za-z0-9])")
_FIRST = re.compile(rb"/First\s+(\d{1,12})")


class PdfUnreadable(Exception):
    """The page count cannot be found within the bounds; the message is the reason."""


@dataclass
class _Tally:
    pages: int = 0
    kids: int = 0
    declared: int = 0

    def read(self, obj: bytes | memoryview) -> None:
        """One object's dictionary (a stream's data is not part of it)."""
        self.pages += len(_PAGE.findall(obj))
        for kids in _KIDS.finditer(obj):
            self.kids += len(_REFERENCE.findall(kids[1]))
        if _PAGES.search(obj):
            self.declared = max([self.declared, *(int(c) for c in _COUNT.findall(obj))])


def count_pages(data: bytes) -> int:
    """The number of pages of the PDF ``data`` (at least 1). Raises ``PdfUnreadable``
    when an object stream cannot be inflated or would inflate past the bound."""
    tally = _Tally()
    budget = MAX_INFLATED_BYTES
    view = memoryview(data)
    for start, end in _objects(data):
        stream = _STREAM.search(data, start, end)
        tally.read(view[start : stream.start() if stream else end])
        if stream is None or not _OBJECT_STREAM.search(data, start, stream.start()):
            continue
        inflated = _inflate(view[stream.end() : end], budget)
        budget -= len(inflated)
        header = _FIRST.search(data, start, stream.start())
        for obj in _packed(inflated, int(header[1]) if header else 0):
            tally.read(obj)
    return max(1, tally.pages, tally.kids, tally.declared)


def _objects(data: bytes) -> Iterator[tuple[int, int]]:
    """Spans of the top-level objects: each ends at its ``endobj``."""
    start = 0
    for match in _OBJECT_END.finditer(data):
        yield start, match.start()
        start = match.end()


def _inflate(raw: memoryview, budget: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(raw, max(budget, 0) + 1)
    except zlib.error as e:
        raise PdfUnreadable("a compressed part of the PDF is damaged") from e
    if len(out) > budget:
        raise PdfUnreadable("the PDF's compressed structure is too large for me to read")
    return out


def _packed(inflated: bytes, first: int) -> Iterator[memoryview]:
    """The objects of an object stream: after ``first`` bytes of "number offset" pairs,
    each object runs from its offset to the next one's."""
    numbers = [int(n) for n in inflated[:first].split() if n.isdigit()]
    offsets = sorted(first + n for n in numbers[1::2] if 0 <= n < len(inflated))
    view = memoryview(inflated)
    for a, b in itertools.pairwise([*offsets, len(inflated)]):
        yield view[a:b]
