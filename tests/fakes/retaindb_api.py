"""A fake RetainDB API v1 on 127.0.0.1 (aiohttp), from RetainDB's public API reference:
``POST /v1/memory``, ``POST /v1/memory/search``, ``POST /v1/memory/ingest/session``,
``GET /v1/memory/profile/{user_id}``, ``DELETE /v1/memory/{id}``; ``Authorization:
Bearer <key>``.

Records every request (method, path, headers, JSON body, query). ``fail_with(status,
retry_after=…, times=…)`` answers errors, ``down = True`` answers 503 to everything,
``malformed = True`` answers 200 with a non-JSON body, ``wrong_shape = True``
200 JSON of the wrong shape, ``hold()`` keeps every answer
back until ``release()``. Memories are kept per ``(project, user_id)``; every route
refuses a request without ``user_id``; search returns the user's memories containing
any word of the query (all of them for an empty match).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)
WRITE_PATHS = ("/v1/memory", "/v1/memory/ingest/session")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)


class FakeRetainDB:
    def __init__(self, api_key: str = "rdb-test") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.memories: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.down = False
        self.malformed = False
        self.wrong_shape = False
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
        return [r for r in self.requests if r.method == "POST" and r.path in WRITE_PATHS]

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/v1/memory", self._write)
        app.router.add_post("/v1/memory/ingest/session", self._ingest)
        app.router.add_post("/v1/memory/search", self._search)
        app.router.add_get("/v1/memory/profile/{user_id}", self._profile)
        app.router.add_delete("/v1/memory/{memory_id}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp's TCPSite has a server once started
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.release()
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
            return web.json_response({"error": "unavailable"}, status=503)
        if self._failures:
            status, retry_after = self._failures.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response({"error": f"error {status}"}, status=status, headers=headers)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "invalid API key"}, status=401)
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        if self.wrong_shape:
            return web.json_response({"results": "not a list", "memories": 3})
        request[BODY] = body
        return await handler(request)

    def _store(self, project: str, user: str, content: str, body: dict[str, Any]) -> dict[str, Any]:
        n = sum(map(len, self.memories.values())) + 1
        item = {
            "id": f"mem_{n}",
            "content": content,
            "memory_type": body.get("memory_type", "fact"),
            "user_id": user,
            "session_id": body.get("session_id"),
            "metadata": body.get("metadata"),
        }
        self.memories.setdefault((project, user), []).append(item)
        return item

    @staticmethod
    def _scope(body: Any) -> tuple[str, str] | None:
        if not isinstance(body, dict) or not body.get("user_id") or not body.get("project"):
            return None
        return str(body["project"]), str(body["user_id"])

    async def _write(self, request: web.Request) -> web.Response:
        body = request[BODY]
        scope = self._scope(body)
        if scope is None or not isinstance(body.get("content"), str):
            return web.json_response({"error": "project, user_id and content are required"}, status=400)
        item = self._store(*scope, body["content"], body)
        return web.json_response(
            {"success": True, "mode": body.get("write_mode", "async"), "id": item["id"], "trace_id": "trc_1"}
        )

    async def _ingest(self, request: web.Request) -> web.Response:
        body = request[BODY]
        scope = self._scope(body)
        if scope is None or not body.get("session_id") or not isinstance(body.get("messages"), list):
            return web.json_response(
                {"error": "project, user_id, session_id and messages are required"}, status=400
            )
        for m in body["messages"]:
            if m.get("role") == "user":  # the fake "extracts" what the user said
                self._store(*scope, m["content"], body)
        return web.json_response({"success": True, "job_id": "job_1", "trace_id": "trc_2"})

    async def _search(self, request: web.Request) -> web.Response:
        body = request[BODY]
        scope = self._scope(body)
        if scope is None or not isinstance(body.get("query"), str):
            return web.json_response({"error": "project, user_id and query are required"}, status=400)
        words = {w.lower().strip("?.,!") for w in body["query"].split()}
        mine = self.memories.get(scope, [])
        hits = [m for m in mine if words & {w.lower().strip("?.,!") for w in m["content"].split()}] or mine
        hits = hits[: int(body.get("top_k", 10))]
        results = [
            {
                "memory": {"id": m["id"], "content": m["content"], "memory_type": m["memory_type"]},
                "score": 0.8,
            }
            for m in hits
        ]
        return web.json_response({"results": results, "count": len(results), "trace_id": "trc_3"})

    def deletes(self) -> list[Request]:
        return [r for r in self.requests if r.method == "DELETE"]

    async def _delete(self, request: web.Request) -> web.Response:
        memory_id = request.match_info["memory_id"]
        for items in self.memories.values():
            for item in items:
                if item["id"] == memory_id:
                    items.remove(item)
                    return web.json_response({"success": True, "id": memory_id})
        return web.json_response({"error": f"memory {memory_id} not found"}, status=404)

    async def _profile(self, request: web.Request) -> web.Response:
        project = request.query.get("project")
        if not project:
            return web.json_response({"error": "project is required"}, status=400)
        mine = self.memories.get((project, request.match_info["user_id"]), [])
        return web.json_response(
            {
                "user_id": request.match_info["user_id"],
                "memories": [{"id": m["id"], "content": m["content"]} for m in mine],
            }
        )
