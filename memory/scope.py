"""Who a piece of memory belongs to, and in which context the agent runs.

``UserRef`` is the only way a chat user reaches a file path: both parts are validated
so that no id can name a path outside ``memories/users/`` (no separators, no ``..``,
no NUL or control characters, bounded length).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from enum import StrEnum

from mnemo.memory.errors import InvalidIdentifier

MAX_ID_LEN = 128


class AgentContext(StrEnum):
    """Why the agent is running; decides what it may write."""

    PRIMARY = "primary"  # answering a user's message
    REVIEW = "review"  # background memory review of a user's session (add-only)
    FLUSH = "flush"  # pre-compression / session-end flush (add-only)
    CRON = "cron"  # scheduled run: reads personal memory, never writes it
    SUBAGENT = "subagent"  # delegated work: no personal writes


def validate_id(kind: str, value: str) -> str:
    """Return ``value`` if it is safe as one path component, else raise InvalidIdentifier."""
    if not isinstance(value, str) or not value:
        raise InvalidIdentifier(f"{kind} id must be a non-empty string")
    if len(value) > MAX_ID_LEN:
        raise InvalidIdentifier(f"{kind} id is longer than {MAX_ID_LEN} characters")
    if value in (".", "..") or ".." in value:
        raise InvalidIdentifier(f"{kind} id {value!r} contains '..'")
    for ch in value:
        if ch in "/\\" or ch == "\x00":
            raise InvalidIdentifier(f"{kind} id {value!r} contains a path separator or NUL")
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            raise InvalidIdentifier(f"{kind} id {value!r} contains a control character")
    if value != value.strip():
        raise InvalidIdentifier(f"{kind} id {value!r} has leading or trailing whitespace")
    return value


@dataclass(frozen=True, slots=True)
class UserRef:
    """A chat user on one platform: ``telegram:12345``."""

    platform: str
    user_id: str

    def __post_init__(self) -> None:
        validate_id("platform", self.platform)
        validate_id("user", self.user_id)
        if ":" in self.platform:
            raise InvalidIdentifier(f"platform {self.platform!r} must not contain ':'")

    @classmethod
    def parse(cls, text: str) -> UserRef:
        platform, sep, user_id = text.partition(":")
        if not sep:
            raise InvalidIdentifier(f"expected PLATFORM:ID, got {text!r}")
        return cls(platform, user_id)

    def __str__(self) -> str:
        return f"{self.platform}:{self.user_id}"
