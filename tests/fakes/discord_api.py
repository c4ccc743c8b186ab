"""A fake Discord (REST API v10 + gateway websocket) on 127.0.0.1 for driving the real
discord.py client in tests.

    fake = FakeDiscord()
    alice = fake.add_user("alice")
    guild = fake.add_guild("home", members=[alice])
    general = fake.add_channel(guild, "general")
    async with fake:                                   # or await fake.start() / stop()
        route_discord(fake.api_base, fake.gateway_url)  # adapters/discord_routing.py
        await client.login(fake.token)
        task = asyncio.create_task(client.connect())
        ...
        await fake.push_message(general.id, alice, f"{fake.bot_user.mention} hi")
        sent = await fake.wait_for_sent(1)

The fake is split by concern: ``discord_world`` (users, guilds, channels, messages and
their JSON shapes), ``discord_gateway`` (the websocket protocol), ``discord_messages``
(channel/message/thread routes), ``discord_interactions`` (application commands,
interaction callbacks, followups), ``discord_http`` (JSON responses, Discord's error bodies), and this
module (the HTTP server, the call log, fault injection and the test API).

What it does like Discord, because an adapter has to cope with it:
- Responses are ``Content-Type: application/json`` exactly and errors carry Discord's
  JSON error codes (see ``discord_http``, ``discord_messages``).
- The bot's own messages come back through the gateway as MESSAGE_CREATE: an adapter
  must ignore its own messages. Ephemeral interaction replies do not come back.
- ``allowed_mentions`` is applied: each recorded message's ``pings`` says who would
  actually be notified.
- REST calls need ``Authorization: Bot <token>`` (else 401, which discord.py's
  ``login`` turns into ``LoginFailure``), except interaction callbacks and webhooks,
  which are authorised by the token in their path.
- Routes it does not serve answer 404 and stay visible in ``calls``.

Fault injection: ``fail_next("POST /channels", status=429, retry_after=0.2)`` answers the
next matching call with a rate limit discord.py retries by itself (a ``Via`` header and a
JSON ``retry_after`` with ``global: false``; without ``Via`` discord.py takes a 429 for a
Cloudflare ban and raises). 500/502/504 are retried by discord.py after 1 s, 3 s, ...;
other statuses (e.g. 503, 403) raise at once.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web

from tests.fakes.discord_gateway import FakeGateway, GatewayConnection
from tests.fakes.discord_http import BODY, FILES, ApiError, json_response
from tests.fakes.discord_interactions import InteractionDesk, InteractionResponse, PushedInteraction
from tests.fakes.discord_messages import EditedMessage, MessageDesk, SentMessage
from tests.fakes.discord_world import DiscordWorld, FakeChannel, FakeGuild, FakeUser, resolve_pings

__all__ = [
    "Call",
    "EditedMessage",
    "FakeChannel",
    "FakeDiscord",
    "FakeGuild",
    "FakeUser",
    "InteractionResponse",
    "PushedInteraction",
    "SentMessage",
]

API_PREFIX = "/api/v10"


@dataclass(frozen=True)
class Call:
    """One REST request as received (path without the /api/v10 prefix) and its status."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any
    status: int

    @property
    def route(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class _Fault:
    route_substring: str
    status: int
    retry_after: float
    remaining: int
    code: int
    message: str | None

    def response(self) -> web.Response:
        if self.status == 429:
            body: dict[str, Any] = {
                "message": "You are being rate limited.",
                "retry_after": self.retry_after,
                "global": False,
            }
            headers = {
                "Via": "1.1 google",
                "Retry-After": str(math.ceil(self.retry_after)),
                "X-RateLimit-Scope": "user",
            }
            return json_response(body, 429, headers)
        message = self.message or f"{self.status}: injected by the fake"
        return json_response({"message": message, "code": self.code}, self.status, {"Via": "1.1 google"})


class FakeDiscord:
    """The fake server and its test API.

    ``privileged_intents`` are the toggles switched on in the (fake) developer portal;
    a client asking for any other privileged intent is closed with 4014. With
    ``compress_gateway=False`` the gateway sends text frames even when zlib-stream is
    requested. Build the world (``add_*``) before the client connects; afterwards use
    the ``push_*`` / ``create_thread`` helpers, which dispatch gateway events.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        bot_name: str = "mnemo",
        privileged_intents: Iterable[str] = ("message_content",),
        heartbeat_interval_ms: int = 41_250,
        compress_gateway: bool = True,
    ) -> None:
        self.token = token or f"fake.{secrets.token_urlsafe(24)}"
        self.world = DiscordWorld(bot_name=bot_name, privileged_intents=privileged_intents)
        self.gateway = FakeGateway(
            self.world,
            self.token,
            heartbeat_interval_ms=heartbeat_interval_ms,
            resume_url=lambda: self.gateway_url,
            compress=compress_gateway,
        )
        self.messages = MessageDesk(self.world, self.gateway, lambda: f"http://127.0.0.1:{self._port}")
        self.interactions = InteractionDesk(self.world, self.gateway, self.messages)
        self.calls: list[Call] = []
        self.cdn: dict[str, bytes] = {}  # attachment id -> content
        self._faults: list[_Fault] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=32 * 1024 * 1024)
        app.router.add_get("/gateway", self.gateway.handle)
        app.router.add_get("/cdn/attachments/{aid}/{name}", self._cdn)
        self._add_routes(app.router)
        self.messages.add_routes(app.router, API_PREFIX)
        self.interactions.add_routes(app.router, API_PREFIX)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the gateway (1001) and the server; close discord.py clients first, or
        they keep trying to reconnect to a port that is gone."""
        if self._runner is not None:
            await self.gateway.close()
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self._port}/gateway"

    @property
    def bot_user(self) -> FakeUser:
        return self.world.bot

    @property
    def application_id(self) -> int:
        return self.world.application_id

    # ---- building the world (before the client connects) --------------------------------

    def add_user(self, username: str, *, global_name: str | None = None, bot: bool = False) -> FakeUser:
        return self.world.add_user(username, global_name=global_name, bot=bot)

    def add_guild(self, name: str, *, members: Iterable[FakeUser] = ()) -> FakeGuild:
        return self.world.add_guild(name, members)

    def add_channel(self, guild: FakeGuild, name: str) -> FakeChannel:
        return self.world.add_channel(guild, name)

    def add_dm(self, user: FakeUser) -> FakeChannel:
        return self.world.dm_with(user)

    def add_thread(self, parent_id: int, name: str, owner: FakeUser) -> FakeChannel:
        """An existing thread, announced in GUILD_CREATE at the next IDENTIFY."""
        return self.world.add_thread(self.world.channel(parent_id), name, owner)

    def message(self, message_id: int) -> dict[str, Any]:
        """A stored message payload (pushed or sent)."""
        return self.world.messages[message_id]

    # ---- live events (dispatched through the gateway) -----------------------------------

    async def push_message(
        self,
        channel_id: int,
        author: FakeUser,
        content: str,
        *,
        guild_id: int | None = None,
        mentions: Iterable[FakeUser] | None = None,
        reference: int | None = None,
        thread_id: int | None = None,
        reply_ping: bool = True,
        files: Sequence[tuple[str, str, bytes]] = (),
    ) -> int:
        """A user posts a message; returns its id. ``thread_id`` posts in that thread of
        ``channel_id``. ``mentions`` defaults to what the content mentions (plus the
        replied-to author when ``reply_ping``, as the Discord client does)."""
        channel = self.world.channel(thread_id or channel_id)
        if thread_id is not None and channel.parent_id != channel_id:
            raise ValueError(f"thread {thread_id} is not in channel {channel_id}")
        if guild_id is not None and channel.guild_id != guild_id:
            raise ValueError(f"channel {channel.id} is not in guild {guild_id}")
        replied_author = None
        if reference is not None:
            replied_author = int(self.world.messages[reference]["author"]["id"]) if reply_ping else None
        pings = resolve_pings(content, None, replied_author)
        if mentions is None:
            mentions = self.world.known_users(pings.users)
        message = self.world.message_payload(
            channel=channel,
            author=author,
            content=content,
            mentions=mentions,
            mention_everyone=pings.everyone,
            mention_roles=pings.roles,
            reference_id=reference,
        )
        for filename, content_type, content in files:  # (name, content type, bytes), served below
            aid = self.world.ids.next()
            # Discord's CDN puts the name in the URL; escaped, so any name is a path segment.
            url = f"http://127.0.0.1:{self._port}/cdn/attachments/{aid}/{quote(filename, safe='')}"
            self.cdn[str(aid)] = content
            message["attachments"].append(
                {
                    "id": str(aid),
                    "filename": filename,
                    "size": len(content),
                    "url": url,
                    "proxy_url": url,
                    "content_type": content_type,
                }
            )
        await self.gateway.dispatch("MESSAGE_CREATE", message)
        return int(message["id"])

    async def _cdn(self, request: web.Request) -> web.Response:
        content = self.cdn.get(request.match_info["aid"])
        return web.Response(status=404) if content is None else web.Response(body=content)

    async def push_interaction(
        self,
        name: str,
        user: FakeUser,
        channel_id: int,
        guild_id: int | None = None,
        options: Mapping[str, str | int | float | bool] | None = None,
    ) -> PushedInteraction:
        """A user runs slash command ``name`` (it must have been synced, as on Discord)."""
        channel = self.world.channel(channel_id)
        if guild_id is not None and channel.guild_id != guild_id:
            raise ValueError(f"channel {channel_id} is not in guild {guild_id}")
        return await self.interactions.push(name, user, channel, options or {})

    async def create_thread(
        self, parent_id: int, name: str, owner: FakeUser, *, message_id: int | None = None
    ) -> FakeChannel:
        """Someone (``owner``) starts a thread now; dispatches THREAD_CREATE."""
        thread = self.world.add_thread(self.world.channel(parent_id), name, owner, thread_id=message_id)
        await self.gateway.dispatch("THREAD_CREATE", {**thread.payload(), "newly_created": True})
        return thread

    async def request_reconnect(self) -> None:
        await self.gateway.request_reconnect()

    async def drop_gateway(self, code: int = 4000) -> None:
        await self.gateway.drop_connections(code)

    # ---- fault injection ----------------------------------------------------------------

    def fail_next(
        self,
        route_substring: str,
        status: int = 429,
        retry_after: float = 0.2,
        *,
        times: int = 1,
        code: int = 0,
        message: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls whose "METHOD /path" contains
        ``route_substring`` with ``status`` (path without the /api/v10 prefix)."""
        self._faults.append(_Fault(route_substring, status, retry_after, times, code, message))

    def _take_fault(self, route: str) -> web.Response | None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.route_substring in route:
                fault.remaining -= 1
                return fault.response()
        return None

    # ---- observation --------------------------------------------------------------------

    @property
    def sent(self) -> list[SentMessage]:
        """Messages the bot posted with ``POST /channels/{id}/messages``."""
        return self.messages.sent

    @property
    def followups(self) -> list[SentMessage]:
        return self.interactions.followups

    @property
    def edits(self) -> list[EditedMessage]:
        return self.messages.edits

    @property
    def deleted(self) -> list[int]:
        return self.messages.deleted

    @property
    def typing(self) -> list[int]:
        """Channel ids of every ``POST /channels/{id}/typing``."""
        return self.messages.typing

    @property
    def interaction_responses(self) -> list[InteractionResponse]:
        return self.interactions.interaction_responses

    @property
    def commands(self) -> dict[int | None, list[dict[str, Any]]]:
        """Synced application commands by scope: None = global, else a guild id."""
        return self.interactions.commands

    @property
    def identifies(self) -> list[Mapping[str, Any]]:
        return self.gateway.identifies

    @property
    def resumes(self) -> list[Mapping[str, Any]]:
        return self.gateway.resumes

    @property
    def connections(self) -> list[GatewayConnection]:
        return self.gateway.connections

    def calls_to(self, route_substring: str) -> list[Call]:
        return [c for c in self.calls if route_substring in c.route]

    async def wait_ready(self, timeout: float = 5.0) -> None:
        """Until a session has identified and received READY and its GUILD_CREATEs (the
        client's own ``on_ready`` comes ``guild_ready_timeout`` later)."""
        await asyncio.wait_for(self.gateway.ready.wait(), timeout)

    async def wait_for_sent(self, n: int, timeout: float = 5.0) -> list[SentMessage]:
        await self.wait_until(lambda: len(self.sent) >= n, timeout)
        return list(self.sent)

    async def wait_for_interaction_responses(self, n: int, timeout: float = 5.0) -> list[InteractionResponse]:
        await self.wait_until(lambda: len(self.interaction_responses) >= n, timeout)
        return list(self.interaction_responses)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until ``predicate()`` holds; re-checked after every REST call."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    # ---- HTTP plumbing ------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith(API_PREFIX):
            return await handler(request)
        path = request.path[len(API_PREFIX) :]
        body, files = await _read_body(request)
        # Handlers read JSON objects; a body-less POST (typing) reads as {}.
        request[BODY], request[FILES] = (body if body is not None else {}), files
        route = f"{request.method} {path}"
        response = self._take_fault(route)
        if response is None:
            try:
                if not path.startswith(("/webhooks/", "/interactions/")):
                    self._check_auth(request)
                response = await handler(request)
            except ApiError as exc:
                response = exc.response()
            except web.HTTPException as exc:  # the router's 404 / 405
                response = json_response({"message": f"{exc.status}: {exc.reason}", "code": 0}, exc.status)
        self.calls.append(Call(request.method, path, dict(request.query), body, response.status))
        async with self._changed:
            self._changed.notify_all()
        return response

    def _check_auth(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bot {self.token}":
            raise ApiError(401, 0, "401: Unauthorized")

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        p = API_PREFIX
        router.add_get(p + "/users/@me", self._get_me)
        router.add_get(p + "/oauth2/applications/@me", self._get_application)
        router.add_get(p + "/gateway", self._get_gateway)
        router.add_get(p + "/gateway/bot", self._get_gateway_bot)

    # ---- REST: identity and gateway discovery -------------------------------------------

    async def _get_me(self, request: web.Request) -> web.Response:
        return json_response(
            {**self.bot_user.payload(), "verified": True, "mfa_enabled": False, "email": None}
        )

    async def _get_application(self, request: web.Request) -> web.Response:
        return json_response(self.world.application_payload())

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return json_response({"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        limit = {"total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1}
        return json_response({"url": self.gateway_url, "shards": 1, "session_start_limit": limit})


async def _read_body(request: web.Request) -> tuple[Any, tuple[str, ...]]:
    """JSON bodies, or multipart with a ``payload_json`` part plus files (discord.py's
    form for attachments); returns (payload, file names)."""
    if request.content_type == "application/json":
        raw = await request.read()
        return (json.loads(raw) if raw else None), ()
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        files: list[str] = []
        reader = await request.multipart()
        async for part in reader:
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            elif part.filename:
                await part.read()
                files.append(part.filename)
        return payload, tuple(files)
    await request.read()
    return None, ()
