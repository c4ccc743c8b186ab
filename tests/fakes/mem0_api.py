"""A fake Mem0 REST API on 127.0.0.1 (aiohttp), from Mem0's public API reference and
the ``mem0ai`` SDK's source: the platform routes the official ``MemoryClient`` calls
(``GET /v1/ping/``, ``POST /v3/memories/add/``, ``POST /v3/memories/search/``,
``POST /v3/memories/``, ``DELETE /v1/memories/?user_id=`` — ``delete_all``) and the
self-hosted server's (no ``/v1``: ``POST /memories``, ``POST /search``, ``GET
/memories``, ``DELETE /memories?user_id=``).

Records every request (method, path, headers, JSON body). ``fail_with(status,
retry_after=…, times=…)`` answers errors, ``down = True`` answers 503 to everything,
``malformed = True`` answers 200 with a non-JSON body, ``hold()`` keeps every answer
back until ``release()`` (a provider that hangs).
Memories are kept per ``user_id``; search returns the user's memories (filter
``user_id`` required, like the platform's v3 search).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)


class FakeMem0:
    def __init__(self, api_key: str = "m0-test") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.memories: dict[str, list[dict[str, Any]]] = {}
        self.down = False
        self.malformed = False
        self._gate: asyncio.Event | None = None
        self._failures: list[tuple[int, str | None]] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def fail_with(self, status: int, *, retry_after: str | None = None, times: int = 1) -> None:
        self._failures.extend([(status, retry_after)] * times)

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def writes(self) -> list[Request]:
        return [
            r for r in self.requests if r.path in ("/v3/memories/add/", "/memories") and r.method == "POST"
        ]

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/v1/ping/", self._ping)
        app.router.add_post("/v3/memories/add/", self._add)
        app.router.add_post("/v3/memories/search/", self._search)
        app.router.add_post("/v3/memories/", self._list)
        app.router.add_post("/memories", self._add)
        app.router.add_post("/search", self._search)
        app.router.add_get("/memories", self._list)
        app.router.add_delete("/v1/memories/", self._delete_all)
        app.router.add_delete("/memories", self._delete_all)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp's TCPSite has a server once started
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.requests.append(
            Request(request.method, request.path, dict(request.headers), body, dict(request.query))
        )
        if self._gate is not None:
            await self._gate.wait()
        if self.down:
            return web.json_response({"detail": "unavailable"}, status=503)
        if self._failures:
            status, retry_after = self._failures.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response({"detail": f"error {status}"}, status=status, headers=headers)
        if request.path.startswith("/v") and request.headers.get("Authorization") != f"Token {self.api_key}":
            return web.json_response({"detail": "Invalid API key"}, status=401)
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        request[BODY] = body
        return await handler(request)

    async def _ping(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "org_id": "org1", "project_id": "proj1", "user_email": "t@example.org"}
        )

    async def _add(self, request: web.Request) -> web.Response:
        body = request[BODY]
        user = body.get("user_id")
        if not user:
            return web.json_response({"detail": "user_id required"}, status=400)
        out = []
        for m in body.get("messages", []):
            item = {
                "id": f"m{sum(map(len, self.memories.values())) + 1}",
                "memory": m["content"],
                "user_id": user,
                "metadata": body.get("metadata"),
            }
            self.memories.setdefault(user, []).append(item)
            out.append({"id": item["id"], "event": "ADD", "data": {"memory": m["content"]}})
        return web.json_response({"results": out})

    def _user_filter(self, body: Any, query: Any) -> str | None:
        filters = (body or {}).get("filters") if isinstance(body, dict) else None
        if isinstance(filters, dict) and filters.get("user_id"):
            return str(filters["user_id"])
        return query.get("user_id")

    async def _search(self, request: web.Request) -> web.Response:
        body = request[BODY]
        if request.path.startswith("/v3") and "user_id" in body:
            return web.json_response(
                {"detail": "top-level entity ids are not allowed; use filters"}, status=400
            )
        user = self._user_filter(body, {})
        if not user:
            return web.json_response({"detail": "filters.user_id required"}, status=400)
        return web.json_response({"results": self.memories.get(user, [])})

    def deletes(self) -> list[Request]:
        return [r for r in self.requests if r.method == "DELETE"]

    async def _delete_all(self, request: web.Request) -> web.Response:
        user = request.query.get("user_id")
        if not user:
            return web.json_response({"detail": "at least one filter is required"}, status=400)
        self.memories.pop(user, None)
        return web.json_response({"message": "Memories deleted successfully!"})

    async def _list(self, request: web.Request) -> web.Response:
        user = self._user_filter(request.get(BODY), request.query)
        if not user:
            return web.json_response({"detail": "user_id required"}, status=400)
        return web.json_response(
            {"count": len(self.memories.get(user, [])), "results": self.memories.get(user, [])}
        )
