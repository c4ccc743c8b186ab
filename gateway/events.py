"""The value objects that cross between adapters and the gateway, and the session key.

Adapters turn platform events into ``InboundMessage`` and deliver ``OutboundMessage``;
raw SDK objects never cross into the core. ``session_key`` is the one place a chat's
session key is computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from mnemo.memory.scope import AgentContext, UserRef, validate_id


class ChatType(StrEnum):
    DM = "dm"
    GROUP = "group"


@dataclass(frozen=True, slots=True)
class Attachment:
    kind: str  # "photo", "document", "voice", ...
    name: str = ""
    size: int | None = None
    ref: str = ""  # the platform's handle to download it (a Telegram file_id, a URL)
    media_type: str = ""  # as the platform declared it ("" when it did not)


_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class InboundMessage:
    platform: str
    chat_id: str
    user_id: str
    message_id: str
    text: str
    user_name: str = ""
    chat_type: ChatType = ChatType.DM
    thread_id: str | None = None
    mentioned: bool = False
    attachments: tuple[Attachment, ...] = ()
    reply_to: str | None = None  # quoted text of the message replied to, if any
    received_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    agent_context: AgentContext = AgentContext.PRIMARY
    # In a group channel, whether members share one session ("shared room").
    shared_room: bool = False
    # The reply is seen by the author only (a Discord ephemeral interaction): private
    # answers such as /memory may then be given even though the chat is a group.
    private: bool = False

    def __post_init__(self) -> None:
        # Free text from any platform may carry lone surrogates (a JSON "\ud800"):
        # they cannot be stored or sent on, so every adapter's message gets U+FFFD for them.
        for name in ("text", "user_name", "reply_to"):
            value = getattr(self, name)
            if value is not None and _SURROGATE.search(value):
                object.__setattr__(self, name, _SURROGATE.sub("\ufffd", value))
        validate_id("platform", self.platform)
        validate_id("chat", self.chat_id)
        validate_id("user", self.user_id)
        if self.thread_id is not None:
            validate_id("thread", self.thread_id)

    @property
    def is_dm(self) -> bool:
        return self.chat_type is ChatType.DM

    @property
    def speaker(self) -> UserRef:
        return UserRef(self.platform, self.user_id)


class Submitted(StrEnum):
    """What the gateway did with an inbound message (``Gateway.submit``'s answer)."""

    ACCEPTED = "accepted"  # stored; a reply will follow
    DUPLICATE = "duplicate"  # accepted earlier (a redelivery); no second reply
    REFUSED = "refused"  # not authorized or rate limited; a refusal was sent directly
    DROPPED = "dropped"  # not allowed here or told already; nothing will be sent


@dataclass(frozen=True, slots=True)
class ChatRef:
    """Where a reply goes: a chat on a platform (and a thread in it)."""

    platform: str
    chat_id: str
    thread_id: str | None = None


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    chat: ChatRef
    text: str
    reply_to_message_id: str | None = None
    # The member whose message this answers; the only user a reply may mention.
    mention_user_id: str | None = None
    scheduled: bool = False  # a cron delivery, labelled as such by the adapter
    possible_duplicate: bool = False  # re-sent after a crash while the send was in flight
    # The outbox row: a stable key adapters may use to make re-sends idempotent
    # (e.g. a Discord nonce).
    outbox_id: int | None = None
    # The platform message that showed this reply while it was generated
    # (``ports.StreamsReplies``): the adapter edits it into the reply's first part and
    # sends the remaining parts as usual.
    stream_message_id: str | None = None


# A scheduled run whose reply is exactly this delivers nothing.
SILENT = "[SILENT]"


def delivery_label(message: OutboundMessage) -> str:
    """How a delivery is marked for the reader, the same on every platform:
    ``⏰ scheduled``, ``(possible duplicate: re-sent after a restart)``, both, or ""."""
    marks = []
    if message.scheduled:
        marks.append("⏰ scheduled")
    if message.possible_duplicate:
        marks.append("(possible duplicate: re-sent after a restart)")
    return " · ".join(marks)


def session_key(
    platform: str,
    chat_type: ChatType,
    chat_id: str,
    thread_id: str | None = None,
    user_id: str | None = None,
    *,
    per_user: bool = True,
) -> str:
    """``platform:chat_type:chat_id[:thread_id][:user_id]`` — the one definition.

    DMs are keyed by chat. In groups each member gets their own session unless
    ``per_user`` is False (shared-room mode).
    """
    for part in (platform, chat_id, thread_id):
        if part is not None and ":" in part:
            raise ValueError(f"session key part {part!r} must not contain ':'")
    parts = [platform, chat_type.value, chat_id]
    if thread_id is not None:
        parts.append(thread_id)
    if chat_type is ChatType.GROUP and per_user:
        if user_id is None:
            raise ValueError("a per-user group session key needs the user id")
        parts.append(user_id)
    return ":".join(parts)


def is_shared_room(msg: InboundMessage, *, per_user: bool = True) -> bool:
    """The one shared-room rule: a group chat whose session the whole room shares —
    marked so by the adapter, or every group when per-member sessions are off. A shared
    room's system prompt carries no USER.md and its history belongs to no one member."""
    return not msg.is_dm and (msg.shared_room or not per_user)


def key_for(msg: InboundMessage, *, per_user: bool = True) -> str:
    return session_key(
        msg.platform,
        msg.chat_type,
        msg.chat_id,
        msg.thread_id,
        msg.user_id,
        per_user=per_user and not msg.shared_room,
    )


def to_payload(msg: InboundMessage) -> dict[str, object]:
    """The JSON form stored in the durable inbox."""
    return {
        "platform": msg.platform,
        "chat_id": msg.chat_id,
        "user_id": msg.user_id,
        "message_id": msg.message_id,
        "text": msg.text,
        "user_name": msg.user_name,
        "chat_type": msg.chat_type.value,
        "thread_id": msg.thread_id,
        "mentioned": msg.mentioned,
        "attachments": [
            {"kind": a.kind, "name": a.name, "size": a.size, "ref": a.ref, "media_type": a.media_type}
            for a in msg.attachments
        ],
        "reply_to": msg.reply_to,
        "received_at": msg.received_at.isoformat(),
        "agent_context": msg.agent_context.value,
        "shared_room": msg.shared_room,
        "private": msg.private,
    }


def _attachments(value: object) -> tuple[Attachment, ...]:
    """The ``attachments`` of a stored payload: a JSON list of objects, as ``to_payload`` wrote it."""
    if not isinstance(value, list):
        return ()
    return tuple(
        Attachment(
            kind=str(a.get("kind", "")),
            name=str(a.get("name", "")),
            size=size if isinstance(size := a.get("size"), int) else None,
            ref=str(a.get("ref", "")),
            media_type=str(a.get("media_type", "")),
        )
        for a in value
        if isinstance(a, dict)
    )


def from_payload(data: dict[str, object]) -> InboundMessage:
    return InboundMessage(
        platform=str(data["platform"]),
        chat_id=str(data["chat_id"]),
        user_id=str(data["user_id"]),
        message_id=str(data["message_id"]),
        text=str(data.get("text") or ""),
        user_name=str(data.get("user_name") or ""),
        chat_type=ChatType(str(data.get("chat_type") or "dm")),
        thread_id=None if data.get("thread_id") is None else str(data["thread_id"]),
        mentioned=bool(data.get("mentioned")),
        attachments=_attachments(data.get("attachments")),
        reply_to=None if data.get("reply_to") is None else str(data["reply_to"]),
        received_at=datetime.fromisoformat(str(data["received_at"]))
        if data.get("received_at")
        else datetime.now(UTC),
        agent_context=AgentContext(str(data.get("agent_context") or "primary")),
        shared_room=bool(data.get("shared_room")),
        private=bool(data.get("private")),
    )


def chat_of(msg: InboundMessage) -> ChatRef:
    return ChatRef(msg.platform, msg.chat_id, msg.thread_id)
