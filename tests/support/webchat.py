"""A websocket client for the web chat, speaking the page's protocol (adapters/web.py).

Frames are buffered, so a test asks for the next frame of a kind (``await
chat.next("reply")``) without caring about typing frames in between.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import aiohttp

from mnemo.app import App, open_app
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer

_ids = itertools.count(1)


class ChatClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, user: str) -> None:
        self.ws = ws
        self.user = user
        self.buffer: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, http: aiohttp.ClientSession, base_url: str, user: str, **kw: Any) -> ChatClient:
        ws = await http.ws_connect(f"{base_url}/ws", params={"user": user, **kw.pop("params", {})}, **kw)
        client = cls(ws, user)
        hello = await client.next("hello")
        assert hello["user"] == user
        return client

    async def say(self, text: str, message_id: str | None = None) -> str:
        message_id = message_id or f"m{next(_ids)}"
        await self.send({"type": "message", "id": message_id, "text": text})
        return message_id

    async def send(self, frame: Any) -> None:
        await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def next(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next frame of ``kind``; frames of other kinds stay in the buffer."""

        async def read() -> dict[str, Any]:
            while True:
                for i, frame in enumerate(self.buffer):
                    if frame["type"] == kind:
                        return self.buffer.pop(i)
                msg = await self.ws.receive()
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    raise ConnectionError(f"websocket ended while waiting for {kind!r}: {msg.type.name}")
                self.buffer.append(json.loads(msg.data))

        return await asyncio.wait_for(read(), timeout)

    def kinds(self) -> list[str]:
        return [f["type"] for f in self.buffer]

    async def close(self) -> None:
        await self.ws.close()


def web_settings(home: Path, **overrides: Any) -> Settings:
    base = {"web.port": 0, "llm.max_retries": 1, "llm.retry_after_cap_s": 0.05}
    base.update(overrides)
    return load_settings(home, environ={}, overrides=base)


def open_web_app(settings: Settings, llm_base_url: str, *, extra_adapters: tuple[Any, ...] = ()) -> Any:
    """open_app with the real WebServer + WebAdapter (as ``mnemo run`` wires them)."""
    from mnemo.adapters.web import WebAdapter

    server = WebServer(settings.web, Metrics())
    adapter = WebAdapter(server, uploads_dir=settings.home / "media" / "uploads")
    return open_app(
        settings,
        adapters=[adapter, *extra_adapters],
        web=server,
        llm_base_url=llm_base_url,
        api_key="test-key",
        trial=False,
    )


async def outbox_rows(app: App, chat_id: str) -> list[dict[str, Any]]:
    rows = await app.db.read(
        lambda c: c.execute(
            "SELECT id, state, attempts, not_before FROM outbox WHERE chat_id = ? ORDER BY id", (chat_id,)
        ).fetchall()
    )
    return [dict(r) for r in rows]
