"""Session lifecycle events forwarded to the memory providers (layer 4).

Housekeeping knows sessions (rows); providers know a frozen ``ProviderContext`` and
API-shaped messages. This adapter turns one into the other for the three hooks that
happen outside a turn: a session ending (``/reset``, idle, daily), a compression
rollover switching sessions, and the checkpoint before a compression (fail-closed for
providers that promise durable capture, ``checkpoint_version = 2``). The memory policy
of the session's chat and person is read when the hook runs: an ephemeral chat, or a
person with remember off or ask, sends the providers nothing (``ProviderContext.remember``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mnemo.gateway.turns.history import to_api_messages
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.memory.manager import MemoryManager
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import MessageRow, SessionRow


class ProviderSessionHooks:
    def __init__(self, manager: MemoryManager, home: Path, policies: MemoryPolicies | None = None) -> None:
        self.manager = manager
        self.home = home
        self.policies = policies

    async def context(self, session: SessionRow) -> ProviderContext:
        user = UserRef(session.platform, session.user_id) if session.user_id else None
        remember = True
        if self.policies is not None:
            group = session.chat_key.split(":")[1:2] == ["group"]
            policy = await self.policies.holding(
                platform=session.platform, chat_id=session.chat_id, user=user, is_group=group
            )
            remember = policy.stores
        return ProviderContext(
            session_id=session.id,
            chat_key=session.chat_key,
            platform=session.platform,
            user=user,
            agent_context=AgentContext(session.agent_context),
            home=self.home,
            remember=remember,
        )

    async def session_end(self, session: SessionRow, rows: Sequence[MessageRow]) -> None:
        await self.manager.on_session_end(to_api_messages(rows), await self.context(session))

    async def session_switch(self, old: SessionRow, new: SessionRow) -> None:
        await self.manager.on_session_switch(old.id, await self.context(new))

    async def pre_compress(self, session: SessionRow, rows: Sequence[MessageRow]) -> bool:
        return await self.manager.pre_compress(to_api_messages(rows), await self.context(session))
