"""A cheap, deterministic token estimate shared by the session store, the compressor,
the emulator and the benchmarks: ~4 characters per token for ASCII text, one token per
character for everything else (CJK, emoji), which over-estimates rather than under.
Real counts come from the API's usage fields whenever a request was made.
"""

from __future__ import annotations

import json
from typing import Any


def estimate_tokens(text: str) -> int:
    if not text:
        return 0
    if text.isascii():  # the common case, without a Python-level loop
        return (len(text) + 3) // 4
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def estimate_json_tokens(value: Any) -> int:
    """Estimate for a JSON value (tool inputs, content blocks)."""
    return estimate_tokens(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
