"""Memory policies: what may be remembered, per person and per chat.

A person sets for themselves (``/memory policy``, ``mnemo users policy``):

* ``remember: on | off | ask`` — ``off``: nothing of their turns is stored in any
  memory layer; ``ask``: the model proposes, and only the person's confirmation
  (``/memory confirm``) writes;
* ``groups: private | shared`` — ``private`` (the default): their USER.md reaches no
  group prompt; ``shared``: in a group, their own profile goes into the newest user
  turn of requests made for *their* messages, fenced, never stored.

A chat (a group's admins, the bot's admins; ``mnemo chats policy``) sets:

* ``remember: on | off`` — ``off`` is an ephemeral chat: no curated writes, no facts,
  no provider sync, no skill writes or review from it;
* ``history: on | off`` — ``off``: a turn's messages are not kept for the next turn
  (the session ends after each reply and its messages are deleted).

What is not set falls back to the configured defaults (``memory.policy.*``). The
policy is read where a write happens (the memory tool, the provider context, the
skill tools and reviews), never only stated in a prompt.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from mnemo.memory.db import Database
from mnemo.memory.migrations import Migration


class Remember(StrEnum):
    ON = "on"
    OFF = "off"
    ASK = "ask"  # people only: a chat is on or off


class Groups(StrEnum):
    PRIVATE = "private"
    SHARED = "shared"


class History(StrEnum):
    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class PersonPolicy:
    """What a person set (None: the default applies)."""

    remember: Remember | None = None
    groups: Groups | None = None


@dataclass(frozen=True, slots=True)
class ChatPolicy:
    """What a chat's admins set (None: the default applies)."""

    remember: Remember | None = None
    history: History | None = None


@dataclass(frozen=True, slots=True)
class PolicyDefaults:
    """``memory.policy.*``: what applies where nobody set anything."""

    remember: Remember = Remember.ON
    groups: Groups = Groups.PRIVATE
    group_remember: Remember = Remember.ON
    history: History = History.ON


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The policy that holds for one person in one chat."""

    person_remember: Remember
    groups: Groups
    chat_remember: Remember
    history: History

    @property
    def remember(self) -> Remember:
        """What the writes of this turn may do: an ephemeral chat stores nothing,
        whatever the person chose."""
        return Remember.OFF if self.chat_remember is Remember.OFF else self.person_remember

    @property
    def stores(self) -> bool:
        """Writes go through without asking (``remember: on``)."""
        return self.remember is Remember.ON

    @classmethod
    def default(cls) -> EffectivePolicy:
        d = PolicyDefaults()
        return cls(d.remember, d.groups, d.group_remember, d.history)

    def lines(self) -> list[str]:
        return [
            f"remember: {self.person_remember} (yours)",
            f"groups: {self.groups} (your profile in groups)",
            f"this chat: remember {self.chat_remember}, history {self.history}",
        ]


def effective(
    defaults: PolicyDefaults, person: PersonPolicy, chat: ChatPolicy, *, is_group: bool
) -> EffectivePolicy:
    chat_default = defaults.group_remember if is_group else Remember.ON
    return EffectivePolicy(
        person_remember=person.remember or defaults.remember,
        groups=person.groups or defaults.groups,
        chat_remember=chat.remember or chat_default,
        history=chat.history or defaults.history,
    )


def chat_ref(platform: str, chat_id: str) -> str:
    """How a chat is named in policies (``mnemo chats policy telegram:-1001234``)."""
    return f"{platform}:{chat_id}"


class PolicyRepository(Protocol):
    """Stored policies (``StorageBackend.policies``). Read per turn by the gateway and
    per write by the tools; set by ``/memory policy``, the CLI and the dashboard."""

    async def person(self, who: str) -> PersonPolicy: ...

    async def chat(self, chat: str) -> ChatPolicy: ...

    async def set_person(
        self, who: str, *, remember: Remember | None = None, groups: Groups | None = None, by: str
    ) -> PersonPolicy:
        """Change what is given (None: keep); returns the person's whole policy."""
        ...

    async def set_chat(
        self, chat: str, *, remember: Remember | None = None, history: History | None = None, by: str
    ) -> ChatPolicy: ...


MEMORY_POLICIES = Migration(
    "0016_memory_policies",
    """
CREATE TABLE memory_policies (
    scope      TEXT NOT NULL CHECK (scope IN ('person', 'chat')),
    key        TEXT NOT NULL,
    remember   TEXT CHECK (remember IN ('on', 'off', 'ask')),
    groups     TEXT CHECK (groups IN ('private', 'shared')),
    history    TEXT CHECK (history IN ('on', 'off')),
    updated_at REAL NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
""",
)

# One statement for both backends (placeholders differ: ``{p}``).
UPSERT = (
    "INSERT INTO memory_policies(scope, key, remember, groups, history, updated_at, updated_by)"
    " VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (scope, key) DO UPDATE SET"
    " remember = coalesce(excluded.remember, memory_policies.remember),"
    " groups = coalesce(excluded.groups, memory_policies.groups),"
    " history = coalesce(excluded.history, memory_policies.history),"
    " updated_at = excluded.updated_at, updated_by = excluded.updated_by"
)
SELECT = "SELECT remember, groups, history FROM memory_policies WHERE scope = {p} AND key = {p}"


def person_of(row: tuple[str | None, str | None, str | None] | None) -> PersonPolicy:
    if row is None:
        return PersonPolicy()
    return PersonPolicy(Remember(row[0]) if row[0] else None, Groups(row[1]) if row[1] else None)


def chat_of(row: tuple[str | None, str | None, str | None] | None) -> ChatPolicy:
    if row is None:
        return ChatPolicy()
    return ChatPolicy(Remember(row[0]) if row[0] else None, History(row[2]) if row[2] else None)


def erase_within(conn: sqlite3.Connection, account: str, *, delete: bool) -> int:
    """A person's own policy goes with them (erasure)."""
    n = int(
        conn.execute(
            "SELECT COUNT(*) FROM memory_policies WHERE scope = 'person' AND key = ?", (account,)
        ).fetchone()[0]
    )
    if delete:
        conn.execute("DELETE FROM memory_policies WHERE scope = 'person' AND key = ?", (account,))
    return n


class SqlitePolicies:
    """``PolicyRepository`` in ``state.db``."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def _get(self, scope: str, key: str) -> tuple[str | None, str | None, str | None] | None:
        row = await self.db.read(lambda c: c.execute(SELECT.format(p="?"), (scope, key)).fetchone())
        return None if row is None else (row[0], row[1], row[2])

    async def _set(
        self, scope: str, key: str, values: tuple[str | None, str | None, str | None], by: str
    ) -> None:
        now = self.clock()
        await self.db.write(lambda c: c.execute(UPSERT.format(p="?"), (scope, key, *values, now, by)))

    async def person(self, who: str) -> PersonPolicy:
        return person_of(await self._get("person", who))

    async def chat(self, chat: str) -> ChatPolicy:
        return chat_of(await self._get("chat", chat))

    async def set_person(
        self, who: str, *, remember: Remember | None = None, groups: Groups | None = None, by: str
    ) -> PersonPolicy:
        await self._set("person", who, (_value(remember), _value(groups), None), by)
        return await self.person(who)

    async def set_chat(
        self, chat: str, *, remember: Remember | None = None, history: History | None = None, by: str
    ) -> ChatPolicy:
        if remember is Remember.ASK:
            raise ValueError("a chat's remember is on or off ('ask' is a person's choice)")
        await self._set("chat", chat, (_value(remember), None, _value(history)), by)
        return await self.chat(chat)


def _value(v: StrEnum | None) -> str | None:
    return None if v is None else v.value
