"""Who may use something: ``admins``, ``users`` (everyone the bot answers) or a list of
people as ``PLATFORM:ID`` — the shape of ``mcp.servers.NAME.allowed`` and
``delegation.allowed``. Decided from the turn's speaker, never from the model."""

from __future__ import annotations

from mnemo.gateway.config import Audience
from mnemo.memory.scope import UserRef


def may_use(audience: Audience, speaker: UserRef | None, *, is_admin: bool) -> bool:
    if audience == "admins":
        return is_admin
    if speaker is None:
        return False
    return audience == "users" or str(speaker) in audience


def describe(audience: Audience) -> str:
    return audience if isinstance(audience, str) else ", ".join(audience) or "nobody"
