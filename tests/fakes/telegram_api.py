"""A fake Telegram Bot API server on 127.0.0.1 for driving the real python-telegram-bot.

    fake = FakeTelegram()
    async with fake:                                   # or await fake.start() / stop()
        app = (ApplicationBuilder().token(fake.token)
               .base_url(fake.root + "/bot").base_file_url(fake.root + "/file/bot").build())
        ...
        fake.push_text(chat_id=42, user_id=42, text="hello")
        [reply] = await fake.wait_for_sent(1)

What it does like the real server, because an adapter has to cope with it:
- ``/bot<token>/<method>``, GET or POST, parameters form-encoded (nested objects as JSON
  strings, how PTB sends them), multipart, or a JSON body. A wrong but well-formed token
  gets 401 "Unauthorized", a malformed one or an unknown method 404 "Not Found".
- getUpdates: an update is confirmed by calling with a higher ``offset`` and is then
  gone; a negative offset keeps only the last ``-offset``; ``timeout`` long-polls until
  an update arrives; ``allowed_updates`` is remembered and filters updates created
  afterwards (the default leaves out chat_member and reactions); a second concurrent
  poll ends the first with 409 "Conflict: terminated by other getUpdates request ...";
  with a webhook set, getUpdates is a 409 too.
- sendMessage / editMessageText parse ``parse_mode=HTML`` with
  ``adapters.telegram_html`` (strict by default: stricter than Telegram, so escaping bugs
  surface) -> 400 "Bad Request: can't parse entities: ..."; more than 4,096 UTF-16 units
  of text after entity parsing -> 400 "Bad Request: message is too long"; a chat the bot
  never saw -> 400 "Bad Request: chat not found". Markdown parse modes are not parsed.
- setWebhook wants https (plain http is allowed to loopback hosts only, a fake-only
  relaxation) and then POSTs pending updates to it with ``X-Telegram-Bot-Api-Secret-Token``,
  retrying until the hook answers 2xx, as Telegram does.

Faults: ``fail_next(method, status=429, retry_after=N)`` answers with Telegram's flood
JSON (PTB raises ``RetryAfter``); any status/description; ``drop=True`` closes the
connection without an answer (PTB: ``NetworkError``), and with ``processed=True`` the
request takes effect first (the message is sent, its answer lost: the outbox's in-flight
case). ``method="*"`` matches every method; ``times`` repeats the fault.

Update ids and message ids only ever grow. Chats, messages and their JSON shapes live in
``telegram_world``.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from mnemo.adapters.splitting import utf16_len
from mnemo.adapters.telegram_html import TELEGRAM_MESSAGE_LIMIT, TelegramHtmlError, parse_telegram_html
from tests.fakes.telegram_world import TelegramWorld, detect_entities

_TOKEN = re.compile(r"^\d+:[A-Za-z0-9_-]{30,}$")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_COMMAND = re.compile(r"^[a-z0-9_]{1,32}$")
# Parameters that are strings even when they look like JSON ("123", "true").
_STRING_PARAMS = frozenset(
    {"text", "caption", "parse_mode", "action", "url", "secret_token", "callback_query_id",
     "language_code", "inline_message_id", "business_connection_id", "message_effect_id",
     "file_id", "ip_address", "description", "short_description", "name", "emoji", "title"}
)  # fmt: skip
_OPT_IN_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
_CHAT_ACTIONS = frozenset(
    {"typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
     "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note"}
)  # fmt: skip
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
_DEFAULT_DESCRIPTIONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict",
    500: "Internal Server Error",
    502: "Bad Gateway",
}
_UNSET: Any = object()


@dataclass(frozen=True)
class ApiCall:
    """One request and the HTTP status it got (0: the connection was dropped)."""

    method: str
    params: Mapping[str, Any]
    status: int
    at: float = field(default_factory=time.monotonic)  # when the fake finished handling it


@dataclass(frozen=True)
class SentMessage:
    """A message the bot sent, as the server understood it."""

    chat_id: int
    message_id: int
    text: str  # as sent (HTML source when parse_mode is HTML)
    parse_mode: str | None
    plain_text: str  # what the user sees
    entities: tuple[Mapping[str, Any], ...]
    reply_to_message_id: int | None
    message_thread_id: int | None
    params: Mapping[str, Any]
    at: float = field(default_factory=time.monotonic)  # when the fake stored it


@dataclass(frozen=True)
class EditedText:
    chat_id: int
    message_id: int
    text: str
    parse_mode: str | None
    plain_text: str
    at: float = field(default_factory=time.monotonic)  # when the fake applied it


@dataclass
class _Fault:
    method: str  # lower-case method name, or "*"
    status: int
    description: str
    retry_after: int | None
    drop: bool
    processed: bool
    remaining: int


class ApiError(Exception):
    def __init__(self, status: int, description: str, parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters

    def response(self) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            body["parameters"] = dict(self.parameters)
        return web.json_response(body, status=self.status)


class FakeTelegram:
    def __init__(
        self,
        *,
        token: str | None = None,
        bot_username: str = "mnemo_test_bot",
        bot_name: str = "Mnemo",
        strict_html: bool = True,
        webhook_retry_delay: float = 0.1,
        port: int = 0,
    ) -> None:
        self.token = token or f"4242000001:{secrets.token_urlsafe(27)[:35]}"
        self.bot_id = int(self.token.split(":", 1)[0])
        self.world = TelegramWorld(self.bot_id, bot_username, bot_name)
        self.strict_html = strict_html
        self.webhook_retry_delay = webhook_retry_delay

        self.calls: list[ApiCall] = []
        self.sent: list[SentMessage] = []
        self.edits: list[EditedText] = []
        self.dropped_updates: list[dict[str, Any]] = []  # filtered out by allowed_updates
        self.webhook_url = ""
        self.webhook_secret: str | None = None
        self.webhook_statuses: list[int] = []  # answers of the bot's webhook, in order

        self._next_update_id = 100_001
        self._pending: list[dict[str, Any]] = []
        self._allowed: frozenset[str] | None = None  # None: all but the opt-in types
        self._commands: dict[tuple[str, str], list[dict[str, str]]] = {}
        self._webhook_error: tuple[int, str] | None = None
        self._faults: list[_Fault] = []
        self._holds: dict[str, asyncio.Event] = {}  # method → the release of its next answer
        self._poller: asyncio.Future[str] | None = None
        self._poller_transport: asyncio.BaseTransport | None = None  # the waiting poll's
        self._request_transport: asyncio.BaseTransport | None = None  # the call being handled
        self._watchers: list[asyncio.Future[None]] = []
        self._new_update = asyncio.Event()
        self._delivery: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._port = port  # 0: any free port; a fixed one lets a test bring the server up late
        self._methods: dict[str, Callable[[dict[str, Any]], Any]] = {
            name.lower(): getattr(self, f"_api_{name}")
            for name in (
                "getMe", "getUpdates", "deleteWebhook", "setWebhook", "getWebhookInfo",
                "sendMessage", "editMessageText", "sendChatAction", "setMyCommands",
                "getMyCommands", "deleteMyCommands", "answerCallbackQuery", "getChat", "getFile",
            )
        }  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def stop(self) -> None:
        await self._stop_delivery()
        self._wake_poller("stop")
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = self._client = None

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def root(self) -> str:
        """Server root, as in ``TELEGRAM_API_BASE_URL`` (``/bot`` is appended by clients)."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def bot_user(self) -> dict[str, Any]:
        return dict(self.world.bot_user)

    # -- what users do -----------------------------------------------------------------

    def add_chat(self, chat_id: int, **kwargs: Any) -> dict[str, Any]:
        """Make a chat known (pushing a message into it does this too); ``chat_type``,
        ``title``, ``username``, ``first_name``."""
        return self.world.add_chat(chat_id, **kwargs)

    def push_message(self, chat_id: int, user_id: int, **kwargs: Any) -> dict[str, Any]:
        """Queue a message update of any kind and return it: ``chat_type``, ``username``,
        ``first_name``, ``reply_to`` (a message id in that chat), ``message_thread_id``,
        and message fields as-is (``text``, ``voice={...}``, ``sticker={...}``, ...)."""
        return self.push_update({"message": self.world.user_message(chat_id, user_id, **kwargs)})

    def push_text(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        *,
        entities: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Queue a text message. Entities default to what Telegram detects: a leading
        ``/command`` and ``@username`` mentions, with UTF-16 offsets."""
        found = list(entities) if entities is not None else detect_entities(text)
        extra: dict[str, Any] = {"text": text}
        if found:
            extra["entities"] = found
        return self.push_message(chat_id, user_id, **extra, **kwargs)

    def push_photo(
        self, chat_id: int, user_id: int, *, caption: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Queue a photo (two sizes, downloadable through getFile) with an optional caption."""
        extra: dict[str, Any] = {"photo": self.world.photo_sizes()}
        if caption is not None:
            extra["caption"] = caption
            if found := detect_entities(caption):
                extra["caption_entities"] = found
        return self.push_message(chat_id, user_id, **extra, **kwargs)

    def push_image(
        self,
        chat_id: int,
        user_id: int,
        content: bytes,
        *,
        width: int,
        height: int,
        caption: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Queue a photo whose (largest) file is ``content``."""
        extra: dict[str, Any] = {"photo": self.world.photo_of(content, width, height)}
        if caption is not None:
            extra["caption"] = caption
        return self.push_message(chat_id, user_id, **extra, **kwargs)

    def push_document(
        self,
        chat_id: int,
        user_id: int,
        content: bytes,
        *,
        file_name: str,
        mime_type: str,
        caption: str | None = None,
        file_size: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Queue a document downloadable through getFile (``file_size`` may lie, as a
        test of the size checks). Like Telegram's, the file's path on the server is its
        own (``documents/file_N.ext``), never the name the user gave it."""
        extension = re.sub(r"[^A-Za-z0-9]", "", file_name.rsplit(".", 1)[-1])[:8] if "." in file_name else ""
        file_id = self.world.add_file(content, f"documents/file.{extension or 'bin'}")
        doc = {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_name": file_name,
            "mime_type": mime_type,
            "file_size": len(content) if file_size is None else file_size,
        }
        extra: dict[str, Any] = {"document": doc}
        if caption is not None:
            extra["caption"] = caption
        return self.push_message(chat_id, user_id, **extra, **kwargs)

    def push_voice(
        self, chat_id: int, user_id: int, content: bytes, *, duration: int = 3, **kwargs: Any
    ) -> dict[str, Any]:
        """Queue a voice note (OGG/Opus as Telegram records them) downloadable through getFile."""
        file_id = self.world.add_file(content, "voice/file.oga")
        voice = {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "duration": duration,
            "mime_type": "audio/ogg",
            "file_size": len(content),
        }
        return self.push_message(chat_id, user_id, voice=voice, **kwargs)

    def push_edit(self, chat_id: int, message_id: int, text: str) -> dict[str, Any]:
        """Queue an ``edited_message`` update for a message pushed earlier."""
        edited = self.world.set_text(chat_id, message_id, text, detect_entities(text))
        return self.push_update({"edited_message": edited})

    def push_callback_query(
        self, chat_id: int, user_id: int, data: str, *, message_id: int
    ) -> dict[str, Any]:
        """Queue a button press on the bot's message ``message_id``."""
        return self.push_update(
            {"callback_query": self.world.callback_query(chat_id, user_id, data, message_id)}
        )

    def push_update(self, update: dict[str, Any]) -> dict[str, Any]:
        """Queue a raw update (an ``update_id`` is assigned if missing)."""
        if "update_id" not in update:
            update = {"update_id": self._next_update_id, **update}
        self._next_update_id = max(self._next_update_id, update["update_id"]) + 1
        kind = next(k for k in update if k != "update_id")
        allowed = kind in self._allowed if self._allowed is not None else kind not in _OPT_IN_UPDATES
        if not allowed:
            self.dropped_updates.append(update)
            return update
        self._pending.append(update)
        self._new_update.set()
        self._wake_poller("update")
        return update

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Updates not yet confirmed (polling) or acknowledged (webhook)."""
        return list(self._pending)

    # -- what tests inspect ------------------------------------------------------------

    def calls_to(self, method: str) -> list[ApiCall]:
        return [c for c in self.calls if c.method.lower() == method.lower()]

    def message(self, chat_id: int, message_id: int) -> dict[str, Any]:
        return dict(self.world.messages[(chat_id, message_id)])

    def commands(
        self, scope: Mapping[str, Any] | None = None, language_code: str = ""
    ) -> list[dict[str, str]]:
        return list(self._commands.get((_scope_key(scope), language_code), []))

    async def wait_for_sent(self, n: int = 1, timeout: float = 10.0) -> list[SentMessage]:
        """The first ``n`` sent messages, once there are that many."""
        await self._wait(lambda: len(self.sent) >= n, timeout, f"{n} sent message(s)")
        return self.sent[:n]

    async def wait_for_call(self, method: str, n: int = 1, timeout: float = 10.0) -> list[ApiCall]:
        await self._wait(lambda: len(self.calls_to(method)) >= n, timeout, f"{n} {method} call(s)")
        return self.calls_to(method)[:n]

    async def wait_for_poll(self, timeout: float = 10.0) -> None:
        """Until a getUpdates call is waiting for updates (to push into a live poll)."""
        await self._wait(
            lambda: self._poller is not None and not self._poller.done(), timeout, "a waiting poll"
        )

    async def wait_for_webhook_statuses(self, n: int = 1, timeout: float = 10.0) -> list[int]:
        """The first ``n`` HTTP statuses the bot's webhook answered, once there are that many."""
        await self._wait(lambda: len(self.webhook_statuses) >= n, timeout, f"{n} webhook answer(s)")
        return self.webhook_statuses[:n]

    async def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not ready():
                    watcher = asyncio.get_running_loop().create_future()
                    self._watchers.append(watcher)
                    await watcher
        except TimeoutError:
            seen = [(c.method, c.status) for c in self.calls[-20:]]
            raise AssertionError(f"timed out waiting for {what}; last calls: {seen}") from None

    def _notify(self) -> None:
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    # -- faults --------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        *,
        status: int = 429,
        retry_after: int | None = None,
        description: str | None = None,
        drop: bool = False,
        processed: bool = False,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` (or ``"*"``) fail."""
        if status == 429 and retry_after is None:
            retry_after = 1
        if description is None:
            description = (
                f"Too Many Requests: retry after {retry_after}"
                if status == 429
                else _DEFAULT_DESCRIPTIONS.get(status, "Internal Server Error")
            )
        self._faults.append(_Fault(method.lower(), status, description, retry_after, drop, processed, times))

    def hold_next(self, method: str) -> asyncio.Event:
        """Carry out the next call of ``method`` at once (a sent message is stored) but
        answer it only once the returned event is set: Telegram accepted the request and
        the bot has not heard so yet."""
        release = asyncio.Event()
        self._holds[method.lower()] = release
        return release

    def _take_fault(self, method: str) -> _Fault | None:
        for fault in self._faults:
            if fault.method in ("*", method.lower()):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await _read_params(request)
        status = 200
        try:
            token = request.match_info["token"]
            if token != self.token:
                raise ApiError(401, "Unauthorized") if _TOKEN.match(token) else ApiError(404, "Not Found")
            handler = self._methods.get(method.lower())
            if handler is None:
                raise ApiError(404, "Not Found")
            fault = self._take_fault(method)
            self._request_transport = request.transport
            if fault is not None and fault.drop:
                if fault.processed:
                    await handler(params)
                status = 0
                assert request.transport is not None
                request.transport.close()  # no answer at all; the client sees a disconnect
                return web.Response()
            if fault is not None:
                parameters = {"retry_after": fault.retry_after} if fault.retry_after is not None else None
                raise ApiError(fault.status, fault.description, parameters)
            result = await handler(params)
            held = self._holds.pop(method.lower(), None)
            if held is not None:
                self._notify()
                await held.wait()
            return web.json_response({"ok": True, "result": result})
        except ApiError as error:
            status = error.status
            return error.response()
        finally:
            self.calls.append(ApiCall(method, params, status))
            self._notify()

    async def _download(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.Response(status=404)
        content = self.world.file_content(request.match_info["path"])
        return web.Response(status=404) if content is None else web.Response(body=content)

    # -- webhook -------------------------------------------------------------------------

    async def deliver_webhook(
        self, url: str | None, update: dict[str, Any], secret: str | None = _UNSET
    ) -> int:
        """POST one update to ``url`` (``None``: the webhook set) and return the HTTP status.
        ``secret`` defaults to the registered secret token; ``None`` sends no header. The
        update is not queued: this is for probing a hook (e.g. with a wrong secret)."""
        assert self._client is not None, "start() the fake first"
        if "update_id" not in update:
            update = {"update_id": self._next_update_id, **update}
            self._next_update_id += 1
        secret = self.webhook_secret if secret is _UNSET else secret
        headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret is not None else {}
        async with self._client.post(url or self.webhook_url, json=update, headers=headers) as response:
            await response.read()
            return response.status

    async def _deliver_loop(self) -> None:
        """Send pending updates to the webhook in order; one that fails stays pending."""
        while True:
            if not self._pending:
                self._new_update.clear()
                await self._new_update.wait()
                continue
            update = self._pending[0]
            try:
                status = await self.deliver_webhook(None, update)
            except (aiohttp.ClientError, TimeoutError) as error:
                self._webhook_error = (int(time.time()), f"Connection failed: {error.__class__.__name__}")
                await asyncio.sleep(self.webhook_retry_delay)
                continue
            self.webhook_statuses.append(status)
            self._notify()
            if 200 <= status < 300:
                if self._pending and self._pending[0] is update:
                    self._pending.pop(0)
            else:
                self._webhook_error = (int(time.time()), f"Wrong response from the webhook: {status}")
                await asyncio.sleep(self.webhook_retry_delay)

    async def _stop_delivery(self) -> None:
        if self._delivery is not None:
            self._delivery.cancel()
            try:
                await self._delivery
            except asyncio.CancelledError:
                pass  # we cancelled it ourselves just above
            self._delivery = None

    # -- methods ---------------------------------------------------------------------------

    async def _api_getMe(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            **self.bot_user,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    async def _api_getUpdates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        if self.webhook_url:
            raise ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        if params.get("allowed_updates") is not None:
            self._allowed = frozenset(params["allowed_updates"]) or None
        # A poll still waiting on a live connection is ended with a conflict; one whose
        # client has gone (PTB cancels its poll when stopping) is simply dropped.
        previous = self._poller_transport
        self._wake_poller("gone" if previous is None or previous.is_closing() else "conflict")
        offset = int(params.get("offset") or 0)
        if offset > 0:
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
        elif offset < 0:
            self._pending = self._pending[offset:]
        limit = min(max(int(params.get("limit") or 100), 1), 100)
        timeout = float(params.get("timeout") or 0)
        if not self._pending and timeout > 0:
            poller = self._poller = asyncio.get_running_loop().create_future()
            self._poller_transport = self._request_transport
            self._notify()  # wait_for_poll()
            try:
                async with asyncio.timeout(timeout):
                    reason = await poller
            except TimeoutError:
                reason = "timeout"
            finally:
                if self._poller is poller:
                    self._poller = self._poller_transport = None
            if reason == "conflict":
                raise ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; "
                    "make sure that only one bot instance is running",
                )
        return self._pending[:limit]

    def _wake_poller(self, reason: str) -> None:
        if self._poller is not None and not self._poller.done():
            self._poller.set_result(reason)

    async def _api_deleteWebhook(self, params: dict[str, Any]) -> bool:
        await self._stop_delivery()
        self.webhook_url, self.webhook_secret = "", None
        if params.get("drop_pending_updates"):
            self._pending.clear()
        return True

    async def _api_setWebhook(self, params: dict[str, Any]) -> bool:
        url = params.get("url") or ""
        if not url:
            return await self._api_deleteWebhook(params)
        parts = urlsplit(url)
        loopback = parts.hostname == "localhost" or _is_loopback(parts.hostname or "")
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        secret = params.get("secret_token")
        if secret is not None and not _SECRET.match(secret):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        if params.get("drop_pending_updates"):
            self._pending.clear()
        if params.get("allowed_updates") is not None:
            self._allowed = frozenset(params["allowed_updates"]) or None
        await self._stop_delivery()
        self.webhook_url, self.webhook_secret = url, secret
        self._webhook_error = None
        self._delivery = asyncio.create_task(self._deliver_loop(), name="fake-telegram-webhook")
        return True

    async def _api_getWebhookInfo(self, params: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {
            "url": self.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": len(self._pending),
        }
        if self.webhook_url:
            info["max_connections"] = 40
        if self._webhook_error is not None:
            info["last_error_date"], info["last_error_message"] = self._webhook_error
        return info

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        chat = self._chat(params.get("chat_id"))
        text, parse_mode = str(params.get("text") or ""), params.get("parse_mode")
        plain, entities = self._parse_text(text, parse_mode, params.get("entities"))
        reply = params.get("reply_parameters") or {}
        reply_to = reply.get("message_id", params.get("reply_to_message_id"))
        if reply_to is not None and (chat["id"], reply_to) not in self.world.messages:
            if not (reply.get("allow_sending_without_reply") or params.get("allow_sending_without_reply")):
                raise ApiError(400, "Bad Request: message to be replied not found")
            reply_to = None
        fields: dict[str, Any] = {"text": plain}
        if entities:
            fields["entities"] = list(entities)
        message = self.world.store_message(
            chat, self.bot_user, reply_to, params.get("message_thread_id"), fields
        )
        self.sent.append(
            SentMessage(
                chat_id=chat["id"],
                message_id=message["message_id"],
                text=text,
                parse_mode=parse_mode,
                plain_text=plain,
                entities=tuple(entities),
                reply_to_message_id=reply_to,
                message_thread_id=params.get("message_thread_id"),
                params=params,
            )
        )
        return message

    async def _api_editMessageText(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("inline_message_id") is not None:
            raise ApiError(400, "Bad Request: inline messages are not supported by this fake")
        chat = self._chat(params.get("chat_id"))
        message = self.world.messages.get((chat["id"], params.get("message_id")))
        if message is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        if message["from"]["id"] != self.bot_id:
            raise ApiError(400, "Bad Request: message can't be edited")
        text, parse_mode = str(params.get("text") or ""), params.get("parse_mode")
        plain, entities = self._parse_text(text, parse_mode, params.get("entities"))
        if plain == message.get("text") and list(entities) == message.get("entities", []):
            raise ApiError(400, _NOT_MODIFIED)
        edited = self.world.set_text(chat["id"], message["message_id"], plain, list(entities))
        self.edits.append(EditedText(chat["id"], message["message_id"], text, parse_mode, plain))
        return edited

    async def _api_sendChatAction(self, params: dict[str, Any]) -> bool:
        self._chat(params.get("chat_id"))
        if params.get("action") not in _CHAT_ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        return True

    async def _api_setMyCommands(self, params: dict[str, Any]) -> bool:
        commands = params.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise ApiError(400, "Bad Request: commands must be a list of at most 100 commands")
        for command in commands:
            if not _COMMAND.match(str(command.get("command", ""))):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(command.get("description", ""))) <= 256:
                raise ApiError(400, "Bad Request: command description must be 1-256 characters")
        key = (_scope_key(params.get("scope")), params.get("language_code") or "")
        self._commands[key] = [{"command": c["command"], "description": c["description"]} for c in commands]
        return True

    async def _api_getMyCommands(self, params: dict[str, Any]) -> list[dict[str, str]]:
        return self.commands(params.get("scope"), params.get("language_code") or "")

    async def _api_deleteMyCommands(self, params: dict[str, Any]) -> bool:
        self._commands.pop((_scope_key(params.get("scope")), params.get("language_code") or ""), None)
        return True

    async def _api_answerCallbackQuery(self, params: dict[str, Any]) -> bool:
        if params.get("callback_query_id") not in self.world.callback_queries:
            raise ApiError(
                400, "Bad Request: query is too old and response timeout expired or query ID is invalid"
            )
        return True

    async def _api_getChat(self, params: dict[str, Any]) -> dict[str, Any]:
        gifts = (
            "unlimited_gifts",
            "limited_gifts",
            "unique_gifts",
            "premium_subscription",
            "gifts_from_channels",
        )
        return {
            **self._chat(params.get("chat_id")),
            "accent_color_id": 0,
            "max_reaction_count": 11,
            "accepted_gift_types": dict.fromkeys(gifts, False),
        }

    async def _api_getFile(self, params: dict[str, Any]) -> dict[str, Any]:
        file = self.world.file(str(params.get("file_id")))
        if file is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        return file

    # -- helpers ---------------------------------------------------------------------------

    def _chat(self, chat_id: Any) -> dict[str, Any]:
        try:
            return self.world.chats[int(chat_id)]
        except (TypeError, ValueError, KeyError):
            raise ApiError(400, "Bad Request: chat not found") from None

    def _parse_text(
        self, text: str, parse_mode: str | None, entities: Sequence[Mapping[str, Any]] | None
    ) -> tuple[str, tuple[Mapping[str, Any], ...]]:
        if parse_mode and parse_mode.lower() == "html":
            try:
                parsed = parse_telegram_html(text, strict=self.strict_html)
            except TelegramHtmlError as error:
                raise ApiError(400, f"Bad Request: can't parse entities: {error.description}") from None
            plain, found = parsed.text, tuple(e.to_json() for e in parsed.entities)
        else:
            plain, found = text, tuple(entities or ())
        if not plain.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(plain) > TELEGRAM_MESSAGE_LIMIT:
            raise ApiError(400, "Bad Request: message is too long")
        return plain, found


async def _read_params(request: web.Request) -> dict[str, Any]:
    raw: dict[str, Any] = dict(request.query)
    if request.body_exists:
        if request.content_type == "application/json":
            body = await request.json()
            raw.update(body if isinstance(body, dict) else {})
        else:
            for key, value in (await request.post()).items():
                raw[key] = value if isinstance(value, str) else value.file.read()
    return {key: _decode_param(key, value) for key, value in raw.items()}


def _decode_param(key: str, value: Any) -> Any:
    """Form values are strings, nested objects JSON inside them (how PTB sends them)."""
    if not isinstance(value, str) or key in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _scope_key(scope: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(scope or {"type": "default"}), sort_keys=True)


def _is_loopback(host: str) -> bool:
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False
