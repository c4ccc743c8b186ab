"""The session store's ports: what a storage backend of layer 2 (sessions, messages,
search) implements. ``SessionStore`` (``sessions.py``) and ``SessionSearch``
(``search.py``) are the SQLite implementations; every backend passes
``tests/contract/test_sessions.py``.

``SessionRepository`` is the core every conversation goes through; ``SessionStorage``
adds what the agent, the commands, the CLI and the dashboard use besides (rollover,
titles, usage, listing, chains), which both backends implement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

from mnemo.memory.curated import MemoryBlocks, Snapshot, Target, WriteResult
from mnemo.memory.identity import Identities
from mnemo.memory.journal import Provenance
from mnemo.memory.scope import UserRef
from mnemo.memory.search import IndexStatus, SearchResult
from mnemo.memory.sessions import MessageRow, NewMessage, SessionRow
from mnemo.memory.usage import Usage


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
        session_id: str | None = None,
    ) -> SessionRow:
        """A new session of ``chat_key`` with its frozen system prompt; ``session_id``
        a stable id an importer derives from its source's (default: a new one)."""
        ...

    async def get_session(self, session_id: str) -> SessionRow | None: ...

    async def active_session(self, chat_key: str, source: str = "chat") -> SessionRow | None:
        """The latest session of ``chat_key`` and ``source`` that has not ended."""
        ...

    async def end_session(self, session_id: str, reason: str) -> None:
        """The first reason wins; later calls change nothing."""
        ...

    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        usage: Usage | None = None,
        payer: str | None = None,
    ) -> list[int]:
        """All or nothing; the new message ids in order. With ``usage``, the request that
        produced them is counted in the same transaction, as ``add_usage`` does."""
        ...

    async def load_messages(self, session_id: str) -> list[MessageRow]:
        """The session's messages in order."""
        ...

    async def last_activity(self, session_id: str) -> datetime | None:
        """When the newest message of the session was stored (None: no messages)."""
        ...


class SessionStorage(SessionRepository, Protocol):
    """The whole session store of a backend (``SessionStore``, ``PgSessionStore``): what
    ``StorageBackend.sessions`` is. The usage counters of ``add_usage`` reach the budget
    ledger in the same transaction; the backend binds the ledger when it opens."""

    async def switch_session(
        self, old_id: str, new_id: str, *, pending_source: str, reason: str = "compression"
    ) -> bool:
        """The rollover's commit point: ``old_id`` ends and ``new_id`` becomes the chat's
        session; False when ``old_id`` had already ended (another rollover won)."""
        ...

    async def set_title(self, session_id: str, title: str | None) -> None: ...

    async def list_sessions(self, chat_key: str | None, limit: int = 20) -> list[SessionRow]:
        """Newest first; every chat when ``chat_key`` is None."""
        ...

    async def session_chain(self, session_id: str) -> list[SessionRow]:
        """The session and its ancestors (``parent_session_id``), oldest first."""
        ...

    async def add_usage(self, session_id: str, usage: Usage, *, payer: str | None = None) -> None: ...

    async def get_messages(self, ids: Sequence[int]) -> list[MessageRow]:
        """The messages of ``ids`` that exist, in the order asked for."""
        ...


class SearchRepository(Protocol):
    """Full-text search of past messages (the ``session_search`` tool, ``mnemo
    sessions search``). A query only ever sees the chats it names. Raises
    ``InvalidSearchQuery`` for an empty query."""

    async def search(
        self,
        query: str,
        *,
        chat_keys: Sequence[str],
        limit: int,
        exclude_session_ids: Collection[str] = (),
        around: tuple[int, int] = (1, 1),
    ) -> SearchResult:
        """``around``: (before, after) turns of each hit's own session to attach."""
        ...

    async def index_status(self) -> IndexStatus:
        """How complete the indexes are (the tool result, ``mnemo doctor``, ``/healthz``)."""
        ...


class CuratedDocument(Protocol):
    """One curated file (MEMORY.md or a USER.md), wherever it is kept: a file
    (``CuratedFile``) or a row (``memory/pg/curated.py``). Every method blocks; ``load``
    returns a frozen ``Snapshot`` that later writes never change; a write returns a
    ``WriteResult`` and never raises for bad input, a limit, the threat scan, an
    unreadable store or a conflict (the result says why nothing was saved). Every
    change is journaled with ``by`` (``memory/journal.py``; None: a system write)."""

    target: Target
    limit: int
    owner: str  # the journal's target: "shared" or the person's PLATFORM:ID

    @property
    def location(self) -> str: ...

    def load(self) -> Snapshot: ...

    def add(self, content: str, by: Provenance | None = None) -> WriteResult: ...

    def replace(self, old_text: str, content: str, by: Provenance | None = None) -> WriteResult: ...

    def remove(self, old_text: str, by: Provenance | None = None) -> WriteResult: ...


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
