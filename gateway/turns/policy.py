"""The memory policy that holds for one message, as every write point reads it.

``MemoryPolicies`` joins the stored policies (``StorageBackend.policies``, per person and
per chat) with the configured defaults (``memory.policy.*``) for the person behind an
account (linked accounts share one policy, kept under their canonical account) in one
chat. It is read fresh where a write happens — the memory tool on every call, a turn's
context when it starts (providers, skills, the group prompt rule), the provider hooks
and the skill review when their job runs — so a policy set in one chat or replica holds
at the next write.
"""

from __future__ import annotations

from mnemo.gateway.config import MemoryPolicySettings
from mnemo.memory.identity import Identities
from mnemo.memory.policy import (
    EffectivePolicy,
    Groups,
    History,
    PersonPolicy,
    PolicyDefaults,
    PolicyRepository,
    Remember,
    chat_ref,
    effective,
)
from mnemo.memory.scope import UserRef


def defaults_of(settings: MemoryPolicySettings) -> PolicyDefaults:
    return PolicyDefaults(
        Remember(settings.remember),
        Groups(settings.groups),
        Remember(settings.group_remember),
        History(settings.history),
    )


class MemoryPolicies:
    def __init__(
        self, repo: PolicyRepository, defaults: PolicyDefaults, identities: Identities | None = None
    ) -> None:
        self.repo = repo
        self.defaults = defaults
        self.identities = identities

    def person(self, user: UserRef) -> str:
        """Whose policy an account follows: its person's (the canonical account)."""
        return str(self.identities.canonical(user) if self.identities is not None else user)

    async def holding(
        self, *, platform: str, chat_id: str, user: UserRef | None, is_group: bool
    ) -> EffectivePolicy:
        person = await self.repo.person(self.person(user)) if user is not None else None
        chat = await self.repo.chat(chat_ref(platform, chat_id))
        return effective(self.defaults, person or PersonPolicy(), chat, is_group=is_group)
