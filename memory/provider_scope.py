"""Identity and scope mapping for external providers — the one place it is decided.

* mnemo's user (``platform:id``, ``ProviderContext.user``: the turn's speaker, also in
  a shared-room group; ``ProviderContext.person`` when their accounts are linked) → the
  provider's per-user scope (Honcho peer, Mem0 ``user_id``,
  Hindsight bank).
* the chat's session → the provider's session/thread/run.
* the bot → its own peer/agent id (a provider setting, default ``mnemo``).

A group turn is written to and recalled from the speaker's scope only; a turn without
a speaker (cron) has no scope, and providers then neither write nor recall. Every
provider client call takes a ``ProviderScope`` as a required argument, never a default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mnemo.memory.provider import ProviderContext

DEFAULT_AGENT_ID = "mnemo"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@-]")


def safe_id(value: str) -> str:
    """A form every provider accepts as an id (letters, digits, ``_.:@-``)."""
    return _UNSAFE.sub("_", value)[:128]


_safe = safe_id


@dataclass(frozen=True, slots=True)
class ProviderScope:
    user_id: str  # the speaker, e.g. "telegram:42"
    session_id: str  # mnemo session id → provider session / run
    agent_id: str  # the bot's own peer / agent id

    def as_dict(self) -> dict[str, str]:
        return {"user_id": self.user_id, "session_id": self.session_id, "agent_id": self.agent_id}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProviderScope:
        return cls(str(data["user_id"]), str(data["session_id"]), str(data["agent_id"]))


def scope_for(ctx: ProviderContext, agent_id: str = DEFAULT_AGENT_ID) -> ProviderScope | None:
    """The speaker's scope for this call — the person's, when the speaker's accounts are
    linked (``ctx.person``: one scope on every platform); None when nobody speaks."""
    owner = ctx.owner
    if owner is None:
        return None
    return ProviderScope(_safe(str(owner)), _safe(ctx.session_id), _safe(agent_id or DEFAULT_AGENT_ID))
