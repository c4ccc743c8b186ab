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

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.durable import FORGET_USER, DurableWrites, ProviderHealth, forget_scope, write_key
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import (
    Availability,
    MemoryProvider,
    ProviderContext,
    Recall,
    ToolSchema,
    message_text,
)
from mnemo.memory.provider_config import ConfigField, ConfigKind, provider_dir
from mnemo.memory.provider_scope import ProviderScope, scope_for
from mnemo.memory.provider_tools import ProviderState, profile_tool, remember_tool, search_tool, setting
from mnemo.providers.byterover.client import DEFAULT_URL, ByteRoverClient, Memory, user_folder

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20
FORGET_ROUNDS = 50  # retrieve → delete rounds before forget_user gives up (and is retried)

PROFILE = profile_tool("byterover", "The facts ByteRover keeps about the user you are talking to.")
SEARCH = search_tool("byterover", "ByteRover")
REMEMBER = remember_tool("byterover", "ByteRover")


def _title(text: str) -> str:
    line = " ".join(text.split())
    return (line[:77] + "…") if len(line) > 80 else (line or "memory")


class ByteRoverProvider(ProviderState, DurableWrites, MemoryProvider):
    name = "byterover"
    label = "ByteRover"
    description = "ByteRover memory service (context tree over HTTP), a folder per user"

    _client: ByteRoverClient | None

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField("api_key", "ByteRover API key (or BYTEROVER_API_KEY)", secret=True),
            ConfigField("base_url", f"memory service URL (or BYTEROVER_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("team_id", "ByteRover team (organisation) id", required=True),
            ConfigField("space_id", "ByteRover space (project) id the memories live in", required=True),
            ConfigField("branch", "branch of the space's context tree", default="main"),
            ConfigField("root", "folder of the context tree that holds mnemo's users", default="mnemo"),
            ConfigField("top_k", "memories recalled per turn", ConfigKind.INTEGER, 5, minimum=1, maximum=50),
            ConfigField(
                "timeout_s",
                "HTTP timeout per request (seconds)",
                ConfigKind.NUMBER,
                10.0,
                minimum=0.1,
                maximum=300,
            ),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        if not setting(config, "api_key", "BYTEROVER_API_KEY"):
            return Availability(
                False, "set api_key (mnemo providers setup byterover --set api_key=…) or BYTEROVER_API_KEY"
            )
        missing = [k for k in ("team_id", "space_id") if not config.get(k)]
        if missing:
            return Availability(
                False, f"set {' and '.join(missing)} (mnemo providers setup byterover --set {missing[0]}=…)"
            )
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        self._client = ByteRoverClient(
            setting(config, "base_url", "BYTEROVER_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "BYTEROVER_API_KEY"),
            str(config.get("team_id") or ""),
            str(config.get("space_id") or ""),
            str(config.get("branch") or "main"),
            float(config.get("timeout_s", 10.0)),
        )

    def shutdown(self) -> None:
        pass  # every call opens and closes its own HTTP session

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # memories live in the ByteRover space

    # --- scope and calls ----------------------------------------------------------------
    def _root(self) -> str:
        return str(self._config.get("root") or "mnemo")

    def _folder(self, scope: ProviderScope, sub: str = "") -> str:
        base = user_folder(self._root(), scope)
        return f"{base}/{sub}" if sub else base

    def _call(self, fn: Callable[[ByteRoverClient], Any]) -> Any:
        if self._client is None:
            raise RuntimeError("byterover provider is not initialised")
        try:
            result = fn(self._client)
        except Exception as e:  # RetryLater too: the queue retries, health shows why
            self.health.failed(e)
            raise
        self.health.ok()
        return result

    def _retrieve(self, query: str, scope: ProviderScope, folders: Sequence[str], limit: int) -> list[Memory]:
        return self._call(lambda c: c.retrieve(query[:MAX_TEXT], scope, folders, limit=limit))

    # --- per turn ---------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = scope_for(ctx)
        if scope is None:
            return Recall("")
        found = self._retrieve(query, scope, [self._folder(scope)], int(self._config.get("top_k", 5)))
        if not found:
            return Recall("")
        lines = [f"- {m.content.strip()}" for m in found]
        return Recall("ByteRover remembers about this user:\n" + "\n".join(lines), len(found))

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = scope_for(ctx)
        if scope is None:
            return None
        if op == "turn":
            content = f"User: {str(data['user'])[:MAX_TEXT]}\nAssistant: {str(data['assistant'])[:MAX_TEXT]}"
            folder, title = "turns", _title(str(data["user"]))
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            content, folder, title = write.content[:MAX_TEXT], "facts", _title(write.content)
        elif op in ("session_end", "pre_compress"):
            lines = [
                f"{m['role']}: {message_text(m.get('content'))[:MAX_TEXT]}"
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ][-SESSION_END_MESSAGES:]
            if not lines:
                return None
            label = "Session summary" if op == "session_end" else "Pre-compression context"
            content, folder, title = "\n".join(lines), "sessions", f"{label} ({ctx.session_id})"
        else:
            return None
        key = write_key(op, ctx, content)
        return {
            "op": op,
            "key": key,
            "scope": scope.as_dict(),
            "folder": folder,
            "title": title,
            "content": content,
        }

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:
            self._forget(forget_scope(payload))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        change = {
            "operation": "add",
            "path": f"{self._folder(scope, str(payload['folder']))}/{payload['key']}.md",
            "title": str(payload["title"]),
            "content": str(payload["content"]),
            "tags": ["mnemo", str(payload["op"])],
        }
        self._call(lambda c: c.commit([change], scope))

    def _forget(self, scope: ProviderScope) -> None:
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
            self._call(lambda c, deletes=deletes: c.commit(deletes, scope))
        raise ProviderError(f"byterover: {folder} still holds memories after {FORGET_ROUNDS} delete rounds")

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, REMEMBER)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = scope_for(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        if name == "byterover_profile":
            facts = self._retrieve("what is known about this user", scope, [self._folder(scope, "facts")], 50)
            return json.dumps({"ok": True, "facts": [m.content for m in facts]}, ensure_ascii=False)
        if name == "byterover_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = limit if isinstance(limit, int) and 1 <= limit <= 50 else 10
            found = self._retrieve(query, scope, [self._folder(scope)], limit)
            return json.dumps({"ok": True, "results": [m.content for m in found]}, ensure_ascii=False)
        if name == "byterover_remember":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("content")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "content is required"})
            key = write_key("remember", ctx, text)
            change = {
                "operation": "add",
                "path": f"{self._folder(scope, 'facts')}/{key}.md",
                "title": _title(text),
                "content": text[:MAX_TEXT],
                "tags": ["mnemo", "remember"],
            }
            self._call(lambda c: c.commit([change], scope))
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
