"""The typed write operations of external providers, and their job payload.

What an external provider is asked to store is one of a few operations, each a frozen
dataclass; nothing outside this module names an operation by a string::

    SyncTurn(user, assistant)        a finished turn              (manager.sync_turn)
    MirrorWrite(content)             the speaker's own built-in memory entry, added or
                                     replaced                     (manager.on_memory_write)
    SessionEnd(messages)             what was said in a session that ended
    PreCompress(messages)            what is about to be compressed away
    Remember(content, verb)          a provider tool's explicit write (sent at once)
    ForgetUser()                     erase everything of the scope's user (erasure)
    LegacyWrite(op, body)            a write queued by mnemo 0.2 or older, in its
                                     provider's own format

A ``ProviderWrite`` is one operation with its idempotency key and the speaker's scope;
``to_payload``/``from_payload`` are the only code that turns it into the JSON the job
queue keeps (``{"v": 2, "op": …, "key": …, "scope": …, <the operation's fields>}``) and
back. Payloads without ``"v"`` were written by an older mnemo: their fields are the
provider's own, so they decode to ``LegacyWrite`` and the provider sends them the way it
used to (``ExternalProvider.apply_legacy``). The ``op`` names are those of that older
format, so a payload's ``op`` means the same in both.

Conversations are kept as ``Said`` lines (user and assistant text only, no tool traffic),
the last ``CONVERSATION_MESSAGES``, each at most ``SAID_MAX_CHARS`` — as much as any of
our providers sends; each takes its own smaller share when it applies the write.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from mnemo.memory.provider import ProviderContext, message_text
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, safe_id

if TYPE_CHECKING:
    from mnemo.memory.memory_tool import MemoryWrite

PAYLOAD_VERSION = 2
CONVERSATION_MESSAGES = 30
SAID_MAX_CHARS = 8000


class WriteOp(StrEnum):
    """The ``op`` of a payload (the same names as before payloads were versioned)."""

    TURN = "turn"
    MEMORY = "memory"
    SESSION_END = "session_end"
    PRE_COMPRESS = "pre_compress"
    REMEMBER = "remember"
    FORGET_USER = "forget_user"


@dataclass(frozen=True, slots=True)
class Said:
    """One user or assistant message of a conversation, as text."""

    role: str  # "user" | "assistant"
    text: str


def said(messages: Sequence[Mapping[str, Any]]) -> tuple[Said, ...]:
    """The user and assistant messages that hold text (API-shaped messages in, tool
    traffic and empty messages out), the last ``CONVERSATION_MESSAGES`` of them."""
    lines = [
        Said(str(m["role"]), text[:SAID_MAX_CHARS])
        for m in messages
        if m.get("role") in ("user", "assistant") and (text := message_text(m.get("content"))).strip()
    ]
    return tuple(lines[-CONVERSATION_MESSAGES:])


@dataclass(frozen=True, slots=True)
class SyncTurn:
    user: str
    assistant: str
    op: ClassVar[WriteOp] = WriteOp.TURN

    def fields(self) -> dict[str, Any]:
        return {"user": self.user, "assistant": self.assistant}


@dataclass(frozen=True, slots=True)
class MirrorWrite:
    content: str
    op: ClassVar[WriteOp] = WriteOp.MEMORY

    @classmethod
    def of(cls, write: MemoryWrite, ctx: ProviderContext) -> MirrorWrite | None:
        """The mirror of a built-in write, or None: removals stay with the built-in files,
        and another user's entry is never written to this speaker's scope."""
        if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
            return None
        return cls(write.content)

    def fields(self) -> dict[str, Any]:
        return {"content": self.content}


@dataclass(frozen=True, slots=True)
class SessionEnd:
    messages: tuple[Said, ...]
    op: ClassVar[WriteOp] = WriteOp.SESSION_END

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> SessionEnd | None:
        """What was said in ``messages`` (API-shaped), or None when nothing was."""
        lines = said(messages)
        return cls(lines) if lines else None

    def fields(self) -> dict[str, Any]:
        return {"messages": [{"role": m.role, "text": m.text} for m in self.messages]}


@dataclass(frozen=True, slots=True)
class PreCompress:
    messages: tuple[Said, ...]
    op: ClassVar[WriteOp] = WriteOp.PRE_COMPRESS

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> PreCompress | None:
        """What was said in ``messages`` (API-shaped), or None when nothing was."""
        lines = said(messages)
        return cls(lines) if lines else None

    def fields(self) -> dict[str, Any]:
        return {"messages": [{"role": m.role, "text": m.text} for m in self.messages]}


@dataclass(frozen=True, slots=True)
class Remember:
    content: str
    verb: str = "remember"  # the tool's own word ("conclude", "retain"): its key and label
    op: ClassVar[WriteOp] = WriteOp.REMEMBER

    def fields(self) -> dict[str, Any]:
        return {"content": self.content, "verb": self.verb}


@dataclass(frozen=True, slots=True)
class ForgetUser:
    op: ClassVar[WriteOp] = WriteOp.FORGET_USER

    def fields(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True, slots=True)
class LegacyWrite:
    """A payload of mnemo ≤ 0.2: ``body`` holds the fields its provider prepared."""

    kind: WriteOp
    body: Mapping[str, Any]

    @property
    def op(self) -> WriteOp:
        return self.kind

    def fields(self) -> dict[str, Any]:
        return dict(self.body)


Operation: TypeAlias = SyncTurn | MirrorWrite | SessionEnd | PreCompress | Remember | ForgetUser | LegacyWrite
Conversation: TypeAlias = SessionEnd | PreCompress


def write_key(label: str, ctx: ProviderContext, *parts: str) -> str:
    """The idempotency key of one write: the same turn gives the same key."""
    h = hashlib.sha256()
    for part in (label, ctx.session_id, str(ctx.user or ""), *parts):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return f"{label}-{h.hexdigest()[:32]}"


def label(operation: Operation) -> str:
    """How a write names itself to the provider (``mnemo_op`` metadata, tags, keys)."""
    return operation.verb if isinstance(operation, Remember) else operation.op.value


@dataclass(frozen=True, slots=True)
class ProviderWrite:
    """One operation for one provider: what, its idempotency key, and whose scope."""

    operation: Operation
    key: str
    scope: ProviderScope

    @classmethod
    def of(cls, operation: Operation, ctx: ProviderContext, scope: ProviderScope) -> ProviderWrite:
        """``operation`` in ``scope``, keyed by the turn and the operation's content."""
        content = json.dumps(operation.fields(), sort_keys=True, ensure_ascii=False)
        return cls(operation, write_key(label(operation), ctx, content), scope)

    @classmethod
    def forget(cls, user_id: str) -> ProviderWrite:
        """The erasure of ``user_id`` (``PLATFORM:ID``): one key per user, so an erasure
        already waiting is not queued twice; its scope names only the user."""
        scope = ProviderScope(safe_id(user_id), "forget", DEFAULT_AGENT_ID)
        digest = hashlib.sha256(scope.user_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return cls(ForgetUser(), f"{WriteOp.FORGET_USER.value}-{digest}", scope)

    @property
    def session_id(self) -> str:
        """The mnemo session the write comes from ('' for an erasure: none)."""
        return "" if isinstance(self.operation, ForgetUser) else self.scope.session_id

    def to_payload(self) -> dict[str, Any]:
        head: dict[str, Any] = {"op": self.operation.op.value, "key": self.key, "scope": self.scope.as_dict()}
        if not isinstance(self.operation, LegacyWrite):
            head["v"] = PAYLOAD_VERSION
        return {**head, **self.operation.fields()}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> ProviderWrite:
        """Decode a stored payload; ``ValueError`` names what is wrong with it."""
        try:
            op = WriteOp(str(payload.get("op")))
        except ValueError:
            raise ValueError(f"unknown provider write operation {payload.get('op')!r}") from None
        key = payload.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError(f"{op.value}: the payload has no key")
        if op is WriteOp.FORGET_USER:
            return cls(ForgetUser(), key, _forget_scope(payload))
        try:
            scope = ProviderScope.from_dict(payload["scope"])
            if payload.get("v") != PAYLOAD_VERSION:
                body = {k: v for k, v in payload.items() if k not in ("op", "key", "scope")}
                return cls(LegacyWrite(op, body), key, scope)
            return cls(_operation(op, payload), key, scope)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{op.value}: a malformed payload ({type(e).__name__}: {e})") from None


def _operation(op: WriteOp, p: Mapping[str, Any]) -> Operation:
    match op:
        case WriteOp.TURN:
            return SyncTurn(str(p["user"]), str(p["assistant"]))
        case WriteOp.MEMORY:
            return MirrorWrite(str(p["content"]))
        case WriteOp.REMEMBER:
            return Remember(str(p["content"]), str(p.get("verb") or "remember"))
        case WriteOp.SESSION_END:
            return SessionEnd(_said(p["messages"]))
        case WriteOp.PRE_COMPRESS:
            return PreCompress(_said(p["messages"]))
    raise ValueError(f"unknown provider write operation {op.value!r}")


def _said(items: Sequence[Mapping[str, Any]]) -> tuple[Said, ...]:
    return tuple(Said(str(m["role"]), str(m["text"])) for m in items)


def _forget_scope(payload: Mapping[str, Any]) -> ProviderScope:
    """Only the scope's ``user_id`` matters (older payloads named it at the top level)."""
    scope = payload.get("scope")
    user_id = scope.get("user_id") if isinstance(scope, Mapping) else payload.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("forget_user: the payload names no user_id")
    return ProviderScope(user_id, "forget", DEFAULT_AGENT_ID)
