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

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider, missing_package
from mnemo.memory.provider import Availability
from mnemo.memory.provider_config import ConfigField, ConfigKind
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope
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

log = structlog.get_logger(__name__)

PLATFORM_URL = "https://api.mem0.ai"
MAX_TEXT = 4000
SESSION_END_MESSAGES = 20


def _memories(body: Any) -> list[str]:
    """The memory texts of a search/list answer (``{"results": [...]}`` or a list)."""
    items = body.get("results", body.get("memories", [])) if isinstance(body, Mapping) else body
    if not isinstance(items, list):
        raise ProviderError(f"mem0 answered an unexpected body: {str(body)[:200]}")
    return [str(i["memory"]) for i in items if isinstance(i, Mapping) and isinstance(i.get("memory"), str)]


class Mem0Provider(ExternalProvider[Any]):
    name = "mem0"
    label = "Mem0"
    description = "Mem0 long-term memory (hosted platform or self-hosted server), per-user scopes"
    shared_tools = SharedTools.standard(
        "mem0",
        "Mem0",
        "Everything Mem0 remembers about the user you are talking to (their stored memories).",
        conclude=True,
    )

    def __init__(self) -> None:
        super().__init__()
        self._http: Any = None
        self._lock = threading.Lock()

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("Mem0 API key (or MEM0_API_KEY)"),
            ConfigField("base_url", "API base URL (or MEM0_BASE_URL); empty: the hosted platform"),
            ConfigField(
                "api",
                "platform (the official client) or server (self-hosted REST)",
                ConfigKind.CHOICE,
                "platform",
                choices=("platform", "server"),
            ),
            ConfigField("agent_id", "the bot's agent id in Mem0", default=DEFAULT_AGENT_ID),
            top_k_field(),
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        api = config.get("api", "platform")
        if api == "server":
            if not setting(config, "base_url", "MEM0_BASE_URL"):
                return Availability(False, "set base_url (or MEM0_BASE_URL) to the self-hosted Mem0 server")
            return Availability(True)
        os.environ.setdefault("MEM0_TELEMETRY", "False")  # read when mem0 is imported
        missing = missing_package("mem0", "mem0ai", "mem0")
        if missing is not None:
            return missing
        if not setting(config, "api_key", "MEM0_API_KEY"):
            return self.key_missing("MEM0_API_KEY")
        return Availability(True)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        os.environ.setdefault("MEM0_TELEMETRY", "False")

    def shutdown(self) -> None:
        for c in (self._http, getattr(self._client, "client", None)):
            try:
                if c is not None:
                    c.close()
            except Exception:
                pass

    # --- clients ----------------------------------------------------------------------
    @property
    def _server(self) -> bool:
        return self._config.get("api") == "server"

    def _base_url(self) -> str:
        return setting(self._config, "base_url", "MEM0_BASE_URL").rstrip("/")

    def _platform(self) -> Any:
        """The official client, built on first use (it pings the server when built)."""
        if self._client is not None:
            return self._client

        def build() -> Any:
            with self._lock:
                if self._client is None:
                    import httpx

                    os.environ.setdefault("MEM0_TELEMETRY", "False")
                    from mem0 import MemoryClient

                    self._client = MemoryClient(
                        api_key=setting(self._config, "api_key", "MEM0_API_KEY"),
                        host=self._base_url() or PLATFORM_URL,
                        client=httpx.Client(timeout=self.timeout_s),
                    )
                return self._client

        return self.call("connect", build)

    def _rest(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        with self._lock:
            if self._http is None:
                headers = {}
                key = setting(self._config, "api_key", "MEM0_API_KEY")
                if key:
                    headers["Authorization"] = f"Token {key}"
                self._http = httpx.Client(base_url=self._base_url(), headers=headers, timeout=self.timeout_s)
        response = self._http.request(method, path, **kw)
        if response.status_code in (429, 503):
            raise RetryLater(
                f"mem0 server answered {response.status_code}",
                _retry_after(response.headers.get("Retry-After")),
            )
        response.raise_for_status()
        return response.json()

    def retry_later(self, what: str, error: Exception) -> RetryLater | None:
        if type(error).__name__ == "RateLimitError":  # the SDK's, with the server's delay
            info = getattr(error, "debug_info", None)
            after = info.get("retry_after") if isinstance(info, Mapping) else None
            return RetryLater(f"mem0 {what}: rate limited", float(after) if after is not None else None)
        return super().retry_later(what, error)

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
            return self.call("add", lambda: self._rest("POST", "/memories", json=body))
        client = self._platform()
        return self.call("add", lambda: client.add(messages, metadata=dict(metadata), infer=infer, **ids))

    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        filters = {"user_id": scope.user_id}
        if self._server:
            body = {"query": query, "user_id": scope.user_id, "filters": filters, "limit": limit}
            return _memories(self.call("search", lambda: self._rest("POST", "/search", json=body)))
        client = self._platform()
        return _memories(self.call("search", lambda: client.search(query, filters=filters, top_k=limit)))

    def forget(self, scope: ProviderScope) -> None:
        """Delete all of the user's memories (platform ``DELETE /v1/memories/?user_id=``,
        server ``DELETE /memories?user_id=``)."""
        if self._server:
            self.call("delete", lambda: self._rest("DELETE", "/memories", params={"user_id": scope.user_id}))
            return
        client = self._platform()
        self.call("delete", lambda: client.delete_all(user_id=scope.user_id))

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        if self._server:
            params = {"user_id": scope.user_id}
            return {
                "memories": _memories(
                    self.call("list", lambda: self._rest("GET", "/memories", params=params))
                )
            }
        client = self._platform()
        return {
            "memories": _memories(
                self.call("list", lambda: client.get_all(filters={"user_id": scope.user_id}))
            )
        }

    # --- writes -----------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                messages = [
                    {"role": "user", "content": user[:MAX_TEXT]},
                    {"role": "assistant", "content": assistant[:MAX_TEXT]},
                ]
                infer = True
            case MirrorWrite(content=content) | Remember(content=content):
                messages, infer = [{"role": "user", "content": content[:MAX_TEXT]}], False
            case SessionEnd(messages=said) | PreCompress(messages=said):
                messages = [
                    {"role": m.role, "content": m.text[:MAX_TEXT]} for m in said[-SESSION_END_MESSAGES:]
                ]
                infer = True
            case _:
                raise ProviderError(f"mem0: cannot send {label(write.operation)}")
        metadata = {"mnemo_key": write.key, "mnemo_op": label(write.operation)}
        self.add(messages, write.scope, metadata=metadata, infer=infer)

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        metadata = {"mnemo_key": write.key, "mnemo_op": label(operation)}
        infer = bool(operation.body.get("infer", True))
        self.add(list(operation.body["messages"]), write.scope, metadata=metadata, infer=infer)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
