"""A small RetainDB client on aiohttp (no Python SDK is published).

From RetainDB's public API reference (API v1, ``Authorization: Bearer <key>``):

* ``POST /v1/memory`` — one memory ``{project, user_id, session_id?, content, memory_type,
  write_mode, metadata}``;
* ``POST /v1/memory/search`` — ``{project, user_id, query, top_k,
  include_pending}`` → ``{"results": [{"memory": {"content": …}, "score": …}], …}``;
* ``POST /v1/memory/ingest/session`` — a transcript ``{project, user_id, session_id,
  messages}``;
* ``GET /v1/memory/profile/{user_id}?project=…`` → ``{"memories": [{"id": …, "content": …}]}``;
* ``DELETE /v1/memory/{id}`` — one memory (erasure deletes a user's memories one by one).

Every call takes a ``ProviderScope``; there is no default user. The methods are
synchronous (the provider hooks run in worker threads): each runs one request on a
short-lived event loop with its own ``ClientSession``.
"""

from __future__ import annotations

import asyncio
import json as _json
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider_scope import ProviderScope

DEFAULT_URL = "https://api.retaindb.com"


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _run(coro: Any) -> Any:
    """Run ``coro`` to completion from synchronous code (also under a running loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, name="retaindb-call", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def memory_texts(body: Any) -> list[str]:
    """The memory texts of a search or profile answer; anything else is an error."""
    if not isinstance(body, Mapping):
        raise ProviderError(f"retaindb answered an unexpected body: {str(body)[:200]}")
    items = body.get("results", body.get("memories"))
    if not isinstance(items, list):
        raise ProviderError(f"retaindb answered an unexpected body: {str(body)[:200]}")
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        memory = item.get("memory", item)
        content = memory.get("content") if isinstance(memory, Mapping) else memory
        if isinstance(content, str) and content.strip():
            out.append(content)
    return out


FORGET_ROUNDS = 20


def memory_ids(body: Any) -> list[str]:
    """The memory ids of a profile answer; anything else is an error."""
    if not isinstance(body, Mapping) or not isinstance(body.get("memories"), list):
        raise ProviderError(f"retaindb answered an unexpected profile: {str(body)[:200]}")
    out = []
    for item in body["memories"]:
        memory_id = item.get("id") if isinstance(item, Mapping) else None
        if not isinstance(memory_id, str) or not memory_id:
            raise ProviderError(f"retaindb answered a memory without an id: {str(item)[:200]}")
        out.append(memory_id)
    return out


class RetainDBClient:
    def __init__(self, base_url: str, api_key: str, project: str, timeout_s: float) -> None:
        self.base_url = (base_url or DEFAULT_URL).rstrip("/")
        self.api_key = api_key
        self.project = project
        self.timeout_s = timeout_s

    async def _request(
        self, method: str, path: str, *, json: Any = None, params: Mapping[str, str] | None = None
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
            session.request(method, self.base_url + path, json=json, params=params) as response,
        ):
            if response.status in (429, 503):
                raise RetryLater(
                    f"retaindb answered {response.status}", _retry_after(response.headers.get("Retry-After"))
                )
            text = await response.text()
        if response.status >= 400:
            raise ProviderError(f"retaindb {method} {path}: HTTP {response.status}: {text[:200]}")
        try:
            return _json.loads(text) if text else {}
        except ValueError as e:
            raise ProviderError(f"retaindb {method} {path}: not JSON: {text[:200]}") from e

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return _run(self._request(method, path, **kw))
        except (RetryLater, ProviderError):
            raise
        except TimeoutError as e:
            raise ProviderError(f"retaindb {method} {path}: timed out after {self.timeout_s} s") from e
        except aiohttp.ClientError as e:
            raise ProviderError(f"retaindb {method} {path}: {type(e).__name__}: {e}") from e

    def _ids(self, scope: ProviderScope) -> dict[str, str]:
        return {"project": self.project, "user_id": scope.user_id, "session_id": scope.session_id}

    # --- the API -----------------------------------------------------------------------
    def remember(
        self, content: str, scope: ProviderScope, *, memory_type: str, metadata: Mapping[str, Any]
    ) -> Any:
        body = {
            **self._ids(scope),
            "content": content,
            "memory_type": memory_type,
            "write_mode": "sync",
            "metadata": dict(metadata),
        }
        return self.call("POST", "/v1/memory", json=body)

    def ingest_session(
        self, messages: list[dict[str, str]], scope: ProviderScope, *, metadata: Mapping[str, Any]
    ) -> Any:
        body = {**self._ids(scope), "messages": messages, "metadata": dict(metadata)}
        return self.call("POST", "/v1/memory/ingest/session", json=body)

    def search(self, query: str, scope: ProviderScope, *, top_k: int) -> list[str]:
        # user-wide recall: no session_id, which would narrow it to this session
        body = {
            "project": self.project,
            "user_id": scope.user_id,
            "query": query,
            "top_k": top_k,
            "include_pending": True,
        }
        return memory_texts(self.call("POST", "/v1/memory/search", json=body))

    def profile(self, scope: ProviderScope) -> list[str]:
        path = "/v1/memory/profile/" + quote(scope.user_id, safe="")
        return memory_texts(self.call("GET", path, params={"project": self.project}))

    def forget(self, scope: ProviderScope, *, rounds: int = FORGET_ROUNDS) -> int:
        """Delete every memory of the user: read their profile, ``DELETE /v1/memory/:id``
        each one, until the profile is empty. Returns how many were deleted; raises when
        memories remain after ``rounds`` reads (the job is retried)."""
        path = "/v1/memory/profile/" + quote(scope.user_id, safe="")
        deleted = 0
        for _ in range(rounds):
            ids = memory_ids(self.call("GET", path, params={"project": self.project}))
            if not ids:
                return deleted
            for memory_id in ids:
                self.call(
                    "DELETE", "/v1/memory/" + quote(memory_id, safe=""), params={"project": self.project}
                )
                deleted += 1
        raise ProviderError(f"retaindb: memories of {scope.user_id} remain after {rounds} rounds of deletes")
