"""A small client for ByteRover's memory service ("CoGit") on aiohttp.

Why not the ``byterover`` package on the registry: 0.1.8 is the early-2025 code-notes
client (projects, notes, organisations); it has no memory retrieve or write call, it
pins ``pydantic~=2.10`` (mnemo runs a newer pydantic) and reads ``~/.byterover.toml``
at import. Today's ByteRover client is the ``brv`` CLI (Node.js); the HTTP calls it
makes to the memory service are what this client speaks (``Authorization: Bearer
<key>``, ``x-byterover-session-id: <session>``):

* ``GET /retrieve?project_id=<space>&query=…&node_keys=a,b`` →
  ``{"memories": [{"id", "title", "content", "score", "node_keys": […]}],
  "related_memories": […]}`` — ``node_keys`` narrows the search to those paths of the
  space's context tree;
* ``POST /organizations/{team}/projects/{space}/commits`` with ``{"branch",
  "current_sha", "memories": [{"operation": "add"|"edit"|"delete", "path", "title",
  "content", "tags"}]}`` → ``{"success": true, "commit_sha": …}``. A stale
  ``current_sha`` is answered 400 naming the current one ("… current SHA is 'abc'");
  the client sends the commit once more with it.

Every call takes a ``ProviderScope``; there is no default user: a user's memories are
the files under ``<root>/users/<user_id>/`` and every retrieve names that folder.
"""

from __future__ import annotations

import asyncio
import json as _json
import re
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider_scope import ProviderScope

DEFAULT_URL = "https://prod-beta-cgit.byterover.dev/api/v1"
SHA_PLACEHOLDER = "sha_placeholder"
COMMIT_ATTEMPTS = 3  # a stale head is corrected from the answer; more means a busy branch
_CURRENT_SHA = re.compile(r"current sha is '([^']+)'", re.IGNORECASE)
R = TypeVar("R")


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _run(coro: Coroutine[Any, Any, R]) -> R:
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

    t = threading.Thread(target=target, name="byterover-call", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    value: R = box["value"]
    return value


@dataclass(frozen=True, slots=True)
class Memory:
    path: str
    title: str
    content: str


def user_folder(root: str, scope: ProviderScope) -> str:
    """The context-tree folder holding one user's memories."""
    return f"{root.strip('/')}/users/{scope.user_id}"


def memories_in(body: Any, folder: str) -> list[Memory]:
    """The memories of a retrieve answer that lie in ``folder``; a body of any other
    shape is an error. Items outside the folder (a server that widened the search to
    related memories elsewhere) are dropped: one user's scope never shows another's."""
    if not isinstance(body, Mapping) or not isinstance(body.get("memories"), list):
        raise ProviderError(f"byterover answered an unexpected body: {str(body)[:200]}")
    related = body.get("related_memories")
    items = list(body["memories"]) + (list(related) if isinstance(related, list) else [])
    prefix = folder.rstrip("/") + "/"
    out: list[Memory] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, Mapping):
            continue
        keys = item.get("node_keys")
        paths = [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
        if not paths or not all(p.startswith(prefix) for p in paths):
            continue
        content = item.get("content")
        if not isinstance(content, str) or not content.strip() or paths[0] in seen:
            continue
        seen.add(paths[0])
        out.append(Memory(paths[0], str(item.get("title") or ""), content))
    return out


class ByteRoverClient:
    def __init__(
        self, base_url: str, api_key: str, team_id: str, space_id: str, branch: str, timeout_s: float
    ) -> None:
        self.base_url = (base_url or DEFAULT_URL).rstrip("/")
        self.api_key = api_key
        self.team_id = team_id
        self.space_id = space_id
        self.branch = branch or "main"
        self.timeout_s = timeout_s
        self._sha = SHA_PLACEHOLDER  # the branch head as last seen; guarded by _commit_lock
        self._commit_lock = threading.Lock()

    async def _request(
        self,
        method: str,
        path: str,
        scope: ProviderScope,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json",
            "x-byterover-session-id": scope.session_id,
        }
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
            session.request(method, self.base_url + path, json=json, params=params) as response,
        ):
            if response.status in (429, 503):
                raise RetryLater(
                    f"byterover answered {response.status}", _retry_after(response.headers.get("Retry-After"))
                )
            text = await response.text()
        try:
            body = _json.loads(text) if text else {}
        except ValueError:
            if response.status >= 400:
                raise ProviderError(
                    f"byterover {method} {path}: HTTP {response.status}: {text[:200]}"
                ) from None
            raise ProviderError(f"byterover {method} {path}: not JSON: {text[:200]}") from None
        return response.status, body

    def _call(self, method: str, path: str, scope: ProviderScope, **kw: Any) -> tuple[int, Any]:
        try:
            return _run(self._request(method, path, scope, **kw))
        except (RetryLater, ProviderError):
            raise
        except TimeoutError as e:
            raise ProviderError(f"byterover {method} {path}: timed out after {self.timeout_s} s") from e
        except aiohttp.ClientError as e:
            raise ProviderError(f"byterover {method} {path}: {type(e).__name__}: {e}") from e

    # --- the API -----------------------------------------------------------------------
    def retrieve(
        self, query: str, scope: ProviderScope, folders: Sequence[str], *, limit: int
    ) -> list[Memory]:
        """Memories of ``folders`` (each inside the scope's user folder) for ``query``."""
        params = {"project_id": self.space_id, "query": query or "*", "node_keys": ",".join(folders)}
        status, body = self._call("GET", "/retrieve", scope, params=params)
        if status >= 400:
            raise ProviderError(f"byterover GET /retrieve: HTTP {status}: {str(body)[:200]}")
        common = min(folders, key=len)
        return memories_in(body, common)[:limit]

    def commit(self, changes: Sequence[Mapping[str, Any]], scope: ProviderScope) -> str:
        """Commit ``changes`` (add/edit/delete of files) to the space; the new SHA.

        Commits of this process go one at a time (each names the branch head it builds
        on); a head moved by another writer is answered 400 with the current SHA, and the
        commit is sent once more on top of it."""
        path = (
            f"/organizations/{quote(self.team_id, safe='')}/projects/{quote(self.space_id, safe='')}/commits"
        )
        with self._commit_lock:
            for _ in range(COMMIT_ATTEMPTS):
                body = {
                    "branch": self.branch,
                    "current_sha": self._sha,
                    "memories": [dict(c) for c in changes],
                }
                status, answer = self._call("POST", path, scope, json=body)
                if status < 400 and isinstance(answer, Mapping) and answer.get("success") is not False:
                    self._sha = str(answer.get("commit_sha") or SHA_PLACEHOLDER)
                    return self._sha
                text = _json.dumps(answer) if not isinstance(answer, str) else answer
                found = _CURRENT_SHA.search(text) if status == 400 else None
                if found is None:
                    raise ProviderError(f"byterover POST {path}: HTTP {status}: {text[:200]}")
                self._sha = found.group(1)
        raise ProviderError(f"byterover POST {path}: the branch kept moving ({COMMIT_ATTEMPTS} stale SHAs)")
