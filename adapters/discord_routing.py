"""The one place where discord.py is pointed at a Discord other than discord.com.

discord.py (checked on 2.7.1) has no option for its server addresses. Two **class
attributes** decide them, so the setting is process-global — every client in the process
uses it, and it cannot differ between two clients:

- ``discord.http.Route.BASE`` (a ``str``, ``"https://discord.com/api/v10"``): every REST
  route is ``BASE + path``, including interaction callbacks and interaction webhooks
  (``discord.webhook.async_`` uses the same ``Route`` class). ``DISCORD_API_BASE_URL``
  (a REST rate-limit proxy, or a test's fake) therefore includes the version path.
- ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` (a ``yarl.URL``,
  ``wss://gateway.discord.gg/``): where an unsharded ``Client`` opens its websocket.
  Verified in 2.7.1: ``Client.connect`` never calls ``GET /gateway``; it connects to
  ``DEFAULT_GATEWAY`` (adding ``v``, ``encoding`` and ``compress`` to the query), resumes
  at READY's ``resume_gateway_url``, and falls back to ``DEFAULT_GATEWAY`` after an
  invalidated session. ``AutoShardedClient`` instead asks ``GET /gateway/bot`` (routed by
  ``Route.BASE``) and connects to the URL in the answer, so a server reached through
  ``Route.BASE`` also steers a sharded client. Both paths are pinned by tests against the
  fake Discord (``tests/fakes/test_discord_api.py``).

Call ``route_discord`` before ``login``/``connect``. ``None`` means Discord's own
address, so ``route_discord(None, None)`` (or ``restore_discord_defaults()``) undoes a
previous call — tests use that to leave the process as they found it. CDN URLs
(attachments, avatars) are not affected: attachments carry absolute URLs from the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from mnemo.gateway.errors import ConfigError

# Captured when this module is first imported, before anything could have routed
# discord.py elsewhere (this module is the only writer).
DEFAULT_API_BASE: Final[str] = Route.BASE
DEFAULT_GATEWAY: Final[yarl.URL] = DiscordWebSocket.DEFAULT_GATEWAY

_VERSION_SUFFIX = re.compile(r"/v\d+$")


@dataclass(frozen=True)
class DiscordRoutes:
    api_base: str
    gateway: yarl.URL


def route_discord(api_base_url: str | None, gateway_url: str | None) -> None:
    """Point discord.py's REST calls at ``api_base_url`` (e.g. ``http://127.0.0.1:8080/api/v10``)
    and an unsharded client's websocket at ``gateway_url`` (e.g. ``ws://127.0.0.1:8080/gateway``);
    ``None`` restores Discord's own. Raises ``ConfigError`` for a malformed URL."""
    routes = DiscordRoutes(
        api_base=DEFAULT_API_BASE if api_base_url is None else _checked_api_base(api_base_url),
        gateway=DEFAULT_GATEWAY if gateway_url is None else _checked_gateway(gateway_url),
    )
    Route.BASE = routes.api_base
    DiscordWebSocket.DEFAULT_GATEWAY = routes.gateway


def restore_discord_defaults() -> None:
    route_discord(None, None)


def current_routes() -> DiscordRoutes:
    """What discord.py will use now (for start-up logs and tests)."""
    return DiscordRoutes(Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


def _checked_api_base(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"DISCORD_API_BASE_URL must be an http(s) URL without query, got {url!r}")
    path = parts.path.rstrip("/")
    # Route paths start with "/"; the base must already carry the API version, or every
    # call would 404 — the usual mistake is giving the bare host.
    if not _VERSION_SUFFIX.search(path):
        raise ConfigError(
            f"DISCORD_API_BASE_URL must end with the API version path (e.g. /api/v10), got {url!r}"
        )
    return f"{parts.scheme}://{parts.netloc}{path}"


def _checked_gateway(url: str) -> yarl.URL:
    parsed = yarl.URL(url.strip())
    if parsed.scheme not in ("ws", "wss") or not parsed.host:
        raise ConfigError(f"DISCORD_GATEWAY_URL must be a ws:// or wss:// URL, got {url!r}")
    # discord.py sets its own query (v, encoding, compress); anything given here is dropped.
    return parsed.with_query(None).with_fragment(None)
