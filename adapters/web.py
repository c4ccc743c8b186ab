"""The web chat: a small page and a websocket on mnemo's local HTTP server.

Routes, added to the ``WebServer`` before it starts (``/healthz`` and ``/metrics`` are
the server's own):

    GET /                 the chat page (``web_static/index.html``; the trial banner is
                          rendered into it in local trial mode)
    GET /chat.js, /chat.css   its script and style — no external assets, no CDN: the
                          machine may be offline
    GET /ws?user=<id>     the websocket
    POST /upload?user=<id>   a file to attach to the next message (``web_uploads.py``;
                             counted against ``media.quota``)

Frames are JSON text:

    page → server   {"type": "message", "id": "<client id>", "text": "...",
                     "attachments": ["<upload id>", ...]}   (optional; see web_uploads.py)
    server → page   {"type": "hello", "user": ..., "typing": bool}
                    {"type": "ack", "id": ...}       the gateway has the message durably
                    {"type": "reply", "id": "o<outbox id>", "text": ..., "scheduled": bool,
                     "possible_duplicate": bool}
                    {"type": "typing", "active": bool}
                    {"type": "token", "id": "s…", "delta": ...} or {..., "text": ...}
                    a reply while it is generated: ``delta`` appends to the live
                    bubble ``id``, ``text`` replaces its text; the final "reply" frame
                    carries ``"replaces": "s…"`` and takes the bubble's place
                    {"type": "error", "text": ..., "id": ... | null, "retry": bool}
                    retry false: the message was refused (too long, invalid text, ...)
                    and resending it can never work, so the page drops it; retry true:
                    the bot could not take it now, the page resends it after a reconnect

Size: the page refuses a message over ``MAX_TEXT_CHARS`` (sent in the hello frame as
``max_chars``) before sending anything. The server answers every frame up to
``MAX_RECEIVE_BYTES`` (16 × the ``MAX_FRAME_BYTES`` it accepts): an over-long one gets an
error frame naming its message id and the socket stays open. Only a frame beyond that
is cut off by aiohttp with close code 1009 (message too big).

Identity: the page makes a random user id once and keeps it in ``localStorage``, so a
reload continues the same chat (chat id = user id, a DM). The id is validated here
(safe characters, bounded length) before anything else. Every web user is the
operator (``gateway.access``: web is a loopback platform), which is why a non-loopback
bind needs ``web.access_token``.

Delivery: a reply is pushed to every open socket of its chat. With none open, ``send``
raises ``PlatformUnavailable`` and the durable outbox keeps the reply; when a page of
that chat connects, the adapter calls the gateway's reachability hook
(``gateway.ports.ReportsReachability``), which makes the waiting replies due at once.
The page resends messages not yet acknowledged after a reconnect; the gateway's inbox
deduplicates them by message id. A reply's id is its outbox row, so the page drops a
reply it already shows when a crash made the outbox resend it.

Who may connect:
* with ``web.access_token`` set, the page, its assets and the websocket need the token
  (``?token=``, ``Authorization: Bearer``, or the cookie the page sets when it was
  opened with a valid ``?token=``), compared in constant time;
* without one the server is bound to loopback, and the ``Host`` header must name a
  loopback host, so a web site the operator visits cannot reach the bot through DNS
  rebinding;
* a websocket whose ``Origin`` is not this server is refused in both cases: browsers
  let any site open a websocket to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import json
import re
import secrets
import tempfile
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web

from mnemo.adapters.web_uploads import Upload, UploadRefused, UploadStore, file_name, read_body
from mnemo.gateway.config import TRIAL_DETAIL
from mnemo.gateway.errors import PlatformUnavailable
from mnemo.gateway.events import Attachment, ChatRef, ChatType, InboundMessage, OutboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MAX_ATTACHMENTS_PER_TURN
from mnemo.gateway.media_quota import MediaKind, MediaQuota
from mnemo.gateway.ports import ChatReachable, CommandInfo, InboundSink
from mnemo.gateway.webserver import WebServer, is_loopback

MAX_LIVE_REPLIES = 256  # live replies whose text is remembered for delta frames

log = get_logger(__name__)

USER_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TEXT_CHARS = 32_000
MAX_FRAME_BYTES = 256 * 1024
MAX_RECEIVE_BYTES = 16 * MAX_FRAME_BYTES  # read (and answered) before aiohttp closes with 1009
# The id of an over-long frame, read from its start (the page puts "type" and "id" first).
_FRAME_ID = re.compile(r'"id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')
TOKEN_COOKIE = "mnemo_web_token"

_STATIC = {"/chat.js": "application/javascript", "/chat.css": "text/css"}
_SECURITY_HEADERS = {
    # Everything the page needs comes from this server; nothing may frame it.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # The page URL may carry ?token=: never leak it to a linked site.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _asset(name: str) -> str:
    return (resources.files(__package__) / "web_static" / name).read_text(encoding="utf-8")


class WebAdapter:
    name = "web"
    max_message_len = 1_000_000  # one frame carries a whole reply: no splitting
    supports_typing = True
    debounce_s: float | None = None
    # Streaming (gateway.ports.StreamsReplies): token frames, no edit pacing.
    stream_interval_s = 0.0
    stream_tokens = True

    def __init__(self, server: WebServer, *, trial: bool = False, uploads_dir: Path | None = None) -> None:
        self.server = server
        self.trial = trial
        # Files sent from the page (adapters/web_uploads.py); without a folder, a private
        # temporary one (uploads then do not outlive the process).
        self.uploads = UploadStore(uploads_dir or Path(tempfile.mkdtemp(prefix="mnemo-web-uploads-")))
        self._quota: MediaQuota | None = None  # open_app hands it over (use_media_quota)
        token = server.settings.access_token
        self._token = token.get_secret_value().encode() if token is not None else None
        self._loopback_only = self._token is None and is_loopback(server.settings.host)
        banner = (
            f'<div class="banner" role="alert"><strong>Local trial mode:</strong> {html.escape(TRIAL_DETAIL)}</div>'
            if trial
            else ""
        )
        self._page = _asset("index.html").replace("<!--TRIAL_BANNER-->", banner)
        self._assets = {path: _asset(path.lstrip("/")) for path in _STATIC}
        self._sockets: dict[str, set[web.WebSocketResponse]] = {}
        self._live: dict[str, str] = {}  # live reply id → text the pages have (insertion order)
        self._typing: dict[str, int] = {}
        self._sink: InboundSink | None = None
        self._reachable: ChatReachable | None = None
        server.add_get("/", self._serve_page)
        for path in _STATIC:
            server.add_get(path, self._serve_asset)
        server.add_get("/ws", self._serve_socket)
        server.add_post("/upload", self._serve_upload)

    # --- the port ---------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._sink is not None

    def on_chat_reachable(self, hook: ChatReachable) -> None:
        self._reachable = hook

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None:
        self._sink = sink
        log.info("web_chat_ready", url=self.server.url if self.server.port is not None else None)

    async def stop(self) -> None:
        self._sink = None
        sockets = [ws for group in self._sockets.values() for ws in group]
        self._sockets.clear()
        await asyncio.gather(
            *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down") for ws in sockets)
        )

    async def send(self, message: OutboundMessage) -> list[str]:
        reply_id = f"o{message.outbox_id}" if message.outbox_id is not None else f"d{id(message):x}"
        frame = {
            "type": "reply",
            "id": reply_id,
            "text": message.text,
            "scheduled": message.scheduled,
            "possible_duplicate": message.possible_duplicate,
        }
        if message.stream_message_id is not None:
            frame["replaces"] = message.stream_message_id  # the page swaps its live bubble for this
        if await self._broadcast(message.chat.chat_id, frame) == 0:
            raise PlatformUnavailable("no web chat page is open for this chat")
        if message.stream_message_id is not None:
            self._live.pop(message.stream_message_id, None)
        return [reply_id]

    async def stream_open(self, chat: ChatRef, text: str, *, reply_to: str | None) -> str:
        stream_id = f"s{secrets.token_hex(8)}"
        await self.stream_edit(chat, stream_id, text)
        return stream_id

    async def stream_edit(self, chat: ChatRef, message_id: str, text: str) -> None:
        """A token frame: ``delta`` appends to the live bubble, ``text`` replaces it."""
        before = self._live.get(message_id)
        frame: dict[str, Any] = {"type": "token", "id": message_id}
        if before is not None and text.startswith(before):
            frame["delta"] = text[len(before) :]
        else:
            frame["text"] = text
        if await self._broadcast(chat.chat_id, frame) == 0:
            raise PlatformUnavailable("no web chat page is open for this chat")
        self._live[message_id] = text
        while len(self._live) > MAX_LIVE_REPLIES:
            self._live.pop(next(iter(self._live)))

    @contextlib.asynccontextmanager
    async def typing(self, chat: ChatRef) -> AsyncIterator[None]:
        chat_id = chat.chat_id
        self._typing[chat_id] = self._typing.get(chat_id, 0) + 1
        if self._typing[chat_id] == 1:
            await self._broadcast(chat_id, {"type": "typing", "active": True})
        try:
            yield
        finally:
            self._typing[chat_id] -= 1
            if self._typing[chat_id] == 0:
                del self._typing[chat_id]
                await self._broadcast(chat_id, {"type": "typing", "active": False})

    # --- HTTP -------------------------------------------------------------------------
    def _check_access(self, request: web.Request) -> str | None:
        """Raise unless the request may use the chat; return the token if it came in the
        query (the page then stores it in a cookie so reloads and the websocket carry it)."""
        if self._loopback_only and not is_loopback(urlsplit(f"//{request.host}").hostname or ""):
            raise web.HTTPForbidden(text="this web chat answers on a loopback address only\n")
        if self._token is None:
            return None
        query = request.query.get("token")
        if query and self._matches(query):
            return query
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and self._matches(header[len("Bearer ") :]):
            return None
        cookie = request.cookies.get(TOKEN_COOKIE)
        if cookie and self._matches(cookie):
            return None
        raise web.HTTPUnauthorized(
            text="access token required: open this page as /?token=<MNEMO_WEB_TOKEN>\n"
        )

    def _matches(self, given: str) -> bool:
        assert self._token is not None
        return hmac.compare_digest(given.encode(), self._token)

    async def _serve_page(self, request: web.Request) -> web.Response:
        from_query = self._check_access(request)
        response = web.Response(text=self._page, content_type="text/html", headers=_SECURITY_HEADERS)
        if from_query is not None:
            response.set_cookie(TOKEN_COOKIE, from_query, httponly=True, samesite="Strict", path="/")
        return response

    async def _serve_asset(self, request: web.Request) -> web.Response:
        self._check_access(request)
        path = request.path
        return web.Response(text=self._assets[path], content_type=_STATIC[path], headers=_SECURITY_HEADERS)

    # --- uploads (adapters/web_uploads.py) ---------------------------------------------
    async def _serve_upload(self, request: web.Request) -> web.Response:
        self._check_access(request)
        self._check_origin(request)
        user = request.query.get("user", "")
        if not USER_ID.fullmatch(user):
            raise web.HTTPBadRequest(text="invalid user id: 8-64 characters of A-Z a-z 0-9 _ -\n")
        name = file_name(request.headers.get("X-File-Name", ""))
        try:
            data = await read_body(request.content, request.content_length)
            upload = await asyncio.to_thread(self.uploads.check, name, request.content_type, data)
            await self._admit_upload(user, upload)
            await asyncio.to_thread(self.uploads.keep, user, upload, data)
        except UploadRefused as e:
            log.info("web_upload_refused", user=user, status=e.status, reason=str(e))
            headers = dict(_SECURITY_HEADERS)
            if e.retry_after_s is not None:
                headers["Retry-After"] = str(e.retry_after_s)
            return web.json_response({"error": str(e)}, status=e.status, headers=headers)
        log.info("web_upload", user=user, kind=upload.kind, size=upload.size)
        return web.json_response(upload.as_dict(), headers=_SECURITY_HEADERS)

    async def _admit_upload(self, user: str, upload: Upload) -> None:
        """Count the upload against ``media.quota``; raises ``UploadRefused`` (429 for a
        daily limit, 413 when the space is used up, 503 when it cannot be checked)."""
        if self._quota is None:
            return
        try:
            exceeded = await self._quota.admit(
                f"{self.name}:{user}", MediaKind.UPLOAD, f"{user}/{upload.id}", upload.size
            )
        except Exception as e:  # the database is down: refused, and said so
            log.error("web_upload_quota_check_failed", error=f"{type(e).__name__}: {e}")
            raise UploadRefused(503, "the upload cannot be taken just now; try again in a moment") from e
        if exceeded is not None:
            raise UploadRefused(
                429 if exceeded.limit.daily else 413, exceeded.text, retry_after_s=exceeded.retry_after_s
            )

    # --- media.quota (gateway.media_quota.KeepsUploads) ----------------------------------
    def use_media_quota(self, quota: MediaQuota) -> None:
        self._quota = quota

    def prune_uploads(self, older_than: float) -> list[str]:
        return self.uploads.prune(older_than)

    async def fetch_media(self, attachment: Attachment) -> bytes:
        """``gateway.ports.FetchesMedia``: an upload's bytes."""
        return await asyncio.to_thread(self.uploads.read, attachment.ref)

    def _frame_attachments(self, user: str, frame: dict[str, Any]) -> tuple[Attachment, ...] | str:
        """The uploads a message frame names (``"attachments": [<upload id>, …]``), or
        what is wrong with them."""
        ids = frame.get("attachments", [])
        if (
            not isinstance(ids, list)
            or len(ids) > MAX_ATTACHMENTS_PER_TURN
            or not all(isinstance(i, str) for i in ids)
        ):
            return f"attachments must be a list of at most {MAX_ATTACHMENTS_PER_TURN} upload ids"
        found = [self.uploads.get(user, i) for i in ids]
        if any(u is None for u in found):
            return "an attached file is no longer there; attach it again"
        return tuple(u.attachment(user) for u in found if u is not None)

    def _check_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return  # not a browser: the token / loopback rules above are the guard
        if urlsplit(origin).netloc.lower() != request.host.lower():
            log.warning("web_socket_cross_origin_refused", origin=origin)
            raise web.HTTPForbidden(text="cross-origin websocket refused\n")

    async def _serve_socket(self, request: web.Request) -> web.WebSocketResponse:
        self._check_access(request)
        self._check_origin(request)
        user = request.query.get("user", "")
        if not USER_ID.fullmatch(user):
            raise web.HTTPBadRequest(text="invalid user id: 8-64 characters of A-Z a-z 0-9 _ -\n")
        if self._sink is None:
            raise web.HTTPServiceUnavailable(text="the web chat is not running\n")
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_RECEIVE_BYTES)
        await ws.prepare(request)
        group = self._sockets.setdefault(user, set())
        group.add(ws)
        log.debug("web_socket_open", user=user, sockets=len(group))
        try:
            hello = {
                "type": "hello",
                "user": user,
                "typing": user in self._typing,
                "max_chars": MAX_TEXT_CHARS,
            }
            await ws.send_str(json.dumps(hello))
            if self._reachable is not None:
                await self._reachable(ChatRef(self.name, user))
            async for frame in ws:
                if frame.type is WSMsgType.TEXT:
                    await self._on_text(ws, user, frame.data)
                elif frame.type is WSMsgType.ERROR:
                    log.warning("web_socket_error", user=user, error=str(frame.data))
        finally:
            group.discard(ws)
            if not group and self._sockets.get(user) is group:
                del self._sockets[user]
            log.debug("web_socket_closed", user=user)
        return ws

    async def _on_text(self, ws: web.WebSocketResponse, user: str, data: str) -> None:
        size = len(data.encode("utf-8", errors="surrogatepass"))
        if size > MAX_FRAME_BYTES:
            found = _FRAME_ID.search(data, 0, 512)
            await self._send_error(
                ws,
                f"message too long ({size:,} bytes; at most {MAX_TEXT_CHARS:,} characters); nothing was sent",
                found.group(1) if found else None,
            )
            return
        try:
            frame = json.loads(data)
        except json.JSONDecodeError:
            frame = None
        if not isinstance(frame, dict) or frame.get("type") != "message":
            await self._send_error(ws, "unsupported frame")
            return
        message_id, text = frame.get("id"), frame.get("text")
        if not isinstance(message_id, str) or not MESSAGE_ID.fullmatch(message_id):
            await self._send_error(ws, "invalid message id")
            return
        attachments = await asyncio.to_thread(self._frame_attachments, user, frame)
        if isinstance(attachments, str):
            await self._send_error(ws, attachments, message_id)
            return
        if not isinstance(text, str) or (not text.strip() and not attachments):
            await self._send_error(ws, "empty message", message_id)
            return
        if len(text) > MAX_TEXT_CHARS:
            await self._send_error(ws, f"message too long (at most {MAX_TEXT_CHARS} characters)", message_id)
            return
        bad = next((ch for ch in text if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is not None:  # "\ud800" in JSON: no store can hold it, so resending never helps
            await self._send_error(
                ws,
                f"the message holds an invalid character (lone surrogate U+{ord(bad):04X}); it was not sent",
                message_id,
            )
            return
        sink = self._sink
        if sink is None:
            return  # shutting down: the page resends it after reconnecting
        msg = InboundMessage(
            platform=self.name,
            chat_id=user,
            user_id=user,
            message_id=message_id,
            text=text,
            chat_type=ChatType.DM,
            attachments=attachments,
        )
        try:
            await sink(msg)
        except Exception:  # loop boundary: one bad message must not close the page's socket
            log.exception("web_message_not_accepted", message_id=message_id)
            await self._send_error(
                ws, "the bot could not accept this message; it will be resent", message_id, retry=True
            )
            return
        await self._send_frame(ws, {"type": "ack", "id": message_id})

    async def _send_error(
        self, ws: web.WebSocketResponse, text: str, message_id: str | None = None, *, retry: bool = False
    ) -> None:
        await self._send_frame(ws, {"type": "error", "text": text, "id": message_id, "retry": retry})

    async def _send_frame(self, ws: web.WebSocketResponse, frame: dict[str, Any]) -> bool:
        if ws.closed:
            return False
        try:
            await ws.send_str(json.dumps(frame))
        except ConnectionError as e:
            log.debug("web_socket_send_failed", error=str(e))
            return False
        return True

    async def _broadcast(self, chat_id: str, frame: dict[str, Any]) -> int:
        """Send to every open socket of the chat; how many took it."""
        sockets = list(self._sockets.get(chat_id, ()))
        results = await asyncio.gather(*(self._send_frame(ws, frame) for ws in sockets))
        return sum(results)
