"""The session store's ports: what a storage backend of layer 2 (sessions, messages,
search) implements. ``SessionStore`` (``sessions.py``) and ``SessionSearch``
(``search.py``) are the SQLite implementations; every backend passes
``tests/contract/test_sessions.py``.

Only the core every conversation goes through is here; listing, chains, titles and
usage counters stay on the SQLite classes until a second backend needs them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

from mnemo.memory.curated import MemoryBlocks, Snapshot, Target, WriteResult
from mnemo.memory.identity import Identities
from mnemo.memory.scope import UserRef
from mnemo.memory.search import SearchResult
from mnemo.memory.sessions import MessageRow, NewMessage, SessionRow


class SessionRepository(Protocol):
    """Sessions and their messages. Called by the chat lanes and the agent (one turn
    at a time per session), compression rollovers and ``mnemo sessions import``.
    Raises ``StoreError`` (``StoreBusy``; an unknown parent or session)."""

    async def create_session(
        self,
        *,
        chat_key: str,
        platform: str,
        chat_id: str,
        thread_id: str | None,
        user_id: str | None,
        agent_context: str,
        source: str,
        model: str,
        system_prompt: str,
        parent_session_id: str | None = None,
        title: str | None = None,
        started_at: datetime | None = None,
    ) -> SessionRow:
        """A new session of ``chat_key`` with its frozen system prompt."""
        ...

    async def get_session(self, session_id: str) -> SessionRow | None: ...

    async def active_session(self, chat_key: str, source: str = "chat") -> SessionRow | None:
        """The latest session of ``chat_key`` and ``source`` that has not ended."""
        ...

    async def end_session(self, session_id: str, reason: str) -> None:
        """The first reason wins; later calls change nothing."""
        ...

    async def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        """All or nothing; the new message ids in order."""
        ...

    async def load_messages(self, session_id: str) -> list[MessageRow]:
        """The session's messages in order."""
        ...

    async def last_activity(self, session_id: str) -> datetime | None:
        """When the newest message of the session was stored (None: no messages)."""
        ...


class SearchRepository(Protocol):
    """Full-text search of past messages (the ``session_search`` tool, ``mnemo
    sessions search``). A query only ever sees the chats it names. Raises
    ``InvalidSearchQuery`` for an empty query."""

    async def search(
        self, query: str, *, chat_keys: Sequence[str], limit: int, exclude_session_ids: Collection[str] = ()
    ) -> SearchResult: ...


class CuratedDocument(Protocol):
    """One curated file (MEMORY.md or a USER.md), wherever it is kept: a file
    (``CuratedFile``) or a row (``memory/pg/curated.py``). Every method blocks; ``load``
    returns a frozen ``Snapshot`` that later writes never change; a write returns a
    ``WriteResult`` and never raises for bad input, a limit, the threat scan, an
    unreadable store or a conflict (the result says why nothing was saved)."""

    target: Target
    limit: int

    @property
    def location(self) -> str: ...

    def load(self) -> Snapshot: ...

    def add(self, content: str) -> WriteResult: ...

    def replace(self, old_text: str, content: str) -> WriteResult: ...

    def remove(self, old_text: str) -> WriteResult: ...


class CuratedRepository(Protocol):
    """The curated memory of one profile: ``MemoryFiles`` (files) or ``PgCuratedFiles``
    (rows). ``user`` is a person's USER.md (their canonical account's when
    ``identities`` links accounts), ``own`` exactly one account's."""

    memory_limit: int
    user_limit: int
    identities: Identities | None

    def shared(self) -> CuratedDocument: ...

    def user(self, ref: UserRef) -> CuratedDocument: ...

    def own(self, ref: UserRef) -> CuratedDocument: ...

    def copy_own(self, source: UserRef, dest: UserRef) -> None: ...

    def drop_own(self, ref: UserRef) -> None: ...

    def blocks(self, speaker: UserRef | None) -> MemoryBlocks: ...
