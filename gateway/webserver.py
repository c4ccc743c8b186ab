"""The one local HTTP server: ``/healthz``, ``/metrics``, and whatever routes adapters
add (the web chat page and its websocket; a Telegram webhook).

It binds 127.0.0.1 by default. Binding any other address requires ``web.access_token``
(``MNEMO_WEB_TOKEN``): the chat page would otherwise let anyone on the network talk to
the bot as its operator. ``port: 0`` picks a free port (``url`` tells which).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from mnemo.gateway.config import WebSettings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import CONTENT_TYPE, Metrics

log = get_logger(__name__)

HealthProbe = Callable[[], Awaitable[dict[str, Any]]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebServer:
    def __init__(self, settings: WebSettings, metrics: Metrics) -> None:
        if not is_loopback(settings.host) and settings.access_token is None:
            raise StartupError(
                f"web.host={settings.host!r} is not a loopback address: set web.access_token "
                "(MNEMO_WEB_TOKEN) before exposing the web chat, or bind 127.0.0.1"
            )
        self.settings = settings
        self.metrics = metrics
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/metrics", self._metrics)
        self._health: HealthProbe | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = self.settings.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

    def set_health_probe(self, probe: HealthProbe) -> None:
        self._health = probe

    def add_get(self, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self.app.router.add_get(path, handler)

    def add_post(self, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self.app.router.add_post(path, handler)

    async def start(self) -> None:
        if self._runner is not None:
            return
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as e:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            raise StartupError(self._bind_problem(e)) from e
        self.port = int(self._runner.addresses[0][1])
        log.info("web_server_listening", url=self.url)

    def _bind_problem(self, e: OSError) -> str:
        host, port = self.settings.host, self.settings.port
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        fix = "set MNEMO_WEB_PORT (web.port) to a free port, or 0 to pick one"
        if e.errno == errno.EADDRINUSE:
            return f"cannot listen on {shown}: the port is already in use (another mnemo, or another program); {fix}"
        if e.errno in (errno.EACCES, errno.EPERM):
            return f"cannot listen on {shown}: permission denied (ports below 1024 need privileges); {fix}"
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(e, socket.gaierror):
            return (
                f"cannot listen on {shown}: {host!r} is not an address of this machine; "
                "set MNEMO_WEB_HOST (web.host), e.g. 127.0.0.1"
            )
        return f"cannot listen on {shown}: {e.strerror or e}; {fix}"

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        body = await self._health() if self._health is not None else {"status": "starting"}
        status = 200 if body.get("status") == "ok" else 503
        return web.Response(text=json.dumps(body), status=status, content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        payload = await self.metrics.render()
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE})
