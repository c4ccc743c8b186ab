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
