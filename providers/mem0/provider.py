"""Mem0Provider: Mem0's hosted platform (official ``mem0ai`` SDK) or a self-hosted server.

Scope (``memory.provider_scope``): ``user_id`` = the speaker (``telegram:42``),
``agent_id`` = the bot (setting ``agent_id``), ``run_id`` = the mnemo session. Every
search puts the scope inside ``filters`` (top-level ids are refused by Mem0's v2/v3
search); every call names the scope explicitly.

Two APIs, one setting ``api``:

* ``platform`` (default): ``mem0.MemoryClient`` against ``base_url`` (default
  https://api.mem0.ai; ``MEM0_BASE_URL``), ``Authorization: Token <MEM0_API_KEY>``.
  The client pings ``GET /v1/ping/`` when built, so it is built lazily on the first
  call, never at start-up: a provider down at boot still gets its writes later.
* ``server``: the self-hosted REST server (no ``/v1`` prefix: ``POST /memories``,
  ``POST /search``, ``GET /memories``) over httpx.

Writes are durable (``memory.durable``): turns, mirrored memory entries and
session-end extraction are queued and sent by ``apply_write``; each carries its write
key in ``metadata.mnemo_key``. Telemetry of the SDK is switched off
(``MEM0_TELEMETRY=False``) unless the environment says otherwise.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from mnemo.memory.durable import (
    FORGET_USER,
    DurableWrites,
    ProviderHealth,
    RetryLater,
    forget_scope,
    write_key,
)
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
from mnemo.memory.provider_tools import ProviderState, conclude_tool, profile_tool, search_tool, setting

log = structlog.get_logger(__name__)

PLATFORM_URL = "https://api.mem0.ai"
MAX_TEXT = 4000
SESSION_END_MESSAGES = 20

PROFILE = profile_tool(
    "mem0", "Everything Mem0 remembers about the user you are talking to (their stored memories)."
)
SEARCH = search_tool("mem0", "Mem0")
CONCLUDE = conclude_tool("mem0", "Mem0")


def _memories(body: Any) -> list[str]:
    """The memory texts of a search/list answer (``{"results": [...]}`` or a list)."""
    items = body.get("results", body.get("memories", [])) if isinstance(body, Mapping) else body
    if not isinstance(items, list):
        raise ProviderError(f"mem0 answered an unexpected body: {str(body)[:200]}")
    return [str(i["memory"]) for i in items if isinstance(i, Mapping) and isinstance(i.get("memory"), str)]


class Mem0Provider(ProviderState, DurableWrites, MemoryProvider):
    name = "mem0"
    label = "Mem0"
    description = "Mem0 long-term memory (hosted platform or self-hosted server), per-user scopes"

    def __init__(self) -> None:
        super().__init__()
        self._http: Any = None
        self._lock = threading.Lock()

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField("api_key", "Mem0 API key (or MEM0_API_KEY)", secret=True),
            ConfigField("base_url", "API base URL (or MEM0_BASE_URL); empty: the hosted platform"),
            ConfigField(
                "api",
                "platform (the official client) or server (self-hosted REST)",
                ConfigKind.CHOICE,
                "platform",
                choices=("platform", "server"),
            ),
            ConfigField("agent_id", "the bot's agent id in Mem0", default=DEFAULT_AGENT_ID),
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
        api = config.get("api", "platform")
        if api == "server":
            if not setting(config, "base_url", "MEM0_BASE_URL"):
                return Availability(False, "set base_url (or MEM0_BASE_URL) to the self-hosted Mem0 server")
            return Availability(True)
        os.environ.setdefault("MEM0_TELEMETRY", "False")  # read when mem0 is imported
        try:
            import mem0  # noqa: F401
        except ImportError:
            return Availability(False, "the mem0ai package is missing: pip install 'mnemo[mem0]'")
        if not setting(config, "api_key", "MEM0_API_KEY"):
            return Availability(
                False, "set api_key (mnemo providers setup mem0 --set api_key=…) or MEM0_API_KEY"
            )
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        os.environ.setdefault("MEM0_TELEMETRY", "False")

    def shutdown(self) -> None:
        for c in (self._http, getattr(self._client, "client", None)):
            try:
                if c is not None:
                    c.close()
            except Exception:
                pass

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # memories live on the Mem0 server; settings are in the profile already

    # --- clients ----------------------------------------------------------------------
    @property
    def _server(self) -> bool:
        return self._config.get("api") == "server"

    def _base_url(self) -> str:
        return setting(self._config, "base_url", "MEM0_BASE_URL").rstrip("/")

    def _platform(self) -> Any:
        with self._lock:
            if self._client is None:
                import httpx

                os.environ.setdefault("MEM0_TELEMETRY", "False")
                from mem0 import MemoryClient

                timeout = float(self._config.get("timeout_s", 10.0))
                http = httpx.Client(timeout=timeout)
                self._client = MemoryClient(
                    api_key=setting(self._config, "api_key", "MEM0_API_KEY"),
                    host=self._base_url() or PLATFORM_URL,
                    client=http,
                )
            return self._client

    def _rest(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        with self._lock:
            if self._http is None:
                headers = {}
                key = setting(self._config, "api_key", "MEM0_API_KEY")
                if key:
                    headers["Authorization"] = f"Token {key}"
                self._http = httpx.Client(
                    base_url=self._base_url(),
                    headers=headers,
                    timeout=float(self._config.get("timeout_s", 10.0)),
                )
        response = self._http.request(method, path, **kw)
        if response.status_code in (429, 503):
            raise RetryLater(
                f"mem0 server answered {response.status_code}",
                _retry_after(response.headers.get("Retry-After")),
            )
        response.raise_for_status()
        return response.json()

    def _call(self, what: str, fn: Any) -> Any:
        """One API call with health bookkeeping; rate limits become ``RetryLater``."""
        try:
            result = fn()
        except RetryLater as e:
            self.health.failed(e)
            raise
        except Exception as e:
            self.health.failed(e)
            retry = getattr(e, "debug_info", None)
            if type(e).__name__ == "RateLimitError":
                after = retry.get("retry_after") if isinstance(retry, Mapping) else None
                raise RetryLater(
                    f"mem0 {what}: rate limited", float(after) if after is not None else None
                ) from e
            raise
        self.health.ok()
        return result

    # --- the API, always with an explicit scope ----------------------------------------
    def add(
        self,
        messages: list[dict[str, str]],
        scope: ProviderScope,
        *,
        metadata: Mapping[str, Any],
        infer: bool = True,
    ) -> Any:
        ids = {"user_id": scope.user_id, "agent_id": scope.agent_id, "run_id": scope.session_id}
        if self._server:
            body = {"messages": messages, **ids, "metadata": dict(metadata), "infer": infer}
            return self._call("add", lambda: self._rest("POST", "/memories", json=body))
        client = self._platform() if self._client is not None else self._call("connect", self._platform)
        return self._call("add", lambda: client.add(messages, metadata=dict(metadata), infer=infer, **ids))

    def search(self, query: str, scope: ProviderScope, *, limit: int) -> list[str]:
        filters = {"user_id": scope.user_id}
        if self._server:
            body = {"query": query, "user_id": scope.user_id, "filters": filters, "limit": limit}
            return _memories(self._call("search", lambda: self._rest("POST", "/search", json=body)))
        client = self._platform() if self._client is not None else self._call("connect", self._platform)
        return _memories(self._call("search", lambda: client.search(query, filters=filters, top_k=limit)))

    def forget(self, scope: ProviderScope) -> None:
        """Delete all of the user's memories (platform ``DELETE /v1/memories/?user_id=``,
        server ``DELETE /memories?user_id=``)."""
        if self._server:
            self._call("delete", lambda: self._rest("DELETE", "/memories", params={"user_id": scope.user_id}))
            return
        client = self._platform() if self._client is not None else self._call("connect", self._platform)
        self._call("delete", lambda: client.delete_all(user_id=scope.user_id))

    def profile(self, scope: ProviderScope) -> list[str]:
        if self._server:
            return _memories(
                self._call("list", lambda: self._rest("GET", "/memories", params={"user_id": scope.user_id}))
            )
        client = self._platform() if self._client is not None else self._call("connect", self._platform)
        return _memories(self._call("list", lambda: client.get_all(filters={"user_id": scope.user_id})))

    # --- per turn ---------------------------------------------------------------------
    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx, str(self._config.get("agent_id") or DEFAULT_AGENT_ID))

    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        found = self.search(query[:MAX_TEXT], scope, limit=int(self._config.get("top_k", 5)))
        if not found:
            return Recall("")
        return Recall("Mem0 remembers about this user:\n" + "\n".join(f"- {m}" for m in found), len(found))

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == "turn":
            messages = [
                {"role": "user", "content": str(data["user"])[:MAX_TEXT]},
                {"role": "assistant", "content": str(data["assistant"])[:MAX_TEXT]},
            ]
            infer = True
        elif op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            messages = [{"role": "user", "content": write.content[:MAX_TEXT]}]
            infer = False
        elif op in ("session_end", "pre_compress"):
            messages = [
                {"role": m["role"], "content": message_text(m.get("content"))[:MAX_TEXT]}
                for m in data["messages"]
                if m.get("role") in ("user", "assistant") and message_text(m.get("content")).strip()
            ][-SESSION_END_MESSAGES:]
            if not messages:
                return None
            infer = True
        else:
            return None
        key = write_key(op, ctx, json.dumps(messages, sort_keys=True))
        return {"op": op, "key": key, "scope": scope.as_dict(), "messages": messages, "infer": infer}

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:  # erasure: every memory of the user
            self.forget(forget_scope(payload))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        self.add(
            list(payload["messages"]),
            scope,
            metadata={"mnemo_key": payload["key"], "mnemo_op": payload["op"]},
            infer=bool(payload.get("infer", True)),
        )

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, CONCLUDE)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        if name == "mem0_profile":
            return json.dumps({"ok": True, "memories": self.profile(scope)}, ensure_ascii=False)
        if name == "mem0_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = limit if isinstance(limit, int) and 1 <= limit <= 50 else 10
            return json.dumps(
                {"ok": True, "results": self.search(query, scope, limit=limit)}, ensure_ascii=False
            )
        if name == "mem0_conclude":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("conclusion")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "conclusion is required"})
            key = write_key("conclude", ctx, text)
            self.add(
                [{"role": "user", "content": text[:MAX_TEXT]}],
                scope,
                metadata={"mnemo_key": key, "mnemo_op": "conclude"},
                infer=False,
            )
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
