"""A fake OpenViking server on 127.0.0.1 (aiohttp), from OpenViking's HTTP API as its
SDK (``openviking-sdk``) calls it: ``POST /api/v1/search/find``, ``POST
/api/v1/content/write``, ``GET /api/v1/content/read``, ``DELETE /api/v1/fs``, ``GET
/api/v1/sessions[/{id}]`` (``auto_create``), ``POST /api/v1/sessions/{id}/messages/batch``,
``POST /api/v1/sessions/{id}/commit``, ``DELETE /api/v1/sessions/{id}``, ``GET /health``.
Answers are ``{"status": "ok", "result": …}`` or ``{"status": "error", "error": {"code",
"message"}}``; ``X-API-Key`` authenticates, and — a root key in trusted mode — every
request names its tenant in ``X-OpenViking-Account`` / ``X-OpenViking-User`` (refused
without them).

Records every request (method, path, headers, JSON body, query). ``fail_with(status,
retry_after=…, times=…)`` answers errors, ``down = True`` 503 to everything,
``malformed = True`` 200 with a non-JSON body, ``wrong_shape = True`` a result of the
wrong shape, ``leak = True`` adds another user's memory and a resource to every find,
``hold()`` keeps every answer back until ``release()``. Files are kept per ``(account,
user)``; a commit "extracts" each user message of the session since the last commit
into ``viking://user/memories/events/<n>.md``; find returns the files under
``target_uri`` that share a word with the query (all of them when none does).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)
TENANT = web.RequestKey("tenant", tuple)
WRITE_PATHS = ("/api/v1/content/write", "/messages/batch", "/commit")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)
    tenant: str = ""  # "account/user" of the X-OpenViking-* headers


def _words(text: str) -> set[str]:
    return {w.lower().strip("?.,!:") for w in text.split()}


def _ok(result: Any) -> web.Response:
    return web.json_response({"status": "ok", "result": result})


def _error(status: int, code: str, message: str, **details: Any) -> web.Response:
    return web.json_response(
        {"status": "error", "error": {"code": code, "message": message, "details": details}}, status=status
    )


class FakeOpenViking:
    def __init__(self, api_key: str = "ov-root") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.files: dict[tuple[str, str], dict[str, str]] = {}  # (account, user) → uri → content
        self.sessions: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # … → id → {messages, committed}
        self.down = False
        self.malformed = False
        self.wrong_shape = False
        self.leak = False
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
        return [r for r in self.requests if r.method == "POST" and r.path.endswith(WRITE_PATHS)]

    def message_posts(self) -> list[Request]:
        """The requests that add a turn's messages to a session."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/messages/batch")]

    def memories(self, account: str, user: str) -> dict[str, str]:
        return {
            u: c
            for u, c in self.files.get((account, user), {}).items()
            if u.startswith("viking://user/memories/")
        }

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/health", self._health)
        app.router.add_post("/api/v1/search/find", self._find)
        app.router.add_post("/api/v1/content/write", self._write)
        app.router.add_get("/api/v1/content/read", self._read)
        app.router.add_delete("/api/v1/fs", self._rm)
        app.router.add_get("/api/v1/sessions", self._list_sessions)
        app.router.add_get("/api/v1/sessions/{sid}", self._get_session)
        app.router.add_delete("/api/v1/sessions/{sid}", self._delete_session)
        app.router.add_post("/api/v1/sessions/{sid}/messages/batch", self._add_messages)
        app.router.add_post("/api/v1/sessions/{sid}/commit", self._commit)
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
        tenant = f"{request.headers.get('X-OpenViking-Account', '')}/{request.headers.get('X-OpenViking-User', '')}"
        self.requests.append(
            Request(request.method, request.path, dict(request.headers), body, dict(request.query), tenant)
        )
        if self._gate is not None:
            await self._gate.wait()
        if self.down:
            return _error(503, "UNAVAILABLE", "service unavailable", service="openviking", reason="down")
        if self._failures:
            status, retry_after = self._failures.pop(0)
            if status >= 500 and status != 503:
                return web.Response(
                    text=f"upstream error {status}", status=status
                )  # a proxy's plain-text page
            response = _error(
                status, "RESOURCE_EXHAUSTED" if status == 429 else "UNAVAILABLE", f"error {status}"
            )
            if retry_after is not None:
                response.headers["Retry-After"] = retry_after
            return response
        if request.path == "/health":
            return await handler(request)
        if request.headers.get("X-API-Key") != self.api_key:
            return _error(401, "UNAUTHENTICATED", "invalid API key")
        account, user = request.headers.get("X-OpenViking-Account"), request.headers.get("X-OpenViking-User")
        if not account or not user:
            return _error(
                400, "INVALID_ARGUMENT", "a root key must name X-OpenViking-Account and X-OpenViking-User"
            )
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        if self.wrong_shape:
            return _ok({"memories": "not a list"})
        request[BODY] = body
        request[TENANT] = (account, user)
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _tree(self, request: web.Request) -> dict[str, str]:
        return self.files.setdefault(request[TENANT], {})

    async def _find(self, request: web.Request) -> web.Response:
        body = request[BODY]
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return _error(400, "INVALID_ARGUMENT", "query is required")
        target = str(body.get("target_uri") or "viking://").rstrip("/") + "/"
        inside = {
            u: c
            for u, c in self._tree(request).items()
            if u.startswith(target) and not u.endswith("/profile.md")
        }
        words = _words(body["query"])
        hits = {u: c for u, c in inside.items() if words & _words(c)} or inside
        limit = int(body.get("limit", 10))
        memories = [
            {"uri": u, "context_type": "memory", "is_leaf": True, "abstract": c, "score": 0.8}
            for u, c in sorted(hits.items())[:limit]
        ]
        if self.leak:
            for (acc, usr), tree in self.files.items():
                if (acc, usr) != request[TENANT]:
                    memories += [
                        {
                            "uri": f"viking://user/{usr}/memories/{u.rsplit('/', 1)[-1]}",
                            "abstract": c,
                            "score": 0.5,
                        }
                        for u, c in tree.items()
                    ]
            memories.append(
                {"uri": "viking://resources/handbook.md", "abstract": "a shared resource", "score": 0.4}
            )
            memories.append({"abstract": "a memory without a URI", "score": 0.3})
        return _ok({"memories": memories, "resources": [], "skills": [], "total": len(memories)})

    async def _write(self, request: web.Request) -> web.Response:
        body = request[BODY]
        if (
            not isinstance(body, dict)
            or not str(body.get("uri", "")).startswith("viking://")
            or not isinstance(body.get("content"), str)
        ):
            return _error(400, "INVALID_ARGUMENT", "uri and content are required")
        tree = self._tree(request)
        if body.get("mode") == "create" and body["uri"] in tree:
            return _error(409, "ALREADY_EXISTS", "exists", resource=body["uri"], type="file")
        tree[body["uri"]] = body["content"]
        return _ok({"uri": body["uri"], "mode": body.get("mode")})

    async def _read(self, request: web.Request) -> web.Response:
        uri = request.query.get("uri", "")
        tree = self._tree(request)
        if uri not in tree:
            return _error(404, "NOT_FOUND", "not found", resource=uri, type="file")
        return _ok(tree[uri])

    async def _rm(self, request: web.Request) -> web.Response:
        uri = request.query.get("uri", "").rstrip("/")
        tree = self._tree(request)
        gone = [
            u
            for u in tree
            if u == uri or (request.query.get("recursive") == "true" and u.startswith(uri + "/"))
        ]
        if not gone:
            return _error(404, "NOT_FOUND", "not found", resource=uri, type="directory")
        for u in gone:
            del tree[u]
        return _ok({"uri": uri})

    def _session(self, request: web.Request, create: bool) -> dict[str, Any] | None:
        mine = self.sessions.setdefault(request[TENANT], {})
        sid = request.match_info["sid"]
        if sid not in mine and create:
            mine[sid] = {"messages": [], "committed": 0}
        return mine.get(sid)

    async def _list_sessions(self, request: web.Request) -> web.Response:
        return _ok(
            [
                {"session_id": sid, "message_count": len(s["messages"])}
                for sid, s in self.sessions.get(request[TENANT], {}).items()
            ]
        )

    async def _get_session(self, request: web.Request) -> web.Response:
        s = self._session(request, request.query.get("auto_create") == "true")
        if s is None:
            return _error(404, "NOT_FOUND", "no session", resource=request.match_info["sid"], type="session")
        return _ok({"session_id": request.match_info["sid"], "message_count": len(s["messages"])})

    async def _delete_session(self, request: web.Request) -> web.Response:
        if self.sessions.get(request[TENANT], {}).pop(request.match_info["sid"], None) is None:
            return _error(404, "NOT_FOUND", "no session", resource=request.match_info["sid"], type="session")
        return _ok(None)

    async def _add_messages(self, request: web.Request) -> web.Response:
        s = self._session(request, False)
        body = request[BODY]
        if s is None:
            return _error(404, "NOT_FOUND", "no session", resource=request.match_info["sid"], type="session")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "INVALID_ARGUMENT", "messages are required")
        for m in body["messages"]:
            if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
                return _error(400, "INVALID_ARGUMENT", f"bad message {m}")
        s["messages"].extend(body["messages"])
        return _ok({"session_id": request.match_info["sid"], "added": len(body["messages"])})

    async def _commit(self, request: web.Request) -> web.Response:
        s = self._session(request, False)
        if s is None:
            return _error(404, "NOT_FOUND", "no session", resource=request.match_info["sid"], type="session")
        tree = self._tree(request)
        fresh = s["messages"][s["committed"] :]
        for m in fresh:
            if m["role"] == "user":
                n = sum(1 for u in tree if "/events/" in u) + 1
                tree[f"viking://user/memories/events/mem_{n}.md"] = m["content"]
        s["committed"] = len(s["messages"])
        return _ok({"session_id": request.match_info["sid"], "status": "committed", "archived": bool(fresh)})
