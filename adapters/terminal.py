"""Text that is safe to write to a terminal.

Stored text (memory entries, messages, facts, cron prompts) and model replies may hold
control characters: ``ESC [ 8 m`` hides what follows, ``ESC ] 0 ;`` retitles the window,
CR overwrites the line, a lone surrogate makes ``print`` raise. Everything the CLI and
the console adapter print from such sources goes through :func:`printable`, which shows
each such character as a visible escape (``\\x1b``, ``\\r``, ``\\ud800``) and leaves
tab, newline and all other text alone. It lives in ``adapters`` so that both the console
adapter and the composition root (``mnemo.cli``) can use it.
"""

from __future__ import annotations

import re

_NAMED = {"\r": "\\r", "\x0b": "\\v", "\x0c": "\\f", "\x08": "\\b", "\x07": "\\a", "\x00": "\\0"}
# C0 except tab and newline, DEL, C1, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# The same inside JSON text: json.dumps already escapes C0, never DEL, C1 or surrogates
# (with ensure_ascii=False).
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    cp = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}"


def printable(text: str) -> str:
    """``text`` with every terminal control character shown as a visible escape."""
    return _UNSAFE.sub(_escape, text)


def printable_json(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) made terminal-safe; it
    stays valid JSON that decodes to the same value."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)
