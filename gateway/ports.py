"""The ports between the gateway and the outside world.

``Adapter`` is implemented by every platform module in ``adapters/``. The gateway calls:

* ``start(sink, commands)`` once, from ``mnemo run``'s lifecycle stack, after the store,
  the LLM client and the worker are up. The adapter begins receiving and calls
  ``await sink(InboundMessage)`` for each supported event (unsupported events are
  dropped with a debug log). ``commands`` are the slash commands of the one command
  registry, for the platform's menu (Telegram's command list, Discord's application
  commands). ``start`` returns once the adapter is receiving. It raises ``StartupError``
  for a configuration error (exit 2) and ``PlatformError`` when the platform cannot be
  reached; then ``gateway.supervisor`` calls it again after a backoff, so a failed
  ``start`` must leave nothing open behind it.
* ``send(OutboundMessage)`` from the delivery loop, one logical reply at a time; the
  adapter splits it at ``max_message_len``, formats it, and returns the platform ids of
  the messages it sent. It raises ``gateway.errors.PlatformError`` subclasses:
  ``PlatformRateLimited`` / ``PlatformUnavailable`` (the outbox retries later) or
  ``Forbidden`` (the outbox gives up on that reply and logs it).
* ``typing(chat)`` as an async context manager around a turn (a no-op where the
  platform has no typing indicator, see ``supports_typing``).
* ``stop()`` once at shutdown; idempotent.

Capabilities are plain attributes, never probed.

``NotesUnreadable`` is an optional port for adapters that answer a message with nothing
readable in it (a sticker) with a note rather than dropping it: the note goes through
the gateway, so that it answers only people allowed to talk to the bot.

``ReportsReachability`` is an optional second port for adapters whose chats can be
unreachable for a while although the adapter itself is up (the web chat: a reply for a
closed page). Their ``send`` raises ``PlatformUnavailable`` for such a chat, so the
outbox backs off; when the chat comes back (the page reconnects) the adapter calls the
hook the gateway registered in ``Gateway.add_adapter``, which makes that chat's waiting
replies due at once and wakes delivery — otherwise a reply could sit out a backoff of
minutes after the page is open again.

``Leadership`` is how an adapter does something on one replica only (Telegram's long
polling: one ``getUpdates`` per bot). ``acquire(name)`` waits until this process leads
``name`` and returns a ``LeaderLease``; ``lost()`` returns when the lease is gone (the
database connection that held it broke), then the adapter stops leading and acquires
again. On PostgreSQL it is an advisory lock (``storage_pg/heartbeats.py``); on SQLite one
process owns the profile and ``SoleLeadership`` grants every name at once. An adapter that
needs it implements ``UsesLeadership``; ``open_app`` hands it the backend's before ``start``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mnemo.gateway.events import Attachment, ChatRef, InboundMessage, OutboundMessage, Submitted

InboundSink = Callable[[InboundMessage], Awaitable[Submitted]]
ChatReachable = Callable[[ChatRef], Awaitable[None]]
UnreadableHook = Callable[[InboundMessage, str], Awaitable[Submitted]]


@dataclass(frozen=True, slots=True)
class CommandInfo:
    """A slash command as a platform menu shows it."""

    name: str
    summary: str
    takes_args: bool = False  # platforms with typed commands offer one text option
    admin_only: bool = False


@runtime_checkable
class Adapter(Protocol):
    name: str  # the platform name used in session keys: "telegram", "discord", "web", "cli"
    max_message_len: int
    supports_typing: bool
    # None: the gateway's debounce window; 0: every message is its own turn.
    debounce_s: float | None

    @property
    def connected(self) -> bool: ...

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> list[str]: ...

    def typing(self, chat: ChatRef) -> AbstractAsyncContextManager[None]: ...


@runtime_checkable
class ReportsReachability(Protocol):
    def on_chat_reachable(self, hook: ChatReachable) -> None:
        """Called once by the gateway, before ``start``; the adapter awaits ``hook(chat)``
        whenever a chat it could not deliver to becomes reachable again."""
        ...


@runtime_checkable
class NotesUnreadable(Protocol):
    def on_unreadable(self, hook: UnreadableHook) -> None:
        """Called once by the gateway, before ``start``. The adapter awaits ``hook(msg,
        note)`` for a message addressed to the bot with nothing readable in it (a
        sticker): ``msg`` describes it (no text, the unreadable attachment), ``note`` is
        the answer. The gateway sends ``note`` only when ``msg`` passes the same
        authorization as every message and stores nothing; the hook returns
        ``Submitted.ACCEPTED`` when the note was sent."""
        ...


@runtime_checkable
class StreamsReplies(Protocol):
    """Optional port: show a reply while it is generated (``gateway/delivery/live.py``).

    ``stream_open`` posts a new message showing ``text`` as plain text and returns its
    platform id; ``stream_edit`` replaces that message's text. Both raise
    ``PlatformRateLimited`` on a rate limit — never sleeping — and other
    ``PlatformError``s as ``send`` does. The final reply still goes through ``send``
    with ``OutboundMessage.stream_message_id`` set. ``stream_interval_s`` is the
    shortest gap between two edits of one message the platform tolerates."""

    stream_interval_s: float

    async def stream_open(self, chat: ChatRef, text: str, *, reply_to: str | None) -> str: ...

    async def stream_edit(self, chat: ChatRef, message_id: str, text: str) -> None: ...


@runtime_checkable
class FetchesMedia(Protocol):
    async def fetch_media(self, attachment: Attachment) -> bytes:
        """The attachment's bytes, downloaded through the platform's API (at most
        ``media.MAX_DOWNLOAD_BYTES``); raises on a failed or timed-out download."""
        ...


class LeaderLease(Protocol):
    name: str

    async def lost(self) -> None:
        """Returns when this process no longer leads ``name``."""
        ...

    async def release(self) -> None: ...


@runtime_checkable
class Leadership(Protocol):
    async def acquire(self, name: str) -> LeaderLease:
        """Wait until this process leads ``name``."""
        ...


@runtime_checkable
class UsesLeadership(Protocol):
    def use_leadership(self, leadership: Leadership) -> None:
        """Called once by ``open_app``, before ``start``."""
        ...


class _SoleLease:
    def __init__(self, name: str) -> None:
        self.name = name
        self._released = asyncio.Event()

    async def lost(self) -> None:
        await self._released.wait()

    async def release(self) -> None:
        self._released.set()


class SoleLeadership:
    """``Leadership`` of a process that is the only one on its store (SQLite)."""

    async def acquire(self, name: str) -> LeaderLease:
        return _SoleLease(name)
