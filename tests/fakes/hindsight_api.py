"""A fake Hindsight API on 127.0.0.1 (aiohttp), from the public API reference and the
``hindsight-client`` SDK's generated routes: retain ``POST
/v1/default/banks/{bank}/memories`` (``{"items": [{content, context, metadata,
document_id, tags, update_mode}], "async": false}``), recall ``POST
…/memories/recall``, reflect ``POST …/reflect`` and delete bank ``DELETE
/v1/default/banks/{bank}`` (404 for a bank that does not exist). Banks are created on
first retain, as the server does. A memory with the same ``document_id`` and
``update_mode="replace"`` replaces the earlier one.

Records every request; ``down`` answers 503, ``fail_with(status, retry_after=…)``
queues errors, ``malformed`` answers 200 with a non-JSON body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

BODY = web.RequestKey("body", object)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    bank: str


class FakeHindsight:
    def __init__(self, api_key: str | None = "hs-test") -> None:
        self.api_key = api_key
        self.requests: list[Request] = []
        self.banks: dict[str, dict[str, dict[str, Any]]] = {}  # bank → document_id → item
        self.down = False
        self.malformed = False
        self._failures: list[tuple[int, str | None]] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def fail_with(self, status: int, *, retry_after: str | None = None, times: int = 1) -> None:
        self._failures.extend([(status, retry_after)] * times)

    def retains(self) -> list[Request]:
        return [r for r in self.requests if r.path.endswith("/memories") and r.method == "POST"]

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/v1/default/banks/{bank}/memories", self._retain)
        app.router.add_post("/v1/default/banks/{bank}/memories/recall", self._recall)
        app.router.add_post("/v1/default/banks/{bank}/reflect", self._reflect)
        app.router.add_delete("/v1/default/banks/{bank}", self._delete_bank)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]  # aiohttp's TCPSite has a server once started

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
            Request(
                request.method, request.path, dict(request.headers), body, request.match_info.get("bank", "")
            )
        )
        if self.down:
            return web.json_response({"detail": "unavailable"}, status=503)
        if self._failures:
            status, after = self._failures.pop(0)
            return web.json_response(
                {"detail": f"error {status}"}, status=status, headers={"Retry-After": after} if after else {}
            )
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"detail": "unauthorized"}, status=401)
        if self.malformed:
            return web.Response(text="<html>oops", content_type="text/html")
        request[BODY] = body
        return await handler(request)

    async def _retain(self, request: web.Request) -> web.Response:
        bank = request.match_info["bank"]
        items = request[BODY]["items"]
        docs = self.banks.setdefault(bank, {})
        for i, item in enumerate(items):
            doc = item.get("document_id") or f"auto-{len(docs)}-{i}"
            docs[doc] = item
        return web.json_response(
            {"success": True, "bank_id": bank, "items_count": len(items), "async": False}
        )

    async def _recall(self, request: web.Request) -> web.Response:
        bank = request.match_info["bank"]
        results = [
            {"id": doc, "text": item["content"], "type": "experience", "document_id": doc}
            for doc, item in self.banks.get(bank, {}).items()
        ]
        return web.json_response({"results": results})

    def deletes(self) -> list[Request]:
        return [r for r in self.requests if r.method == "DELETE"]

    async def _delete_bank(self, request: web.Request) -> web.Response:
        bank = request.match_info["bank"]
        if bank not in self.banks:
            return web.json_response({"detail": f"bank {bank} not found"}, status=404)
        count = len(self.banks.pop(bank))
        return web.json_response({"success": True, "message": f"bank {bank} deleted", "deleted_count": count})

    async def _reflect(self, request: web.Request) -> web.Response:
        bank = request.match_info["bank"]
        known = "; ".join(item["content"] for item in self.banks.get(bank, {}).values())
        return web.json_response({"text": f"Based on memory: {known}" if known else "I know nothing yet."})
