"""The slash-command contract: what a command is and what its handler gets.

Sub-systems add their own commands (``/usage`` in ``budgets``, ``/forget me`` and
``/link`` in ``people``, ``/cron``, ``/skills``) to the one registry the inbound
pipeline dispatches from (``gateway/inbound/commands.py``). They depend on this module
only, never on the pipeline: it imports nothing of the gateway's sub-packages, so no
sub-package reaches another through the command types.

A handler gets one ``CommandCall`` — the message, its arguments and the chat it was
typed in (``ChatControl``, a narrow port the pipeline implements) — and returns the
text of the reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mnemo.gateway.events import InboundMessage
from mnemo.gateway.ports import CommandInfo

if TYPE_CHECKING:
    from mnemo.memory.sessions import SessionRow


class ChatControl(Protocol):
    """What a command may do to the chat it was typed in. The pipeline implements it
    (``gateway/inbound/chats.py``) and passes it with every call."""

    def session_key(self, msg: InboundMessage) -> str: ...

    def is_admin(self, msg: InboundMessage) -> bool: ...

    async def reset(self, msg: InboundMessage) -> SessionRow | None: ...

    def stop_turn(self, key: str) -> bool: ...

    def queue_state(self, key: str) -> tuple[int, bool]:
        """(messages queued, a turn is running) for one session key."""
        ...


@dataclass(frozen=True, slots=True)
class CommandCall:
    msg: InboundMessage
    args: str
    chats: ChatControl

    @property
    def key(self) -> str:
        return self.chats.session_key(self.msg)

    @property
    def admin(self) -> bool:
        return self.chats.is_admin(self.msg)


@dataclass(frozen=True, slots=True)
class Unrecorded:
    """A command answer that leaves no row behind: sent once, straight to the platform,
    never through the outbox, and the answered message's inbox row is not touched —
    the command removed it itself. ``/forget me CODE``'s receipt: the erasure deletes
    the person's rows, that message's included, and nothing written afterwards may
    name them again. Best effort, like any direct send: a receipt that cannot be
    delivered is not retried."""

    text: str


Handler = Callable[[CommandCall], Awaitable[str | Unrecorded]]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    summary: str
    handler: Handler
    admin_only: bool = False
    aliases: tuple[str, ...] = ()
    takes_args: bool = False  # platforms with typed commands offer one text option

    @property
    def info(self) -> CommandInfo:
        return CommandInfo(self.name, self.summary, takes_args=self.takes_args, admin_only=self.admin_only)


def parse_command(text: str) -> tuple[str, str] | None:
    """``/name@bot args`` → ("name", "args"); None if the text is not a slash command
    (``/usr/bin`` and a lone ``/`` are text)."""
    stripped = text.strip()
    if not stripped.startswith("/") or len(stripped) < 2:
        return None
    head, _, rest = stripped[1:].partition(" ")
    head, _, rest2 = head.partition("\n")
    name = head.split("@", 1)[0].lower()
    if not name or not name.replace("_", "").isalnum() or not name.isascii():
        return None
    return name, " ".join(p for p in (rest2.strip(), rest.strip()) if p)
