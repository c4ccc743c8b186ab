"""The value objects that cross between adapters and the gateway, and the session key.

Adapters turn platform events into ``InboundMessage`` and deliver ``OutboundMessage``;
raw SDK objects never cross into the core. ``session_key`` is the one place a chat's
session key is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from memory.scope import AgentContext, UserRef, validate_id


class ChatType(StrEnum):
    DM = "dm"
    GROUP = "group"


@dataclass(frozen=True, slots=True)
class Attachment:
    kind: str  # "photo", "document", "voice", ...
    name: str = ""
    size: int | None = None


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

    def __post_init__(self) -> None:
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


def key_for(msg: InboundMessage, *, per_user: bool = True) -> str:
    return session_key(
        msg.platform,
        msg.chat_type,
        msg.chat_id,
        msg.thread_id,
        msg.user_id,
        per_user=per_user and not msg.shared_room,
    )
