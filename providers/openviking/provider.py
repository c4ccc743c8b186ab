"""OpenVikingProvider: an OpenViking server (context database) through its HTTP SDK.

Scope (``memory.provider_scope``): an OpenViking account (setting ``account``, default
``mnemo``) with one OpenViking *user* per mnemo user (``tenant_user``: the speaker's id
made URI-safe, ``telegram:42`` → ``telegram_42``), named on every request; the bot is the actor peer (``agent_id``); the
mnemo session is an OpenViking session of that user. Recall searches
``viking://user/memories`` of the speaker only. A turn without a speaker neither writes
nor recalls. Settings: ``api_key`` (or ``OPENVIKING_API_KEY``; a key that may act for
the account's users), ``base_url`` (or ``OPENVIKING_BASE_URL``, default
http://127.0.0.1:1933).

Writes are durable (``memory.durable``): a turn adds its two messages to the session
(``turn_id`` = the write key); session end and pre-compress commit the session, which
makes the server extract memories from it before mnemo forgets the detail; mirrored
memory entries and ``openviking_remember`` write a fact file named by the write key
(the same write again leaves the file as it is). ``forget_user`` deletes the user's
memories and sessions.
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
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, scope_for
from mnemo.memory.provider_tools import ProviderState, profile_tool, remember_tool, search_tool, setting

DEFAULT_URL = "http://127.0.0.1:1933"  # a self-hosted openviking-server's default port
MAX_TEXT = 4000

PROFILE = profile_tool("openviking", "The profile OpenViking keeps of the user you are talking to.")
SEARCH = search_tool("openviking", "OpenViking")
REMEMBER = remember_tool("openviking", "OpenViking")


class OpenVikingProvider(ProviderState, DurableWrites, MemoryProvider):
    name = "openviking"
    label = "OpenViking"
    description = "OpenViking context database (HTTP SDK), one OpenViking user per mnemo user"

    _client: Any  # OpenVikingClient, imported with the SDK in initialize

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField(
                "api_key",
                "OpenViking API key that may act for the account's users (or OPENVIKING_API_KEY)",
                secret=True,
            ),
            ConfigField("base_url", f"server URL (or OPENVIKING_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("account", "OpenViking account holding mnemo's users", default="mnemo"),
            ConfigField("agent_id", "the bot's actor peer id", default=DEFAULT_AGENT_ID),
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
        import importlib.util

        if importlib.util.find_spec("openviking_sdk") is None:
            return Availability(False, "the OpenViking SDK is missing: pip install 'mnemo[openviking]'")
        if not setting(config, "api_key", "OPENVIKING_API_KEY"):
            return Availability(
                False, "set api_key (mnemo providers setup openviking --set api_key=…) or OPENVIKING_API_KEY"
            )
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        from mnemo.providers.openviking.client import OpenVikingClient  # the SDK, only when used

        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        self._client = OpenVikingClient(
            setting(config, "base_url", "OPENVIKING_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "OPENVIKING_API_KEY"),
            str(config.get("account") or "mnemo"),
            float(config.get("timeout_s", 10.0)),
        )

    def shutdown(self) -> None:
        pass  # every call opens and closes its own SDK client

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # memories live on the OpenViking server

    # --- scope and calls ----------------------------------------------------------------
    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx, str(self._config.get("agent_id") or DEFAULT_AGENT_ID))

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        if self._client is None:
            raise RuntimeError("openviking provider is not initialised")
        try:
            result = fn(self._client)
        except Exception as e:  # RetryLater too: the queue retries, health shows why
            self.health.failed(e)
            raise
        self.health.ok()
        return result

    # --- per turn ---------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        top_k = int(self._config.get("top_k", 5))
        found = self._call(lambda c: c.find(query[:MAX_TEXT], scope, limit=top_k))
        if not found:
            return Recall("")
        return Recall(
            "OpenViking remembers about this user:\n" + "\n".join(f"- {m}" for m in found), len(found)
        )

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == "turn":
            body: dict[str, Any] = {
                "user": str(data["user"])[:MAX_TEXT],
                "assistant": str(data["assistant"])[:MAX_TEXT],
            }
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            body = {"content": write.content[:MAX_TEXT]}
        elif op in ("session_end", "pre_compress"):
            said = [
                m
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ]
            if not said:
                return None
            body = {"messages": len(said)}  # the turns are in the session already; commit them
        else:
            return None
        key = write_key(op, ctx, json.dumps(body, sort_keys=True))
        return {"op": op, "key": key, "scope": scope.as_dict(), **body}

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        op = payload["op"]
        if op == FORGET_USER:
            scope = forget_scope(payload)
            self._call(lambda c: c.forget(scope))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        key = str(payload["key"])
        if op == "turn":
            messages = [
                {"role": "user", "content": str(payload["user"]), "turn_id": key},
                {"role": "assistant", "content": str(payload["assistant"]), "turn_id": key},
            ]
            self._call(lambda c: c.add_turns(messages, scope))
        elif op == "memory":
            content = str(payload["content"])
            self._call(lambda c: c.write_fact(key, content, scope))
        elif op in ("session_end", "pre_compress"):
            self._call(lambda c: c.commit(scope))
        else:
            raise ProviderError(f"openviking: unknown write {op!r}")

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, REMEMBER)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        if name == "openviking_profile":
            return json.dumps(
                {"ok": True, "profile": self._call(lambda c: c.profile(scope))}, ensure_ascii=False
            )
        if name == "openviking_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = limit if isinstance(limit, int) and 1 <= limit <= 50 else 10
            return json.dumps(
                {"ok": True, "results": self._call(lambda c: c.find(query, scope, limit=limit))},
                ensure_ascii=False,
            )
        if name == "openviking_remember":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("content")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "content is required"})
            key = write_key("remember", ctx, text)
            self._call(lambda c: c.write_fact(key, text[:MAX_TEXT], scope))
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
