"""``mnemo run``: start the gateway with every configured adapter.

This is the composition root for adapters (``gateway/`` itself never imports a
platform library; the adapter modules are imported here, only when configured).

The local HTTP server (``/healthz``, ``/metrics``) is built here and always started —
a container's health check needs it even when the web chat is disabled; the web chat
adapter adds its page and websocket to it. With nothing configured, the web chat is
the only adapter (local trial mode) and its URL is printed on stderr.

Exit 2 is for configuration errors only (``deploy/mnemo.service`` does not restart on
it): a platform that cannot be reached at start is retried in the background
(``gateway.supervisor``) while ``/healthz`` says "degraded"; a platform that refuses the
token, then or later, ends the process with exit 2. A second process on the same
profile exits 1 (``mnemo.profile_lock``) — on SQLite; on PostgreSQL several replicas run
with the same configuration (``gateway/replicas.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from mnemo.gateway.config import TRIAL_BANNER, Settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import Adapter

if TYPE_CHECKING:  # the app and the web server (aiohttp) are imported by the command that runs them
    from mnemo.app import App
    from mnemo.gateway.webserver import WebServer

log = get_logger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

        adapters.append(
            WebAdapter(server, trial=settings.trial_mode, uploads_dir=settings.home / "media" / "uploads")
        )
    if not adapters:
        raise StartupError(
            "no adapter is enabled: configure a platform token or enable web (web.enabled: true)"
        )
    return adapters


def chat_url(settings: Settings, server: WebServer) -> str:
    """The address to open; the token itself is never printed."""
    suffix = "?token=<MNEMO_WEB_TOKEN>" if settings.web.access_token is not None else ""
    return f"{server.url}/{suffix}"


async def _run(settings: Settings) -> int:
    from mnemo.app import open_app
    from mnemo.gateway.metrics import Metrics
    from mnemo.gateway.webserver import WebServer

    settings.check_can_serve()
    server = WebServer(settings.web, Metrics())
    adapters = build_adapters(settings, server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    starting = True

    def on_signal() -> None:
        stop.set()
        if starting and main is not None:  # still starting (e.g. a slow first connect): unwind now
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with open_app(settings, adapters=adapters, web=server) as app:
            starting = False
            await _serve(settings, server, adapters, app, stop)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
        log.info("mnemo_stopped_while_starting")
    return 0


async def _serve(
    settings: Settings, server: WebServer, adapters: list[Adapter], app: App, stop: asyncio.Event
) -> None:
    """Until SIGTERM/SIGINT — or until an adapter retried in the background meets a
    configuration error (its platform came back and refused the token), which ends the
    process like one found at start: ``StartupError``, exit 2."""
    names = ", ".join(a.name for a in adapters)
    log.info("mnemo_running", adapters=names, home=str(settings.home), trial=app.trial, url=server.url)
    print(f"mnemo is running: {names} (home {settings.home})", file=sys.stderr)
    if settings.web.enabled:
        print(f"web chat: {chat_url(settings, server)}", file=sys.stderr)
    print(f"health: {server.url}/healthz  metrics: {server.url}/metrics", file=sys.stderr)
    print(f"admin dashboard: {server.url}/admin", file=sys.stderr)
    if app.trial:
        print(f"*** {TRIAL_BANNER}", file=sys.stderr)
    assert app.adapter_supervisor is not None
    stopping = asyncio.create_task(stop.wait(), name="stop-signal")
    refused = asyncio.create_task(app.adapter_supervisor.failure(), name="adapter-refused")
    try:
        done, _ = await asyncio.wait({stopping, refused}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stopping, refused):
            task.cancel()
        await asyncio.gather(stopping, refused, return_exceptions=True)
    if refused in done:
        raise refused.result()
    log.info("mnemo_stopping")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.storage import backend_for
    from mnemo.profile_lock import serving

    settings.check_can_serve()  # a configuration error is exit 2 even when the profile is busy
    # One process per profile, unless the backend is shared by replicas (PostgreSQL).
    with serving(settings.home, shared_database=backend_for(settings).replicated):
        from mnemo.dashboard import admin_token_path, ensure_admin_token, token_notice

        generated = ensure_admin_token(settings)  # /admin's sign-in token, the first time only
        if generated is not None:
            print(
                token_notice(admin_token_path(settings), generated, terminal=sys.stderr.isatty()),
                file=sys.stderr,
            )
        return asyncio.run(_run(settings))
