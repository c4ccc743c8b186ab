"""HindsightProvider: Hindsight memory banks through the official ``hindsight-client``.

Scope: **one bank per user** (``<bank_prefix>-<platform>-<id>``, from
``memory.provider_scope``). Chosen over one bank per profile with the user as an
entity because isolation is then structural: a recall or reflect runs inside one
user's bank and cannot return another user's memories, whatever the server's entity
resolution or tag matching does; deleting a user's data is deleting a bank. The bot's
id and the mnemo session go into each memory's metadata and a ``session:<id>`` tag.

Retain per turn (durable, ``memory.durable``), recall for prefetch, reflect as the tool
``hindsight_reflect`` (plus ``hindsight_recall`` and ``hindsight_retain``). Each write
is retained with ``document_id`` = its write key and ``update_mode="replace"``, so a
re-sent write replaces itself instead of adding a duplicate.

The SDK is asyncio/aiohttp based; the provider runs it on one private event loop in
its own thread (the manager calls providers from worker threads).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Coroutine, Mapping, Sequence
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
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, scope_for
from mnemo.memory.provider_tools import ProviderState, setting

MAX_TEXT = 8000
SESSION_END_MESSAGES = 30

RECALL = ToolSchema(
    name="hindsight_recall",
    description="Search Hindsight's long-term memory of the user you are talking to.",
    input_schema={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
REFLECT = ToolSchema(
    name="hindsight_reflect",
    description="Ask Hindsight to reason over everything it remembers about this user and answer a question.",
    input_schema={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
RETAIN = ToolSchema(
    name="hindsight_retain",
    description="Store one durable fact about the user in Hindsight.",
    input_schema={"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]},
    durable_args=("content",),
)


class HindsightProvider(ProviderState, DurableWrites, MemoryProvider):
    name = "hindsight"
    label = "Hindsight"
    description = "Hindsight memory banks (one per user): retain, recall, reflect"

    def __init__(self) -> None:
        super().__init__()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField(
                "api_key", "Hindsight API key (or HINDSIGHT_API_KEY); empty for an open server", secret=True
            ),
            ConfigField("base_url", "Hindsight API base URL (or HINDSIGHT_BASE_URL)"),
            ConfigField("bank_prefix", "prefix of the per-user bank ids", default="mnemo"),
            ConfigField("agent_id", "the bot's id, stored with each memory", default=DEFAULT_AGENT_ID),
            ConfigField("budget", "recall budget", ConfigKind.CHOICE, "low", choices=("low", "mid", "high")),
            ConfigField(
                "max_tokens",
                "recall size per turn (tokens)",
                ConfigKind.INTEGER,
                1024,
                minimum=64,
                maximum=8192,
            ),
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
        try:
            import hindsight_client  # noqa: F401
        except ImportError:
            return Availability(
                False, "the hindsight-client package is missing: pip install 'mnemo[hindsight]'"
            )
        if not setting(config, "base_url", "HINDSIGHT_BASE_URL"):
            return Availability(False, "set base_url (or HINDSIGHT_BASE_URL) to the Hindsight server")
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))

    def shutdown(self) -> None:
        loop, client = self._loop, self._client
        if loop is None:
            return
        if client is not None:
            try:
                asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(5)
            except Exception:
                pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    # --- the private loop -----------------------------------------------------------------
    def _run(self, what: str, make: Any) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="mnemo-hindsight", daemon=True
                )
                self._thread.start()
            loop = self._loop

        async def call() -> Any:
            if self._client is None:
                from hindsight_client import Hindsight

                key = setting(self._config, "api_key", "HINDSIGHT_API_KEY") or None
                self._client = Hindsight(
                    base_url=setting(self._config, "base_url", "HINDSIGHT_BASE_URL"),
                    api_key=key,
                    timeout=float(self._config.get("timeout_s", 10.0)),
                    user_agent="mnemo",
                    max_attempts=1,  # retries belong to the job queue
                )
            coro: Coroutine[Any, Any, Any] = make(self._client)
            return await coro

        try:
            result = asyncio.run_coroutine_threadsafe(call(), loop).result(
                float(self._config.get("timeout_s", 10.0)) + 5
            )
        except Exception as e:
            self.health.failed(e)
            status = getattr(e, "status", None)
            if status in (429, 503):
                headers = getattr(e, "headers", None) or {}
                after = headers.get("Retry-After") if hasattr(headers, "get") else None
                try:
                    delay = float(after) if after is not None else None
                except ValueError:
                    delay = None
                raise RetryLater(f"hindsight {what}: {status}", delay) from e
            raise
        self.health.ok()
        return result

    # --- the API, always with an explicit scope -----------------------------------------
    def bank_id(self, scope: ProviderScope) -> str:
        prefix = str(self._config.get("bank_prefix") or "mnemo")
        return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_-]", "-", scope.user_id)

    def retain(self, content: str, scope: ProviderScope, *, key: str, context: str) -> None:
        metadata = {"mnemo_key": key, "session_id": scope.session_id, "agent_id": scope.agent_id}
        self._run(
            "retain",
            lambda c: c.aretain(
                bank_id=self.bank_id(scope),
                content=content[:MAX_TEXT],
                context=context,
                document_id=key,
                metadata=metadata,
                tags=[f"session:{scope.session_id}"],
                update_mode="replace",
            ),
        )

    def recall(self, query: str, scope: ProviderScope) -> list[str]:
        response = self._run(
            "recall",
            lambda c: c.arecall(
                bank_id=self.bank_id(scope),
                query=query[:MAX_TEXT],
                budget=str(self._config.get("budget", "low")),
                max_tokens=int(self._config.get("max_tokens", 1024)),
            ),
        )
        return [r.text for r in response.results]

    def forget(self, scope: ProviderScope) -> None:
        """Delete the user's bank (``DELETE /v1/default/banks/{bank}``); a bank that does
        not exist (never written, or deleted by an earlier attempt) is already forgotten."""
        try:
            self._run("delete_bank", lambda c: c.adelete_bank(self.bank_id(scope)))
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
            self.health.ok()

    def reflect(self, query: str, scope: ProviderScope) -> str:
        return self._run(
            "reflect", lambda c: c.areflect(bank_id=self.bank_id(scope), query=query[:MAX_TEXT])
        ).text

    # --- per turn -------------------------------------------------------------------------
    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx, str(self._config.get("agent_id") or DEFAULT_AGENT_ID))

    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        found = self.recall(query, scope)
        if not found:
            return Recall("")
        return Recall(
            "Hindsight remembers about this user:\n" + "\n".join(f"- {t}" for t in found), len(found)
        )

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == "turn":
            content = f"user: {data['user']}\nassistant: {data['assistant']}"
            context = "a conversation turn"
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None
            content, context = write.content, "a note the assistant saved to its memory"
        elif op in ("session_end", "pre_compress"):
            lines = [
                f"{m['role']}: {message_text(m.get('content'))}"
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ][-SESSION_END_MESSAGES:]
            if not lines:
                return None
            content = "\n".join(lines)
            context = "a conversation" + (
                " before it was compressed" if op == "pre_compress" else " that ended"
            )
        else:
            return None
        key = write_key(op, ctx, content)
        return {
            "op": op,
            "key": key,
            "scope": scope.as_dict(),
            "content": content[:MAX_TEXT],
            "context": context,
        }

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:  # erasure: the user's whole bank
            self.forget(forget_scope(payload))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        self.retain(str(payload["content"]), scope, key=str(payload["key"]), context=str(payload["context"]))

    # --- tools ----------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (RECALL, REFLECT, RETAIN)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        text = args.get("content" if name == "hindsight_retain" else "query")
        if not isinstance(text, str) or not text.strip():
            return json.dumps({"ok": False, "error": "a non-empty text argument is required"})
        if name == "hindsight_recall":
            return json.dumps({"ok": True, "results": self.recall(text, scope)}, ensure_ascii=False)
        if name == "hindsight_reflect":
            return json.dumps({"ok": True, "answer": self.reflect(text, scope)}, ensure_ascii=False)
        if name == "hindsight_retain":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            self.retain(
                text, scope, key=write_key("retain", ctx, text), context="a fact the assistant concluded"
            )
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
