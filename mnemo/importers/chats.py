"""Which mnemo chat a foreign conversation lands in (``--chat-map``).

Search is scoped by chat (session key), so where an imported session goes decides
who can find it: the bot's ``session_search`` in a chat sees that chat's history only.

A mapping is ``SOURCE=TARGET``:

* ``SOURCE`` is the chat as the dry run lists it — for Hermes ``PLATFORM:CHAT_ID``
  (``telegram:12345``, the platform and chat id Hermes recorded) or the bare source
  (``cli``, ``cron``); for OpenClaw the session key without its ``agent:<id>:`` prefix
  (``telegram:dm:12345``, ``main``) or ``notes`` for the daily memory notes;
* ``TARGET`` is a mnemo chat: ``PLATFORM:CHAT_ID`` for a direct chat
  (``telegram:12345`` → ``telegram:dm:12345``) or a whole session key as mnemo builds
  it (``telegram:dm:12345``, ``discord:group:CHANNEL:USER``).

Without a mapping, a conversation whose platform mnemo serves and whose ids are that
platform's own (Telegram and Discord chats Hermes recorded; Telegram direct chats and
group chats OpenClaw keyed) goes to the same chat here. Everything else goes to
``import:<kind>:<SOURCE>`` — searchable with ``mnemo sessions search``, invisible to the
bot's chats until mapped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mnemo.gateway.events import ChatType, session_key
from mnemo.importers.common import ChatHint, ForeignSession
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import validate_id

SAME_ID_PLATFORMS = frozenset({"telegram", "discord"})


class ChatMapError(ValueError):
    """A ``--chat-map`` value that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class Target:
    chat_key: str
    platform: str
    chat_id: str
    thread_id: str | None = None
    user_id: str | None = None


def _part(kind: str, value: str, text: str) -> str:
    try:
        validate_id(kind, value)
    except InvalidIdentifier as e:
        raise ChatMapError(f"{text!r}: {e}") from None
    if ":" in value:
        raise ChatMapError(f"{text!r}: {kind} {value!r} must not contain ':'")
    return value


def parse_target(text: str) -> Target:
    """``PLATFORM:CHAT_ID`` (a direct chat) or a whole mnemo session key."""
    parts = text.strip().split(":")
    if len(parts) < 2 or any(not p for p in parts):
        raise ChatMapError(
            f"{text!r}: a target is PLATFORM:CHAT_ID or a session key such as telegram:dm:12345"
        )
    platform = _part("platform", parts[0], text)
    if len(parts) == 2:
        chat = _part("chat", parts[1], text)
        return Target(session_key(platform, ChatType.DM, chat), platform, chat)
    kind, chat, rest = parts[1], _part("chat", parts[2], text), [_part("id", p, text) for p in parts[3:]]
    if kind == ChatType.DM.value and not rest:
        return Target(":".join(parts), platform, chat)
    if kind == ChatType.GROUP.value and len(rest) <= 2:
        # platform:group:CHAT[:THREAD][:USER]: with one extra part it is the member's id
        # (mnemo keys group sessions per member by default).
        thread, user = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0] if rest else None)
        return Target(":".join(parts), platform, chat, thread, user)
    raise ChatMapError(
        f"{text!r}: not a mnemo chat; use PLATFORM:CHAT_ID, PLATFORM:dm:CHAT_ID or PLATFORM:group:CHAT[:THREAD][:USER]"
    )


def parse_mapping(text: str) -> tuple[str, Target]:
    source, sep, target = text.partition("=")
    if not sep or not source.strip() or not target.strip():
        raise ChatMapError(f"{text!r}: a chat mapping is SOURCE=TARGET, e.g. telegram:12345=telegram:12345")
    return source.strip(), parse_target(target)


def read_mappings(path: Path) -> list[str]:
    """The ``SOURCE=TARGET`` lines of a mapping file (blank lines and ``#`` comments skipped)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ChatMapError(f"{path}: cannot read the chat map ({e})") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


class ChatMap:
    def __init__(self, kind: str, mappings: Iterable[str] = (), *, group_per_user: bool = True) -> None:
        self.kind = kind
        self.group_per_user = group_per_user
        explicit: dict[str, Target] = {}
        for text in mappings:
            source, target = parse_mapping(text)
            if source in explicit and explicit[source] != target:
                raise ChatMapError(
                    f"{source!r} is mapped twice, to {explicit[source].chat_key} and {target.chat_key}"
                )
            explicit[source] = target
        self.explicit: Mapping[str, Target] = explicit

    def resolve(self, session: ForeignSession) -> tuple[Target, str]:
        """The chat and how it was chosen: ``mapped`` (``--chat-map``), ``same ids`` (the
        platform's own ids), ``unmapped`` (an ``import:`` chat)."""
        target = self.explicit.get(session.source_chat)
        if target is not None:
            return target, "mapped"
        same = self._same_ids(session.hint)
        if same is not None:
            return same, "same ids"
        return Target(
            f"import:{self.kind}:{session.source_chat}", "import", f"{self.kind}:{session.source_chat}"
        ), "unmapped"

    def _same_ids(self, hint: ChatHint) -> Target | None:
        if hint.platform not in SAME_ID_PLATFORMS or hint.chat_id is None or hint.kind is None:
            return None
        try:
            if hint.kind == "dm":
                return Target(
                    session_key(hint.platform, ChatType.DM, hint.chat_id),
                    hint.platform,
                    hint.chat_id,
                    user_id=hint.user_id,
                )
            per_user = self.group_per_user and hint.user_id is not None
            key = session_key(
                hint.platform, ChatType.GROUP, hint.chat_id, hint.thread_id, hint.user_id, per_user=per_user
            )
        except ValueError:  # an id with ':' cannot be a key part: leave it unmapped
            return None
        return Target(key, hint.platform, hint.chat_id, hint.thread_id, hint.user_id if per_user else None)

    def unused(self, seen: Iterable[str]) -> list[str]:
        """Mapped sources that matched no conversation (most likely a typo)."""
        return sorted(set(self.explicit) - set(seen))
