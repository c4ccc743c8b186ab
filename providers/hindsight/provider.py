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
import re
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider, answer, missing_package, refuse
from mnemo.memory.provider import Availability, ProviderContext, ToolSchema
from mnemo.memory.provider_config import ConfigField, ConfigKind
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope
from mnemo.memory.provider_tools import api_key_field, setting, timeout_field
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


class HindsightProvider(ExternalProvider[Any]):
    name = "hindsight"
    label = "Hindsight"
    description = "Hindsight memory banks (one per user): retain, recall, reflect"
    max_text = MAX_TEXT

    def __init__(self) -> None:
        super().__init__()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("Hindsight API key (or HINDSIGHT_API_KEY); empty for an open server"),
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
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        missing = missing_package("hindsight_client", "hindsight-client", "hindsight")
        if missing is not None:
            return missing
        if not setting(config, "base_url", "HINDSIGHT_BASE_URL"):
            return Availability(False, "set base_url (or HINDSIGHT_BASE_URL) to the Hindsight server")
        return Availability(True)

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
    def _run(self, what: str, make: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
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
                    timeout=self.timeout_s,
                    user_agent="mnemo",
                    max_attempts=1,  # retries belong to the job queue
                )
            return await make(self._client)

        return self.call(
            what, lambda: asyncio.run_coroutine_threadsafe(call(), loop).result(self.timeout_s + 5)
        )

    def retry_later(self, what: str, error: Exception) -> RetryLater | None:
        status = getattr(error, "status", None)
        if status in (429, 503):
            headers = getattr(error, "headers", None) or {}
            after = headers.get("Retry-After") if hasattr(headers, "get") else None
            try:
                delay = float(after) if after is not None else None
            except ValueError:
                delay = None
            return RetryLater(f"hindsight {what}: {status}", delay)
        return None

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
        response = self._run(
            "reflect", lambda c: c.areflect(bank_id=self.bank_id(scope), query=query[:MAX_TEXT])
        )
        return str(response.text)

    # --- writes ---------------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                content, context = f"user: {user}\nassistant: {assistant}", "a conversation turn"
            case MirrorWrite(content=content):
                context = "a note the assistant saved to its memory"
            case Remember(content=content):
                context = "a fact the assistant concluded"
            case SessionEnd(messages=said) | PreCompress(messages=said):
                content = "\n".join(f"{m.role}: {m.text}" for m in said[-SESSION_END_MESSAGES:])
                ending = (
                    "that ended" if isinstance(write.operation, SessionEnd) else "before it was compressed"
                )
                context = f"a conversation {ending}"
            case _:
                raise ProviderError(f"hindsight: cannot send {label(write.operation)}")
        self.retain(content, write.scope, key=write.key, context=context)

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        body = operation.body
        self.retain(str(body["content"]), write.scope, key=write.key, context=str(body["context"]))

    # --- tools ----------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (RECALL, REFLECT, RETAIN)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self.scope(ctx)
        if scope is None:
            return refuse("no user in this conversation")
        text = args.get("content" if name == RETAIN.name else "query")
        if not isinstance(text, str) or not text.strip():
            return refuse("a non-empty text argument is required")
        if name == RECALL.name:
            return answer(results=self.recall(text, scope))
        if name == REFLECT.name:
            return answer(answer=self.reflect(text, scope))
        if name == RETAIN.name:
            if not ctx.may_write:
                return refuse("memory is read-only in this context")
            self.remember(text, scope, ctx, "retain")
            return answer()
        return refuse(f"unknown tool {name}")
