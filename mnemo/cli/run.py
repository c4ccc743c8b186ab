"""``mnemo run``: start the gateway with every configured adapter.

This is the composition root for adapters (``gateway/`` itself never imports a
platform library; the adapter modules are imported here, only when configured).

The local HTTP server (``/healthz``, ``/metrics``) is built here and always started —
a container's health check needs it even when the web chat is disabled; the web chat
adapter adds its page and websocket to it. With nothing configured, the web chat is
the only adapter (local trial mode) and its URL is printed on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from mnemo.app import check_startup, open_app
from mnemo.gateway.config import TRIAL_BANNER, Settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.ports import Adapter
from mnemo.gateway.webserver import WebServer

log = get_logger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the bot with every configured adapter")
    p.set_defaults(handler=run)


def build_adapters(settings: Settings, server: WebServer) -> list[Adapter]:
    adapters: list[Adapter] = []
    if settings.telegram.bot_token is not None:
        from mnemo.adapters.telegram import TelegramAdapter

        adapters.append(TelegramAdapter(settings.telegram, web=server))  # webhook mode adds its route
    if settings.discord.bot_token is not None:
        from mnemo.adapters.discord import DiscordAdapter

        adapters.append(DiscordAdapter(settings.discord))
    if settings.web.enabled:
        from mnemo.adapters.web import WebAdapter

        adapters.append(WebAdapter(server, trial=settings.trial_mode))
    if not adapters:
        raise StartupError("no adapter is enabled: configure a platform token or enable web (web.enabled: true)")
    return adapters


def chat_url(settings: Settings, server: WebServer) -> str:
    """The address to open; the token itself is never printed."""
    suffix = "?token=<MNEMO_WEB_TOKEN>" if settings.web.access_token is not None else ""
    return f"{server.url}/{suffix}"


async def _run(settings: Settings) -> int:
    check_startup(settings)
    server = WebServer(settings.web, Metrics())
    adapters = build_adapters(settings, server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with open_app(settings, adapters=adapters, web=server) as app:
        names = ", ".join(a.name for a in adapters)
        log.info("mnemo_running", adapters=names, home=str(settings.home), trial=app.trial, url=server.url)
        print(f"mnemo is running: {names} (home {settings.home})", file=sys.stderr)
        if settings.web.enabled:
            print(f"web chat: {chat_url(settings, server)}", file=sys.stderr)
        print(f"health: {server.url}/healthz  metrics: {server.url}/metrics", file=sys.stderr)
        if app.trial:
            print(f"*** {TRIAL_BANNER}", file=sys.stderr)
        await stop.wait()
        log.info("mnemo_stopping")
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(settings))
