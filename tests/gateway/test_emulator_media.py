"""The emulator checks image and document blocks as the Messages API does (media type,
base64, content matching the declared type, size) and counts their tokens as the API
does (width × height / 750 after scaling; per PDF page), not by their base64 length."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from mnemo.gateway.emulator import validate_request
from mnemo.gateway.emulator.cache import block_tokens
from tests.adapters.test_telegram_media import MINI_PDF
from tests.fakes.telegram_world import jpeg


def body(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "hi"}]}],
    }


def image(data: bytes, media_type: str = "image/jpeg") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()},
    }


def pdf(data: bytes) -> dict[str, Any]:
    return {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(data).decode(),
        },
    }


def test_valid_image_and_pdf_blocks_pass() -> None:
    assert validate_request(body(image(jpeg()), pdf(MINI_PDF))) is None


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (image(jpeg(), "image/png"), "does not match the provided media type"),
        (image(b"not an image at all"), "Could not process image"),
        (image(jpeg(), "image/bmp"), "media_type"),
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "@@@"}},
            "Invalid base64",
        ),
        (image(b"\xff\xd8\xff" + b"0" * (5 * 1024 * 1024)), "exceeds 5 MB"),
        (pdf(b"hello"), "PDF specified was not valid"),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "text/csv", "data": "eA=="}},
            "application/pdf",
        ),
    ],
)
def test_bad_media_blocks_are_refused(block: dict[str, Any], message: str) -> None:
    error = validate_request(body(block))
    assert error is not None and message in error


def test_media_tokens_follow_the_api_formula() -> None:
    assert block_tokens(image(jpeg(750, 100))) == 100
    assert block_tokens(image(jpeg(3136, 1568))) == 1568 * 784 // 750  # scaled to 1,568 first
    assert block_tokens(pdf(MINI_PDF)) == 1500  # one page
