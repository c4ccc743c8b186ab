"""The fake Discord gateway: one websocket endpoint speaking gateway v10 JSON.

Protocol, as discord.py 2.7 drives it:

    client connects  ?v=10&encoding=json&compress=zlib-stream
    server  HELLO (op 10, heartbeat_interval)
    client  HEARTBEAT (op 1) at once, then every interval   -> server HEARTBEAT_ACK (op 11)
    client  IDENTIFY (op 2: token, intents, properties)      -> READY, then one GUILD_CREATE
                                                                per guild (the client's
                                                                ``on_ready`` follows once no
                                                                GUILD_CREATE came for
                                                                ``guild_ready_timeout``, 2 s
                                                                by default)
    client  RESUME (op 6: session_id, seq)                   -> missed dispatches replayed,
                                                                then RESUMED; an unknown
                                                                session gets INVALID_SESSION
                                                                (op 9, false) and the client
                                                                identifies again

Transport compression: with ``compress=zlib-stream`` every payload goes through one zlib
compressor per connection and is flushed with Z_SYNC_FLUSH into one binary frame (so each
frame ends with 00 00 ff ff), exactly what discord.py's decompressor expects. Any other
value (discord.py asks for ``zstd-stream`` when the ``zstandard`` package is installed) or
none gets uncompressed text frames, which discord.py also accepts — checked by a test
(``FakeDiscord(compress_gateway=False)`` forces text frames).
IDENTIFY's own ``compress`` flag (per-payload compression) is ignored.

Faithful refusals, so misconfiguration shows up in tests the way it does on Discord: a
wrong token closes with 4004 (discord.py raises ``LoginFailure``-like ``ConnectionClosed``),
a privileged intent that is not enabled for the application closes with 4014
(``PrivilegedIntentsRequired``). Events are filtered by the session's intents, and
without the message-content intent guild messages lose their content unless they
mention the bot.

A session survives its connection: dispatches made while the client is away are logged and
replayed on RESUME, which is how a test proves that a gateway drop loses nothing. A client
that closes with 1000/1001 ends its session (Discord does the same).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.discord_world import (
    INTENT_DIRECT_MESSAGES,
    INTENT_GUILD_MESSAGES,
    INTENT_GUILDS,
    INTENT_MESSAGE_CONTENT,
    PRIVILEGED_INTENTS,
    DiscordWorld,
)

OP_DISPATCH = 0
OP_HEARTBEAT = 1
OP_IDENTIFY = 2
OP_PRESENCE_UPDATE = 3
OP_RESUME = 6
OP_RECONNECT = 7
OP_REQUEST_GUILD_MEMBERS = 8
OP_INVALID_SESSION = 9
OP_HELLO = 10
OP_HEARTBEAT_ACK = 11

CLOSE_UNKNOWN_ERROR = 4000  # resumable
CLOSE_DECODE_ERROR = 4002
CLOSE_AUTHENTICATION_FAILED = 4004
CLOSE_DISALLOWED_INTENTS = 4014

_REPLAY_LOG = 1000  # dispatches kept per session for RESUME


@dataclass(frozen=True)
class GatewayConnection:
    """One websocket connection as the client opened it."""

    query: Mapping[str, str]
    compression: str | None  # "zlib-stream" when frames were compressed


class _Connection:
    """A live websocket; serialises sends because zlib-stream frames share one
    compressor and must reach the client in compression order."""

    def __init__(self, ws: web.WebSocketResponse, compress: bool) -> None:
        self.ws = ws
        self._compressor = zlib.compressobj() if compress else None
        self._lock = asyncio.Lock()
        self.closed_by_server = False

    async def close(self, code: int, reason: str) -> None:
        self.closed_by_server = True
        await self.ws.close(code=code, message=reason.encode())

    async def send(self, payload: Mapping[str, Any]) -> bool:
        raw = json.dumps(payload, separators=(",", ":"))
        async with self._lock:
            if self.ws.closed:
                return False
            try:
                if self._compressor is None:
                    await self.ws.send_str(raw)
                else:
                    frame = self._compressor.compress(raw.encode()) + self._compressor.flush(
                        zlib.Z_SYNC_FLUSH
                    )
                    await self.ws.send_bytes(frame)
            except ConnectionResetError:
                return False
        return True


@dataclass
class GatewaySession:
    session_id: str
    intents: int
    seq: int = 0
    log: deque[tuple[int, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=_REPLAY_LOG))
    connection: _Connection | None = None


class FakeGateway:
    def __init__(
        self,
        world: DiscordWorld,
        token: str,
        *,
        heartbeat_interval_ms: int,
        resume_url: Callable[[], str],
        compress: bool = True,
    ) -> None:
        self._world = world
        self._token = token
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._resume_url = resume_url
        self._compress = compress
        self._sessions: dict[str, GatewaySession] = {}
        self._connections: set[_Connection] = set()
        self.connections: list[GatewayConnection] = []
        self.identifies: list[Mapping[str, Any]] = []  # IDENTIFY payloads, token removed
        self.resumes: list[Mapping[str, Any]] = []
        self.heartbeats = 0
        self.ready = asyncio.Event()

    # ---- the websocket endpoint ---------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        compress = self._compress and request.query.get("compress") == "zlib-stream"
        self.connections.append(GatewayConnection(dict(request.query), "zlib-stream" if compress else None))
        conn = _Connection(ws, compress)
        self._connections.add(conn)
        client_close_code = None
        try:
            if request.query.get("encoding", "json") != "json":
                await conn.close(CLOSE_DECODE_ERROR, "only json encoding here")
                return ws
            await conn.send({"op": OP_HELLO, "d": {"heartbeat_interval": self._heartbeat_interval_ms}})
            while not ws.closed:
                msg = await ws.receive()
                if msg.type is WSMsgType.TEXT:
                    await self._on_frame(conn, json.loads(msg.data))
                elif msg.type is WSMsgType.CLOSE:
                    client_close_code = msg.data  # aiohttp has already answered the close
                elif msg.type is WSMsgType.BINARY:
                    await conn.close(CLOSE_DECODE_ERROR, "send json text frames")
                else:  # CLOSING / CLOSED / ERROR: the connection is going away
                    break
        finally:
            self._connections.discard(conn)
            # Only the client closing with 1000/1001 ends the session; a drop (ours or
            # the network's) leaves it resumable.
            clean = not conn.closed_by_server and client_close_code in (1000, 1001)
            self._detach(conn, clean=clean)
        return ws

    async def _on_frame(self, conn: _Connection, frame: Mapping[str, Any]) -> None:
        op, data = frame.get("op"), frame.get("d")
        if op == OP_HEARTBEAT:
            self.heartbeats += 1
            await conn.send({"op": OP_HEARTBEAT_ACK, "d": None})
        elif op == OP_IDENTIFY:
            await self._identify(conn, data)
        elif op == OP_RESUME:
            await self._resume(conn, data)
        elif op == OP_REQUEST_GUILD_MEMBERS:
            await self._send_member_chunk(conn, data)
        # PRESENCE_UPDATE and voice ops need no answer.

    async def _identify(self, conn: _Connection, data: Mapping[str, Any]) -> None:
        if data.get("token") != self._token:
            await conn.close(CLOSE_AUTHENTICATION_FAILED, "Authentication failed.")
            return
        intents = int(data.get("intents", 0))
        for name, bit in PRIVILEGED_INTENTS.items():
            if intents & bit and name not in self._world.privileged_intents:
                await conn.close(CLOSE_DISALLOWED_INTENTS, "Disallowed intent(s).")
                return
        self.identifies.append({k: v for k, v in data.items() if k != "token"})
        session = GatewaySession(secrets.token_hex(16), intents, connection=conn)
        self._sessions[session.session_id] = session
        await self._dispatch_to(session, "READY", self._ready_payload(session, data.get("shard")))
        if intents & INTENT_GUILDS:
            for guild in self._world.guilds.values():
                payload = self._world.guild_create_payload(guild)
                await self._dispatch_to(session, "GUILD_CREATE", payload)
        self.ready.set()

    def _ready_payload(self, session: GatewaySession, shard: Any) -> dict[str, Any]:
        world = self._world
        payload: dict[str, Any] = {
            "v": 10,
            "user": {**world.bot.payload(), "verified": True, "mfa_enabled": False, "email": None},
            "guilds": [{"id": str(g), "unavailable": True} for g in world.guilds],
            "session_id": session.session_id,
            "session_type": "normal",
            "resume_gateway_url": self._resume_url(),
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "user_settings": {},
            "geo_ordered_rtc_regions": ["local"],
            "application": {"id": str(world.application_id), "flags": world.application_flags()},
            "auth": {},
        }
        if shard is not None:
            payload["shard"] = shard
        return payload

    async def _resume(self, conn: _Connection, data: Mapping[str, Any]) -> None:
        self.resumes.append({k: v for k, v in data.items() if k != "token"})
        session = self._sessions.get(data.get("session_id", ""))
        if session is None or data.get("token") != self._token:
            await conn.send({"op": OP_INVALID_SESSION, "d": False})
            return
        session.connection = conn
        since = data.get("seq") or 0
        for seq, frame in list(session.log):
            if seq > since:
                await conn.send(frame)
        await self._dispatch_to(session, "RESUMED", {})

    async def _send_member_chunk(self, conn: _Connection, data: Mapping[str, Any]) -> None:
        guild = self._world.guilds.get(int(data["guild_id"]))
        members = [] if guild is None else [guild.member_payload(u) for u in guild.members]
        for session in self._sessions.values():
            if session.connection is conn:
                chunk = {
                    "guild_id": data["guild_id"],
                    "members": members,
                    "chunk_index": 0,
                    "chunk_count": 1,
                    "not_found": [],
                    "nonce": data.get("nonce"),
                }
                await self._dispatch_to(session, "GUILD_MEMBERS_CHUNK", chunk)

    def _detach(self, conn: _Connection, *, clean: bool) -> None:
        for session_id, session in list(self._sessions.items()):
            if session.connection is conn:
                session.connection = None
                if clean:
                    del self._sessions[session_id]

    # ---- dispatch (used by the test API) ------------------------------------------------

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send an event to every session entitled to it by its intents (logged for
        replay when the session's client is momentarily disconnected)."""
        needed = _required_intent(event, data)
        for session in list(self._sessions.values()):
            if needed and not session.intents & needed:
                continue
            payload = data
            if event.startswith("MESSAGE_") and not session.intents & INTENT_MESSAGE_CONTENT:
                payload = self._world.as_seen_without_content(data)
            await self._dispatch_to(session, event, payload)

    async def _dispatch_to(self, session: GatewaySession, event: str, data: dict[str, Any]) -> None:
        session.seq += 1
        frame = {"op": OP_DISPATCH, "t": event, "s": session.seq, "d": data}
        session.log.append((session.seq, frame))
        if session.connection is not None:
            await session.connection.send(frame)

    async def request_reconnect(self) -> None:
        """Op 7 RECONNECT: the client closes and resumes."""
        for conn in list(self._connections):
            await conn.send({"op": OP_RECONNECT, "d": None})

    async def drop_connections(self, code: int = CLOSE_UNKNOWN_ERROR) -> None:
        """Close every live websocket from the server side (4000: the client resumes)."""
        for conn in list(self._connections):
            await conn.close(code, "dropped by the fake")

    async def close(self) -> None:
        await self.drop_connections(1001)


def _required_intent(event: str, data: Mapping[str, Any]) -> int:
    if event.startswith("MESSAGE_"):
        return INTENT_GUILD_MESSAGES if "guild_id" in data else INTENT_DIRECT_MESSAGES
    if event.startswith(("GUILD_", "CHANNEL_", "THREAD_")):
        return INTENT_GUILDS
    return 0
