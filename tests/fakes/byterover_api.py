"""A fake ByteRover memory service ("CoGit") on 127.0.0.1 (aiohttp), from the HTTP
calls the ByteRover CLI makes: ``GET /retrieve`` (``project_id``, ``query``,
``node_keys``) and ``POST /organizations/{team}/projects/{space}/commits`` (``branch``,
``current_sha``, ``memories``: add/edit/delete of files); ``Authorization: Bearer
<key>`` and ``x-byterover-session-id``.

Records every request (method, path, headers, JSON body, query). A commit whose
``current_sha`` is not the branch head is answered 400 naming the current SHA, as the
service does. ``fail_with(status, retry_after=…, times=…)`` answers errors, ``down =
True`` 503 to everything, ``malformed = True`` 200 with a non-JSON body, ``wrong_shape =
True`` 200 JSON of the wrong shape, ``leak = True`` adds another folder's file to every
retrieve answer (as "related"), ``hold()`` keeps every answer back until ``release()``.
Files are kept per ``(space, path)``; retrieve returns the files under any of the
``node_keys`` whose content shares a word with the query (all of them for ``*`` or
when none does).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)
RECORD = web.RequestKey("record", object)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)


def _words(text: str) -> set[str]:
    return {w.lower().strip("?.,!:") for w in text.split()}


class FakeByteRover:
    def __init__(self, api_key: str = "brv-test", team: str = "team-1", space: str = "space-1") -> None:
        self.api_key = api_key
        self.team = team
        self.space = space
        self.requests: list[Request] = []
        self.files: dict[str, dict[str, Any]] = {}  # path → {title, content, tags}
        self.head = "sha0"
        self.commits = 0
        self.accepted: list[Request] = []
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
        """The commits the fake accepted (not those refused for a stale SHA)."""
        return list(self.accepted)

    def turn_commits(self) -> list[Request]:
        """The accepted commits that store a turn (a file under a user's ``turns/``)."""
        return [r for r in self.accepted if any("/turns/" in m.get("path", "") for m in r.body["memories"])]

    def user_files(self, user: str, root: str = "mnemo") -> dict[str, dict[str, Any]]:
        prefix = f"{root}/users/{user}/"
        return {p: f for p, f in self.files.items() if p.startswith(prefix)}

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/api/v1/retrieve", self._retrieve)
        app.router.add_post("/api/v1/organizations/{team}/projects/{space}/commits", self._commit)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp's TCPSite has a server once started
        self.base_url = f"http://127.0.0.1:{port}/api/v1"

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
        record = Request(request.method, request.path, dict(request.headers), body, dict(request.query))
        self.requests.append(record)
        if self._gate is not None:
            await self._gate.wait()
        if self.down:
            return web.json_response({"success": False, "message": "unavailable"}, status=503)
        if self._failures:
            status, retry_after = self._failures.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response(
                {"success": False, "message": f"error {status}"}, status=status, headers=headers
            )
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"success": False, "message": "Unauthorized"}, status=401)
        if not request.headers.get("x-byterover-session-id"):
            return web.json_response(
                {"success": False, "message": "session id header is required"}, status=400
            )
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        if self.wrong_shape:
            return web.json_response({"memories": "not a list", "success": True})
        request[BODY] = body
        request[RECORD] = record
        return await handler(request)

    async def _retrieve(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("project_id") != self.space or "query" not in q:
            return web.json_response(
                {"success": False, "message": "project_id and query are required"}, status=400
            )
        keys = [k for k in q.get("node_keys", "").split(",") if k]
        if not keys:  # mnemo always narrows to a user's folder; the fake refuses a space-wide search
            return web.json_response(
                {"success": False, "message": "node_keys required by this fake"}, status=400
            )
        inside = {p: f for p, f in self.files.items() if any(p.startswith(k.rstrip("/") + "/") for k in keys)}
        words = _words(q["query"])
        hits = {p: f for p, f in inside.items() if words & _words(f["content"])} if q["query"] != "*" else {}
        hits = hits or inside
        memories = [
            {
                "id": f"m{i}",
                "title": f["title"],
                "content": f["content"],
                "score": 0.8,
                "node_keys": [p],
                "parent_ids": [],
                "children_ids": [],
            }
            for i, (p, f) in enumerate(sorted(hits.items()))
        ]
        related = []
        if self.leak:
            others = [(p, f) for p, f in sorted(self.files.items()) if p not in inside]
            related = [
                {"id": "x", "title": f["title"], "content": f["content"], "score": 0.4, "node_keys": [p]}
                for p, f in others[:1]
            ]
            related.append(
                {"id": "y", "title": "no path", "content": "a memory without a path", "score": 0.3}
            )
        return web.json_response({"memories": memories, "related_memories": related})

    async def _commit(self, request: web.Request) -> web.Response:
        body = request[BODY]
        if request.match_info["team"] != self.team or request.match_info["space"] != self.space:
            return web.json_response({"success": False, "message": "Space not found"}, status=404)
        if not isinstance(body, dict) or not isinstance(body.get("memories"), list) or not body.get("branch"):
            return web.json_response(
                {"success": False, "message": "branch and memories are required"}, status=400
            )
        if body.get("current_sha") != self.head:
            return web.json_response(
                {
                    "success": False,
                    "message": "SHA mismatch",
                    "error": f"Expected SHA '{body.get('current_sha')}' but current SHA is '{self.head}'",
                },
                status=400,
            )
        for m in body["memories"]:
            op, path = m.get("operation"), m.get("path")
            if op not in ("add", "edit", "delete") or not isinstance(path, str) or not path.strip():
                return web.json_response({"success": False, "message": f"bad memory {m}"}, status=400)
            if op == "delete":
                self.files.pop(path, None)
            else:
                self.files[path] = {
                    "title": m.get("title", ""),
                    "content": m.get("content", ""),
                    "tags": m.get("tags", []),
                }
        self.commits += 1
        self.head = f"sha{self.commits}"
        self.accepted.append(request[RECORD])
        return web.json_response({"success": True, "commit_sha": self.head, "message": "Commit successful"})
