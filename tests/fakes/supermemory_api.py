"""A fake Supermemory API v5 on 127.0.0.1 (aiohttp), from Supermemory's public v5 API
reference and the official SDK's request shapes: ``POST /ns/{namespace}/document``,
``POST /ns/{namespace}/search``, ``POST /ns/{namespace}/profile``,
``DELETE /ns/{namespace}``; ``Authorization: Bearer <key>``.

Records every request (method, path, namespace, headers, JSON body, query).
``fail_with(status, retry_after=…, times=…)`` answers errors, ``down = True`` answers
503 to everything, ``malformed = True`` answers 200 with a non-JSON body,
``wrong_shape = True`` 200 JSON of the wrong shape, ``hold()`` keeps every answer back
(``hold("/document")``: only those to paths ending so) until ``release()``; a held
request is still processed once released, as a server would after the client died.

Documents are kept per namespace and id: the same id with the same content is an
unchanged duplicate (``status: done``, nothing new), new content under an id is
appended. The fake "extracts" memories: the ``user:`` lines of a transcript, or the
whole text of a plain document. Search returns the namespace's memories sharing a word
with the query (all of them when none does); the profile lists them as static facts.
A namespace that does not match Supermemory's rule (``^[A-Za-z0-9_:-]{1,100}$``) is a
400, a deleted or never-used one a 404 on delete.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_:-]{1,100}$")


@dataclass
class Request:
    method: str
    path: str
    namespace: str | None
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)


@dataclass
class Document:
    id: str
    contents: list[str]
    metadata: dict[str, Any]


def _words(text: str) -> set[str]:
    return {w.lower().strip("?.,!:") for w in text.split()} - {""}


class FakeSupermemory:
    def __init__(self, api_key: str = "sm-test") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.documents: dict[str, dict[str, Document]] = {}
        self.memories: dict[str, list[dict[str, Any]]] = {}
        self.down = False
        self.malformed = False
        self.wrong_shape = False
        self._gate: asyncio.Event | None = None
        self._gate_suffix = ""
        self._failures: list[tuple[int, str | None]] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def fail_with(self, status: int, *, retry_after: str | None = None, times: int = 1) -> None:
        self._failures.extend([(status, retry_after)] * times)

    def hold(self, suffix: str = "") -> None:
        self._gate, self._gate_suffix = asyncio.Event(), suffix

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/document")]

    def texts(self, namespace: str) -> list[str]:
        return [m["memory"] for m in self.memories.get(namespace, [])]

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/ns/{namespace}/document", self._add)
        app.router.add_post("/ns/{namespace}/search", self._search)
        app.router.add_post("/ns/{namespace}/profile", self._profile)
        app.router.add_delete("/ns/{namespace}", self._delete)
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
        namespace = request.match_info.get("namespace")
        self.requests.append(
            Request(request.method, request.path, namespace, dict(request.headers), body, dict(request.query))
        )
        if self._gate is not None and request.path.endswith(self._gate_suffix):
            await self._gate.wait()
        if self.down:
            return web.json_response({"error": "Service unavailable"}, status=503)
        if self._failures:
            status, retry_after = self._failures.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response({"error": f"error {status}"}, status=status, headers=headers)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if namespace is None or not NAMESPACE_RE.fullmatch(namespace):
            return web.json_response({"error": "Invalid namespace", "details": str(namespace)}, status=400)
        if self.malformed:
            return web.Response(text="<html>bad gateway page", content_type="text/html")
        if self.wrong_shape:
            return web.json_response({"results": "not a list", "profile": "none", "status": 7})
        request[BODY] = body
        return await handler(request)

    def _extract(self, namespace: str, doc: Document, content: str) -> None:
        lines = [ln[len("user: ") :] for ln in content.splitlines() if ln.startswith("user: ")]
        for text in lines or [content]:
            n = sum(map(len, self.memories.values())) + 1
            self.memories.setdefault(namespace, []).append(
                {"id": f"mem_{n}", "memory": text, "document": doc.id, "metadata": doc.metadata}
            )

    async def _add(self, request: web.Request) -> web.Response:
        body, namespace = request[BODY], request.match_info["namespace"]
        if not isinstance(body, dict) or not isinstance(body.get("content"), str) or not body["content"]:
            return web.json_response({"error": "content is required"}, status=400)
        docs = self.documents.setdefault(namespace, {})
        doc_id = str(body.get("id") or f"doc_{sum(map(len, self.documents.values())) + 1}")
        doc = docs.get(doc_id)
        if doc is not None and body["content"] in doc.contents:
            return web.json_response({"id": doc_id, "status": "done"})  # an unchanged duplicate
        if doc is None:
            doc = docs[doc_id] = Document(doc_id, [], dict(body.get("metadata") or {}))
        doc.contents.append(body["content"])
        self._extract(namespace, doc, body["content"])
        return web.json_response({"id": doc_id, "status": "queued"})

    async def _search(self, request: web.Request) -> web.Response:
        body, namespace = request[BODY], request.match_info["namespace"]
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return web.json_response({"error": "query is required"}, status=400)
        words = _words(body["query"])
        mine = self.memories.get(namespace, [])
        hits = [m for m in mine if words & _words(m["memory"])] or mine
        hits = hits[: int(body.get("limit") or 10)]
        results = [
            {
                "id": m["id"],
                "memory": m["memory"],
                "metadata": m["metadata"],
                "similarity": 0.8,
                "isLatest": True,
                "isInference": False,
                "system": {"updatedAt": "2026-01-01T00:00:00Z"},
            }
            for m in hits
        ]
        return web.json_response({"results": results, "searchTime": 3.5})

    async def _profile(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        facts = [{"id": m["id"], "memory": m["memory"]} for m in self.memories.get(namespace, [])]
        return web.json_response({"profile": {"static": facts, "dynamic": [], "buckets": {}}})

    async def _delete(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        if namespace not in self.documents and namespace not in self.memories:
            return web.json_response({"error": "Namespace not found"}, status=404)
        docs = self.documents.pop(namespace, {})
        mems = self.memories.pop(namespace, [])
        return web.json_response(
            {
                "status": "deleted",
                "namespace": namespace,
                "deletedDocumentsCount": len(docs),
                "deletedMemoriesCount": len(mems),
            }
        )
