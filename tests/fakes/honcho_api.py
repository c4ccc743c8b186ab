"""A fake Honcho v3 REST API on 127.0.0.1 (aiohttp), from the ``honcho-ai`` SDK's route
table (``honcho.http.routes``) and request bodies: get-or-create ``POST
/v3/workspaces``, ``…/peers``, ``…/sessions``; ``POST …/sessions/{s}/messages``;
``GET …/peers/{p}/context``, ``GET …/peers/{p}/card``, ``POST …/peers/{p}/search``;
``POST …/conclusions``; ``POST …/schedule_dream``; and what erasure uses: ``POST
…/peers/{p}/sessions`` and ``GET …/sessions/{s}/peers`` (pages), ``DELETE
…/sessions/{s}`` (with its messages), ``POST …/conclusions/list`` (page, filter
``observed_id``), ``DELETE …/conclusions/{c}``, ``PUT …/peers/{p}/card``.

Records every request (method, path, headers, JSON body, query). ``fail_with(status,
retry_after=…, times=…)`` answers errors, ``down = True`` answers 503 to everything,
``malformed = True`` answers 200 with a non-JSON body. With ``api_key`` set, a request
without ``Authorization: Bearer <key>`` gets 401; ``api_key=None`` is a self-hosted
server without auth. State is per workspace: messages per session (each names its
peer), conclusions per observed peer. A peer's context/card/search return only what
that peer said or what was concluded about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)
NOW = "2026-01-01T00:00:00Z"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    query: dict[str, str] = field(default_factory=dict)


class FakeHoncho:
    def __init__(self, api_key: str | None = "hc-test") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.workspaces: set[str] = set()
        self.peers: dict[str, set[str]] = {}
        self.sessions: dict[tuple[str, str], dict[str, Any]] = {}
        self.messages: list[dict[str, Any]] = []  # each with workspace_id, session_id, peer_id
        self.conclusions: list[dict[str, Any]] = []
        self.dreams: list[dict[str, Any]] = []
        self.cards: dict[tuple[str, str], list[str]] = {}  # set with PUT …/card
        self.down = False
        self.malformed = False
        self._failures: list[tuple[int, str | None]] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def fail_with(self, status: int, *, retry_after: str | None = None, times: int = 1) -> None:
        self._failures.extend([(status, retry_after)] * times)

    def message_posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/messages")]

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        w = "/v3/workspaces"
        app.router.add_post(w, self._workspace)
        app.router.add_post(w + "/{w}/peers", self._peer)
        app.router.add_post(w + "/{w}/sessions", self._session)
        app.router.add_post(w + "/{w}/sessions/{s}/messages", self._add_messages)
        app.router.add_get(w + "/{w}/peers/{p}/context", self._context)
        app.router.add_get(w + "/{w}/peers/{p}/card", self._card)
        app.router.add_post(w + "/{w}/peers/{p}/search", self._search)
        app.router.add_post(w + "/{w}/conclusions", self._conclude)
        app.router.add_post(w + "/{w}/schedule_dream", self._dream)
        app.router.add_post(w + "/{w}/peers/{p}/sessions", self._peer_sessions)
        app.router.add_get(w + "/{w}/sessions/{s}/peers", self._session_peers)
        app.router.add_delete(w + "/{w}/sessions/{s}", self._delete_session)
        app.router.add_post(w + "/{w}/conclusions/list", self._list_conclusions)
        app.router.add_delete(w + "/{w}/conclusions/{c}", self._delete_conclusion)
        app.router.add_put(w + "/{w}/peers/{p}/card", self._set_card)
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
        if self.down:
            return web.json_response({"detail": "service unavailable"}, status=503)
        if self._failures:
            status, retry_after = self._failures.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return web.json_response({"detail": f"error {status}"}, status=status, headers=headers)
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"detail": "Invalid API key"}, status=401)
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        ws = request.match_info.get("w")
        if ws is not None and ws not in self.workspaces:
            return web.json_response({"detail": f"workspace {ws} not found"}, status=404)
        peer = request.match_info.get("p")
        if peer is not None and peer not in self.peers.get(ws or "", set()):
            return web.json_response({"detail": f"peer {peer} not found"}, status=404)
        request[BODY] = body
        return await handler(request)

    async def _workspace(self, request: web.Request) -> web.Response:
        ws = str(request[BODY]["id"])
        self.workspaces.add(ws)
        return web.json_response({"id": ws, "metadata": {}, "configuration": {}, "created_at": NOW})

    async def _peer(self, request: web.Request) -> web.Response:
        ws, peer = request.match_info["w"], str(request[BODY]["id"])
        self.peers.setdefault(ws, set()).add(peer)
        return web.json_response(
            {"id": peer, "workspace_id": ws, "metadata": {}, "configuration": {}, "created_at": NOW}
        )

    async def _session(self, request: web.Request) -> web.Response:
        ws, body = request.match_info["w"], request[BODY]
        session = self.sessions.setdefault((ws, str(body["id"])), {"peers": {}})
        for peer, config in (body.get("peers") or {}).items():
            self.peers.setdefault(ws, set()).add(peer)
            session["peers"][peer] = config
        return web.json_response(
            {
                "id": body["id"],
                "workspace_id": ws,
                "is_active": True,
                "metadata": {},
                "configuration": {},
                "created_at": NOW,
            }
        )

    async def _add_messages(self, request: web.Request) -> web.Response:
        ws, sid = request.match_info["w"], request.match_info["s"]
        if (ws, sid) not in self.sessions:
            return web.json_response({"detail": "session not found"}, status=404)
        out = []
        for m in request[BODY]["messages"]:
            if not m.get("peer_id") or not isinstance(m.get("content"), str):
                return web.json_response({"detail": "peer_id and content required"}, status=422)
            item = {
                "id": f"msg{len(self.messages) + 1}",
                "content": m["content"],
                "peer_id": m["peer_id"],
                "session_id": sid,
                "workspace_id": ws,
                "metadata": m.get("metadata") or {},
                "created_at": NOW,
                "token_count": len(m["content"].split()),
            }
            self.messages.append(item)
            self.peers.setdefault(ws, set()).add(m["peer_id"])
            out.append(item)
        return web.json_response(out)

    def _said(self, ws: str, peer: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["workspace_id"] == ws and m["peer_id"] == peer]

    def _about(self, ws: str, peer: str) -> list[str]:
        return [
            c["content"] for c in self.conclusions if c["workspace_id"] == ws and c["observed_id"] == peer
        ]

    async def _context(self, request: web.Request) -> web.Response:
        ws, peer = request.match_info["w"], request.match_info["p"]
        said = [m["content"] for m in self._said(ws, peer)]
        representation = "\n".join(f"The user said: {s}" for s in said)
        return web.json_response(
            {
                "peer_id": peer,
                "target_id": request.query.get("target", peer),
                "representation": representation,
                "peer_card": self._about(ws, peer),
            }
        )

    async def _card(self, request: web.Request) -> web.Response:
        ws, peer = request.match_info["w"], request.match_info["p"]
        return web.json_response({"peer_card": self.cards.get((ws, peer)) or self._about(ws, peer)})

    async def _search(self, request: web.Request) -> web.Response:
        ws, peer, body = request.match_info["w"], request.match_info["p"], request[BODY]
        words = {w.lower() for w in str(body.get("query", "")).split()}
        hits = [
            m for m in self._said(ws, peer) if words & {w.lower().strip(".,!?") for w in m["content"].split()}
        ]
        return web.json_response(hits[: int(body.get("limit") or 10)])

    async def _conclude(self, request: web.Request) -> web.Response:
        ws, out = request.match_info["w"], []
        for c in request[BODY]["conclusions"]:
            item = {"id": f"c{len(self.conclusions) + 1}", "workspace_id": ws, "created_at": NOW, **c}
            self.conclusions.append(item)
            out.append(item)
        return web.json_response(out)

    def deletes(self) -> list[Request]:
        return [r for r in self.requests if r.method == "DELETE"]

    @staticmethod
    def _page(items: list[dict[str, Any]]) -> web.Response:
        return web.json_response(
            {"items": items, "total": len(items), "page": 1, "size": max(1, len(items)), "pages": 1}
        )

    async def _peer_sessions(self, request: web.Request) -> web.Response:
        ws, peer = request.match_info["w"], request.match_info["p"]
        return self._page(
            [
                {
                    "id": sid,
                    "workspace_id": ws,
                    "is_active": True,
                    "metadata": {},
                    "configuration": {},
                    "created_at": NOW,
                }
                for (w, sid), session in self.sessions.items()
                if w == ws and peer in session["peers"]
            ]
        )

    async def _session_peers(self, request: web.Request) -> web.Response:
        ws, sid = request.match_info["w"], request.match_info["s"]
        session = self.sessions.get((ws, sid))
        if session is None:
            return web.json_response({"detail": "session not found"}, status=404)
        return self._page(
            [
                {"id": p, "workspace_id": ws, "metadata": {}, "configuration": {}, "created_at": NOW}
                for p in session["peers"]
            ]
        )

    async def _delete_session(self, request: web.Request) -> web.Response:
        ws, sid = request.match_info["w"], request.match_info["s"]
        if self.sessions.pop((ws, sid), None) is None:
            return web.json_response({"detail": "session not found"}, status=404)
        self.messages = [m for m in self.messages if not (m["workspace_id"] == ws and m["session_id"] == sid)]
        return web.Response(status=204)

    async def _list_conclusions(self, request: web.Request) -> web.Response:
        ws = request.match_info["w"]
        filters = (request[BODY] or {}).get("filters") or {}
        return self._page(
            [
                c
                for c in self.conclusions
                if c["workspace_id"] == ws and all(c.get(k) == v for k, v in filters.items())
            ]
        )

    async def _delete_conclusion(self, request: web.Request) -> web.Response:
        ws, cid = request.match_info["w"], request.match_info["c"]
        before = len(self.conclusions)
        self.conclusions = [c for c in self.conclusions if not (c["workspace_id"] == ws and c["id"] == cid)]
        if len(self.conclusions) == before:
            return web.json_response({"detail": "conclusion not found"}, status=404)
        return web.Response(status=204)

    async def _set_card(self, request: web.Request) -> web.Response:
        card = list((request[BODY] or {}).get("peer_card") or [])
        self.cards[(request.match_info["w"], request.match_info["p"])] = card
        return web.json_response({"peer_card": card})

    async def _dream(self, request: web.Request) -> web.Response:
        self.dreams.append({"workspace_id": request.match_info["w"], **request[BODY]})
        return web.Response(status=204)
