"""RetainDBProvider: RetainDB's hosted memory API over a small aiohttp client.

Scope (``memory.provider_scope``): ``user_id`` = the speaker (``telegram:42``),
``session_id`` = the mnemo session, ``project`` = a setting (default ``mnemo``). Every
request names the speaker's ``user_id``; a turn without a speaker neither writes nor
recalls. Settings: ``api_key`` (or ``RETAINDB_API_KEY``), ``base_url`` (or
``RETAINDB_BASE_URL``, default https://api.retaindb.com).

Writes are durable (``memory.durable``): turns and session-end / pre-compress
transcripts go to ``POST /v1/memory/ingest/session``, mirrored memory entries and the
``retaindb_remember`` tool to ``POST /v1/memory``; each carries its write key in
``metadata.mnemo_key``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.durable import (
    FORGET_USER,
    DurableWrites,
    ProviderHealth,
    RetryLater,
    forget_scope,
    write_key,
)
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
from mnemo.providers.retaindb.client import DEFAULT_URL, RetainDBClient

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20

PROFILE = profile_tool("retaindb", "Everything RetainDB remembers about the user you are talking to.")
SEARCH = search_tool("retaindb", "RetainDB")
REMEMBER = remember_tool("retaindb", "RetainDB")


class RetainDBProvider(ProviderState, DurableWrites, MemoryProvider):
    name = "retaindb"
    label = "RetainDB"
    description = "RetainDB hosted memory (REST API), per-user scopes"

    _client: RetainDBClient | None

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField("api_key", "RetainDB API key (or RETAINDB_API_KEY)", secret=True),
            ConfigField("base_url", f"API base URL (or RETAINDB_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("project", "RetainDB project the memories live in", default="mnemo"),
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
        if not setting(config, "api_key", "RETAINDB_API_KEY"):
            return Availability(
                False, "set api_key (mnemo providers setup retaindb --set api_key=…) or RETAINDB_API_KEY"
            )
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        self._client = RetainDBClient(
            setting(config, "base_url", "RETAINDB_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "RETAINDB_API_KEY"),
            str(config.get("project") or "mnemo"),
            float(config.get("timeout_s", 10.0)),
        )

    def shutdown(self) -> None:
        pass  # every call opens and closes its own HTTP session

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # memories live on the RetainDB server

    # --- calls with health bookkeeping ------------------------------------------------
    def _call(self, fn: Callable[[RetainDBClient], Any]) -> Any:
        if self._client is None:
            raise RuntimeError("retaindb provider is not initialised")
        try:
            result = fn(self._client)
        except RetryLater as e:
            self.health.failed(e)
            raise
        except Exception as e:
            self.health.failed(e)
            raise
        self.health.ok()
        return result

    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx)

    # --- per turn ---------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        top_k = int(self._config.get("top_k", 5))
        found = self._call(lambda c: c.search(query[:MAX_TEXT], scope, top_k=top_k))
        if not found:
            return Recall("")
        return Recall(
            "RetainDB remembers about this user:\n" + "\n".join(f"- {m}" for m in found), len(found)
        )

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == "turn":
            messages = [
                {"role": "user", "content": str(data["user"])[:MAX_TEXT]},
                {"role": "assistant", "content": str(data["assistant"])[:MAX_TEXT]},
            ]
            body: dict[str, Any] = {"messages": messages}
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            body = {"content": write.content[:MAX_TEXT]}
        elif op in ("session_end", "pre_compress"):
            messages = [
                {"role": m["role"], "content": message_text(m.get("content"))[:MAX_TEXT]}
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ][-SESSION_END_MESSAGES:]
            if not messages:
                return None
            body = {"messages": messages}
        else:
            return None
        key = write_key(op, ctx, json.dumps(body, sort_keys=True))
        return {"op": op, "key": key, "scope": scope.as_dict(), **body}

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:  # erasure: every memory of the user
            forget = forget_scope(payload)
            self._call(lambda c: c.forget(forget))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        metadata = {"mnemo_key": payload["key"], "mnemo_op": payload["op"]}
        if "content" in payload:
            content = str(payload["content"])
            self._call(lambda c: c.remember(content, scope, memory_type="fact", metadata=metadata))
        else:
            messages = list(payload["messages"])
            self._call(lambda c: c.ingest_session(messages, scope, metadata=metadata))

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, REMEMBER)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        if name == "retaindb_profile":
            return json.dumps(
                {"ok": True, "memories": self._call(lambda c: c.profile(scope))}, ensure_ascii=False
            )
        if name == "retaindb_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = limit if isinstance(limit, int) and 1 <= limit <= 50 else 10
            return json.dumps(
                {"ok": True, "results": self._call(lambda c: c.search(query, scope, top_k=limit))},
                ensure_ascii=False,
            )
        if name == "retaindb_remember":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("content")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "content is required"})
            metadata = {"mnemo_key": write_key("remember", ctx, text), "mnemo_op": "remember"}
            self._call(lambda c: c.remember(text[:MAX_TEXT], scope, memory_type="fact", metadata=metadata))
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
