"""SupermemoryProvider: Supermemory's hosted (or self-hosted) memory API, official SDK.

Scope (``memory.provider_scope``): one Supermemory namespace per mnemo user — the
speaker, also in a shared room — named ``<namespace_prefix>:<user id>``
(``mnemo:telegram:42``, ``client.namespace_for``). Every call names it; a turn without
a speaker neither writes nor recalls. The mnemo session and the bot's agent id travel
in each document's metadata (``mnemo_session``, ``mnemo_agent``): a namespace is the
only isolation Supermemory has, and recall is user-wide, not per session.

Writes are durable (``memory.durable``): a turn, a mirrored memory entry, the
session-end and pre-compress transcripts are each one document whose ``id`` is the
write key, so a write retried after a lost answer is an unchanged duplicate on the
server, never a second copy. ``forget_user`` (erasure) deletes the user's namespace.
The ``supermemory_remember`` tool writes at once, also keyed.

Settings: ``api_key`` (or ``SUPERMEMORY_API_KEY``), ``base_url`` (or
``SUPERMEMORY_BASE_URL``, default https://api.supermemory.ai), ``namespace_prefix``,
``search_mode``, ``top_k``, ``timeout_s``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.durable import DurableWrites, ProviderHealth, write_key
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

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20
DEFAULT_PREFIX = "mnemo"
FORGET_USER = "forget_user"

PROFILE = profile_tool(
    "supermemory", "Supermemory's profile of the user you are talking to: stable facts and recent context."
)
SEARCH = search_tool("supermemory", "Supermemory")
REMEMBER = remember_tool("supermemory", "Supermemory")


def transcript(messages: Sequence[Mapping[str, str]]) -> str:
    """A conversation as one document: a ``role: text`` line per message."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class SupermemoryProvider(ProviderState, DurableWrites, MemoryProvider):
    name = "supermemory"
    label = "Supermemory"
    description = "Supermemory hosted memory (official SDK), a namespace per user"

    _client: Any  # client.SupermemoryClient, built in initialize

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        from mnemo.providers.supermemory.client import DEFAULT_URL, SEARCH_MODES

        return (
            ConfigField("api_key", "Supermemory API key (or SUPERMEMORY_API_KEY)", secret=True),
            ConfigField("base_url", f"API base URL (or SUPERMEMORY_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField(
                "namespace_prefix",
                "namespaces are PREFIX:user (letters, digits, _ and -)",
                default=DEFAULT_PREFIX,
            ),
            ConfigField(
                "search_mode",
                "what recall searches: learned memories, source chunks, or both",
                ConfigKind.CHOICE,
                "hybrid",
                choices=SEARCH_MODES,
            ),
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

    def save_config(self, values: Mapping[str, Any], home: Path) -> Path:
        reason = self._prefix_problem(values)
        if reason:
            raise ProviderError(reason)
        return super().save_config(values, home)

    @staticmethod
    def _prefix_problem(config: Mapping[str, Any]) -> str:
        from mnemo.providers.supermemory.client import PREFIX_RE

        prefix = str(config.get("namespace_prefix", DEFAULT_PREFIX) or "")
        if not PREFIX_RE.fullmatch(prefix):
            return f"namespace_prefix: {prefix!r} may hold only letters, digits, _ and - (at most 40)"
        return ""

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        try:
            import supermemory  # noqa: F401
        except ImportError:
            return Availability(False, "the supermemory package is missing: pip install 'mnemo[supermemory]'")
        if not setting(config, "api_key", "SUPERMEMORY_API_KEY"):
            return Availability(
                False,
                "set api_key (mnemo providers setup supermemory --set api_key=…) or SUPERMEMORY_API_KEY",
            )
        reason = self._prefix_problem(config)
        return Availability(not reason, reason)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        from mnemo.providers.supermemory.client import DEFAULT_URL, SupermemoryClient

        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        self._client = SupermemoryClient(  # no I/O: the first request is the first call
            setting(config, "base_url", "SUPERMEMORY_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "SUPERMEMORY_API_KEY"),
            float(config.get("timeout_s", 10.0)),
        )

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # memories live on the Supermemory server

    # --- scope and calls with health bookkeeping --------------------------------------
    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx, DEFAULT_AGENT_ID)

    def namespace(self, scope: ProviderScope) -> str:
        from mnemo.providers.supermemory.client import namespace_for

        return namespace_for(str(self._config.get("namespace_prefix", DEFAULT_PREFIX) or ""), scope.user_id)

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        if self._client is None:
            raise RuntimeError("supermemory provider is not initialised")
        try:
            result = fn(self._client)
        except Exception as e:
            self.health.failed(e)
            raise
        self.health.ok()
        return result

    # --- per turn ---------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        ns, top_k, mode = (
            self.namespace(scope),
            int(self._config.get("top_k", 5)),
            str(self._config.get("search_mode", "hybrid")),
        )
        found = self._call(lambda c: c.search(ns, query[:MAX_TEXT], limit=top_k, mode=mode))
        if not found:
            return Recall("")
        return Recall(
            "Supermemory remembers about this user:\n" + "\n".join(f"- {m}" for m in found), len(found)
        )

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == FORGET_USER:
            # every erasure is its own job: a user erased, back, and erased again is sent twice
            nonce = str(data.get("requested_at") or time.time_ns())
            return {"op": op, "key": write_key(op, ctx, scope.user_id, nonce), "scope": scope.as_dict()}
        if op == "turn":
            content = transcript(
                [
                    {"role": "user", "content": str(data["user"])[:MAX_TEXT]},
                    {"role": "assistant", "content": str(data["assistant"])[:MAX_TEXT]},
                ]
            )
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            content = write.content[:MAX_TEXT]
        elif op in ("session_end", "pre_compress"):
            messages = [
                {"role": m["role"], "content": message_text(m.get("content"))[:MAX_TEXT]}
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ][-SESSION_END_MESSAGES:]
            if not messages:
                return None
            content = transcript(messages)
        else:
            return None
        return {"op": op, "key": write_key(op, ctx, content), "scope": scope.as_dict(), "content": content}

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:
            user_id = str(payload["scope"]["user_id"])
            if not user_id:
                raise ProviderError("supermemory forget_user: the payload names no user")
            ns = self.namespace(ProviderScope(user_id, "", ""))
            self._call(lambda c: c.delete_namespace(ns))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        ns, content, key = self.namespace(scope), str(payload["content"]), str(payload["key"])
        metadata = self._metadata(key, str(payload["op"]), scope)
        self._call(lambda c: c.add(ns, content, doc_id=key, metadata=metadata))

    @staticmethod
    def _metadata(key: str, op: str, scope: ProviderScope) -> dict[str, str]:
        return {
            "mnemo_key": key,
            "mnemo_op": op,
            "mnemo_session": scope.session_id,
            "mnemo_agent": scope.agent_id,
        }

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, REMEMBER)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        ns = self.namespace(scope)
        if name == "supermemory_profile":
            profile = self._call(lambda c: c.profile(ns))
            return json.dumps({"ok": True, **profile.as_dict()}, ensure_ascii=False)
        if name == "supermemory_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = (
                limit if isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit <= 50 else 10
            )
            mode = str(self._config.get("search_mode", "hybrid"))
            found = self._call(lambda c: c.search(ns, query[:MAX_TEXT], limit=limit, mode=mode))
            return json.dumps({"ok": True, "results": found}, ensure_ascii=False)
        if name == "supermemory_remember":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("content")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "content is required"})
            content = text.strip()[:MAX_TEXT]
            key = write_key("remember", ctx, content)
            metadata = self._metadata(key, "remember", scope)
            self._call(lambda c: c.add(ns, content, doc_id=key, metadata=metadata))
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
