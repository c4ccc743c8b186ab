"""ByteRoverProvider: ByteRover's memory service over a small aiohttp client.

Scope (``memory.provider_scope``): one ByteRover space (``team_id`` / ``space_id``
settings) holds a folder per user, ``<root>/users/<user_id>/`` of its context tree
(``root`` defaults to ``mnemo``); every retrieve names the speaker's folder in
``node_keys`` and answers from other folders are dropped, every write adds files only
there. The session header carries the mnemo session. A turn without a speaker neither
writes nor recalls. Settings: ``api_key`` (or ``BYTEROVER_API_KEY``), ``base_url`` (or
``BYTEROVER_BASE_URL``).

Writes are durable (``memory.durable``) and idempotent: each is one file whose path is
made of its write key (``…/turns/<key>.md``, ``…/facts/<key>.md``,
``…/sessions/<key>.md``), so a write sent again lands on the same path. ``forget_user``
deletes every file the user's folder retrieves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider
from mnemo.memory.provider import Availability
from mnemo.memory.provider_config import ConfigField
from mnemo.memory.provider_scope import ProviderScope
from mnemo.memory.provider_tools import SharedTools, api_key_field, setting, timeout_field, top_k_field
from mnemo.memory.writes import (
    LegacyWrite,
    MirrorWrite,
    PreCompress,
    ProviderWrite,
    Remember,
    SessionEnd,
    SyncTurn,
    label,
)
from mnemo.providers.byterover.client import DEFAULT_URL, ByteRoverClient, Memory, user_folder

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20
FORGET_ROUNDS = 50  # retrieve → delete rounds before forget gives up (and is retried)


def _title(text: str) -> str:
    line = " ".join(text.split())
    return (line[:77] + "…") if len(line) > 80 else (line or "memory")


class ByteRoverProvider(ExternalProvider[ByteRoverClient]):
    name = "byterover"
    label = "ByteRover"
    description = "ByteRover memory service (context tree over HTTP), a folder per user"
    shared_tools = SharedTools.standard(
        "byterover", "ByteRover", "The facts ByteRover keeps about the user you are talking to."
    )

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("ByteRover API key (or BYTEROVER_API_KEY)"),
            ConfigField("base_url", f"memory service URL (or BYTEROVER_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("team_id", "ByteRover team (organisation) id", required=True),
            ConfigField("space_id", "ByteRover space (project) id the memories live in", required=True),
            ConfigField("branch", "branch of the space's context tree", default="main"),
            ConfigField("root", "folder of the context tree that holds mnemo's users", default="mnemo"),
            top_k_field(),
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        if not setting(config, "api_key", "BYTEROVER_API_KEY"):
            return self.key_missing("BYTEROVER_API_KEY")
        missing = [k for k in ("team_id", "space_id") if not config.get(k)]
        if missing:
            return Availability(
                False, f"set {' and '.join(missing)} (mnemo providers setup byterover --set {missing[0]}=…)"
            )
        return Availability(True)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        # every call opens and closes its own HTTP session: nothing to shut down
        self._client = ByteRoverClient(
            setting(config, "base_url", "BYTEROVER_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "BYTEROVER_API_KEY"),
            str(config.get("team_id") or ""),
            str(config.get("space_id") or ""),
            str(config.get("branch") or "main"),
            self.timeout_s,
        )

    # --- folders and calls --------------------------------------------------------------
    def _folder(self, scope: ProviderScope, sub: str = "") -> str:
        base = user_folder(str(self._config.get("root") or "mnemo"), scope)
        return f"{base}/{sub}" if sub else base

    def _retrieve(self, query: str, scope: ProviderScope, folders: Sequence[str], limit: int) -> list[Memory]:
        return self.call(
            "retrieve", lambda: self.client.retrieve(query[:MAX_TEXT], scope, folders, limit=limit)
        )

    def _commit(self, changes: Sequence[Mapping[str, Any]], scope: ProviderScope) -> None:
        self.call("commit", lambda: self.client.commit(changes, scope))

    # --- recall and tools -----------------------------------------------------------------
    def recall(self, query: str, scope: ProviderScope) -> list[str]:
        return [m.content.strip() for m in self._retrieve(query, scope, [self._folder(scope)], self.top_k)]

    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        return [m.content for m in self._retrieve(query, scope, [self._folder(scope)], limit)]

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        facts = self._retrieve("what is known about this user", scope, [self._folder(scope, "facts")], 50)
        return {"facts": [m.content for m in facts]}

    # --- writes -------------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                content = f"User: {user[:MAX_TEXT]}\nAssistant: {assistant[:MAX_TEXT]}"
                folder, title = "turns", _title(user)
            case MirrorWrite(content=text) | Remember(content=text):
                content, folder, title = text[:MAX_TEXT], "facts", _title(text)
            case SessionEnd(messages=said) | PreCompress(messages=said):
                content = "\n".join(f"{m.role}: {m.text[:MAX_TEXT]}" for m in said[-SESSION_END_MESSAGES:])
                kind = (
                    "Session summary"
                    if isinstance(write.operation, SessionEnd)
                    else "Pre-compression context"
                )
                folder, title = "sessions", f"{kind} ({write.scope.session_id})"
            case _:
                raise ProviderError(f"byterover: cannot send {label(write.operation)}")
        self._add(write, folder, title, content)

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        body = operation.body
        self._add(write, str(body["folder"]), str(body["title"]), str(body["content"]))

    def _add(self, write: ProviderWrite, folder: str, title: str, content: str) -> None:
        change = {
            "operation": "add",
            "path": f"{self._folder(write.scope, folder)}/{write.key}.md",
            "title": title,
            "content": content,
            "tags": ["mnemo", label(write.operation)],
        }
        self._commit([change], write.scope)

    def forget(self, scope: ProviderScope) -> None:
        """Delete every file of the user's folder (retrieve, delete, until none is left)."""
        folder = self._folder(scope)
        for _ in range(FORGET_ROUNDS):
            found = self._retrieve("*", scope, [folder], 50)
            if not found:
                return
            deletes = [
                {"operation": "delete", "path": m.path, "title": m.title, "content": "", "tags": []}
                for m in found
            ]
            self._commit(deletes, scope)
        raise ProviderError(f"byterover: {folder} still holds memories after {FORGET_ROUNDS} delete rounds")
