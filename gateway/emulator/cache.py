"""Prompt-cache accounting modelled on the real API's documented behaviour.

The prompt is a sequence of blocks in prefix order: each tool definition, each system
text block, then each content block of each message. Block ``i``'s key is a rolling
SHA-256 over the model name and the canonical JSON of blocks ``0..i`` (``cache_control``
stripped, string content normalised to one text block, so moving a marker or switching
string/list forms of the same text does not change the key; ``tool_choice`` and
``thinking`` are mixed in before the first message block because the real API
invalidates the messages part when they change).

Per request:

- **read**: from every breakpoint, look back over at most ``lookback`` (20) earlier
  block boundaries plus the breakpoint itself; the longest prefix among them with a live
  entry is the hit, and reading it refreshes its TTL;
- **write**: every breakpoint after the hit whose prefix reaches
  ``min_cacheable_tokens`` gets an entry with its TTL (5 minutes, or 1 hour for
  ``"ttl": "1h"``); shorter prefixes are silently not cached, as in the real API;
- **usage**: ``cache_read_input_tokens`` = tokens of the hit prefix,
  ``cache_creation_input_tokens`` = tokens from the hit to the last written breakpoint,
  ``input_tokens`` = the rest (everything after the last breakpoint, or everything when
  nothing could be cached).

Simplifications: the lookback counts blocks exactly as listed above (the real API's
notion of a block boundary may differ slightly), entries are per emulator (one
"organisation"), and tokens are the shared ``memory.tokens`` estimate of each block's
canonical JSON, not a real tokenizer.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from mnemo.memory.tokens import estimate_json_tokens

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
DEFAULT_LOOKBACK = 20
_SWEEP_MIN = 4096  # entries; expired ones are dropped once the table doubles past this


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_5m_tokens: int = 0
    cache_creation_1h_tokens: int = 0

    @property
    def total_input_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def cache_read_share(self) -> float:
        """Share of all input tokens that were served from the cache."""
        total = self.total_input_tokens
        return self.cache_read_input_tokens / total if total else 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Usage)))

    def as_api(self) -> dict[str, Any]:
        """The ``usage`` object exactly as the real API sends it."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m_tokens,
                "ephemeral_1h_input_tokens": self.cache_creation_1h_tokens,
            },
            "output_tokens": self.output_tokens,
            "service_tier": "standard",
        }

    @classmethod
    def from_api(cls, usage: dict[str, Any]) -> Usage:
        creation = usage.get("cache_creation") or {}
        return cls(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            cache_creation_input_tokens=usage.get("cache_creation_input_tokens") or 0,
            cache_read_input_tokens=usage.get("cache_read_input_tokens") or 0,
            cache_creation_5m_tokens=creation.get("ephemeral_5m_input_tokens", 0),
            cache_creation_1h_tokens=creation.get("ephemeral_1h_input_tokens", 0),
        )


@dataclass(frozen=True, slots=True)
class PrefixBlock:
    key: bytes  # digest of the prefix up to and including this block
    tokens: int  # cumulative tokens of that prefix
    ttl: str | None  # "5m"/"1h" when this block carries a breakpoint


@dataclass(slots=True)
class _Entry:
    expires_at: float
    ttl: float


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _strip(block: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if out.get("type") == "tool_result" and isinstance(out.get("content"), str):
        out["content"] = [{"type": "text", "text": out["content"]}] if out["content"] else []
    return out


def _as_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _ttl_of(block: dict[str, Any]) -> str | None:
    cc = block.get("cache_control")
    return str(cc.get("ttl", "5m")) if isinstance(cc, dict) else None


def block_tokens(block: dict[str, Any]) -> int:
    """A content block's tokens: as the API counts images (width × height / 750, after
    scaling to a long side of 1,568 px) and PDFs (about 1,500 per page, text and image);
    everything else the shared JSON estimate."""
    source = block.get("source") if block.get("type") in ("image", "document") else None
    if not isinstance(source, dict) or source.get("type") != "base64":
        return estimate_json_tokens(block)
    data = base64.b64decode(str(source.get("data") or ""))
    if block["type"] == "document":
        return 1500 * max(1, data.count(b"/Type /Page") - data.count(b"/Type /Pages"))
    width, height = _image_size(data)
    scale = min(1.0, 1568 / max(width, height, 1))
    return max(1, int(width * scale * height * scale / 750))


def _image_size(data: bytes) -> tuple[int, int]:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (ImportError, OSError, ValueError):  # validation already refused what cannot be decoded
        return (1, 1)


def prefix_blocks(body: dict[str, Any]) -> list[PrefixBlock]:
    """The request's blocks in prefix order with their keys, cumulative tokens and TTLs."""
    items: list[tuple[Any, int, str | None]] = []  # (hashed item, tokens, ttl)
    for tool in body.get("tools") or ():
        stripped = _strip(tool)
        items.append((("tool", stripped), estimate_json_tokens(stripped), _ttl_of(tool)))
    for block in _as_blocks(body.get("system")):
        stripped = _strip(block)
        items.append((("system", stripped), estimate_json_tokens(stripped), _ttl_of(block)))
    context: dict[str, Any] | None = {k: body[k] for k in ("tool_choice", "thinking") if k in body}
    for msg in body.get("messages") or ():
        for block in _as_blocks(msg.get("content")):
            stripped = _strip(block)
            item: Any = (msg.get("role"), stripped)
            if context is not None:
                item = (msg.get("role"), stripped, context)
                context = None
            items.append((item, block_tokens(stripped), _ttl_of(block)))
    auto = body.get("cache_control")
    if isinstance(auto, dict) and items:  # automatic caching marks the last block
        item, tokens, ttl = items[-1]
        items[-1] = (item, tokens, ttl or str(auto.get("ttl", "5m")))

    digest = hashlib.sha256(_canonical({"model": body.get("model")})).digest()
    out: list[PrefixBlock] = []
    total = 0
    for item, tokens, ttl in items:
        digest = hashlib.sha256(digest + _canonical(item)).digest()
        total += tokens
        out.append(PrefixBlock(digest, total, ttl))
    return out


class PromptCache:
    """The emulator's cache table: prefix key -> expiry, driven by an injected clock."""

    def __init__(
        self,
        clock: Callable[[], float],
        min_cacheable_tokens: int = 1024,
        lookback: int = DEFAULT_LOOKBACK,
    ) -> None:
        self._clock = clock
        self.min_cacheable_tokens = min_cacheable_tokens
        self.lookback = lookback
        self._entries: dict[bytes, _Entry] = {}
        self._sweep_at = _SWEEP_MIN

    def __len__(self) -> int:
        now = self._clock()
        return sum(1 for e in self._entries.values() if e.expires_at > now)

    def clear(self) -> None:
        self._entries.clear()

    def account(self, body: dict[str, Any]) -> Usage:
        """Read and write the cache for one valid request; returns its input-side usage."""
        blocks = prefix_blocks(body)
        total = blocks[-1].tokens if blocks else 0
        breakpoints = [i for i, b in enumerate(blocks) if b.ttl is not None]
        if not breakpoints:
            return Usage(input_tokens=total)
        now = self._clock()
        if len(self._entries) > self._sweep_at:
            self._entries = {k: e for k, e in self._entries.items() if e.expires_at > now}
            # Doubling keeps sweeps amortised O(1) even when most entries are live.
            self._sweep_at = max(_SWEEP_MIN, 2 * len(self._entries))

        hit = self._longest_hit(blocks, breakpoints, now)
        read = blocks[hit].tokens if hit >= 0 else 0
        if hit >= 0:
            entry = self._entries[blocks[hit].key]
            entry.expires_at = now + entry.ttl

        written = {"5m": 0, "1h": 0}
        covered = read
        for i in breakpoints:
            block = blocks[i]
            if i <= hit or block.tokens < self.min_cacheable_tokens or block.ttl is None:
                continue
            ttl = TTL_SECONDS[block.ttl]
            self._entries[block.key] = _Entry(now + ttl, ttl)
            written[block.ttl] += block.tokens - covered
            covered = block.tokens
        creation = covered - read
        return Usage(
            input_tokens=total - read - creation,
            cache_creation_input_tokens=creation,
            cache_read_input_tokens=read,
            cache_creation_5m_tokens=written["5m"],
            cache_creation_1h_tokens=written["1h"],
        )

    def _longest_hit(self, blocks: list[PrefixBlock], breakpoints: list[int], now: float) -> int:
        candidates: set[int] = set()
        for bp in breakpoints:
            candidates.update(range(max(0, bp - self.lookback), bp + 1))
        for j in sorted(candidates, reverse=True):
            entry = self._entries.get(blocks[j].key)
            if entry is not None and entry.expires_at > now:
                return j
        return -1
