"""The Telegram adapter: python-telegram-bot 22 ``Application`` ↔ the gateway's ``Adapter`` port.

Connecting. ``TELEGRAM_API_BASE_URL`` is the Bot API server root (Telegram's, a
self-hosted ``telegram-bot-api``, or a test fake); ``/bot`` and ``/file/bot`` are
appended. PTB's ``Application`` owns the bot's lifecycle (``getMe`` at start, the HTTP
pools) but has no ``Updater``: updates are received here so that one is confirmed to
Telegram only after the gateway has stored it (see ``adapters.telegram_polling``).
A Telegram that cannot be reached at start is a ``PlatformError`` (the start is retried
by ``gateway.supervisor``); a rejected token is a ``StartupError`` (``startup_errors``).

* Long polling (default): ``deleteWebhook``, then ``getUpdates`` in a loop that
  reconnects with backoff after network errors, flood waits or a conflicting instance.
  With several replicas (``gateway.ports.Leadership``, given by ``use_leadership``) only
  the leader of ``POLLING_LEADER`` polls; the others send replies and wait for the lock,
  and take over when the leader dies. A leader that loses its lock stops polling.
* Webhook (``TELEGRAM_WEBHOOK_URL``): a POST route on mnemo's local web server at the
  URL's path — put a TLS reverse proxy in front of it — and ``setWebhook`` with the
  secret at start. A request without the right ``X-Telegram-Bot-Api-Secret-Token``
  (compared in constant time) gets 403 and is not read. The hook answers 200 only
  after the update was handled, so a failure makes Telegram deliver it again. The
  webhook stays registered across restarts: Telegram keeps updates while mnemo is down.

What comes in is decided in ``adapters.telegram_updates`` (DMs, addressed group
messages, captions, quotes; edits ignored; unreadable media answered with a note).
Updates of one batch are handled concurrently across chats and in order within a chat.

Sending. The model's Markdown becomes Telegram HTML split at 4,096 UTF-16 units
(``adapters.telegram_format.render_chunks``; a reply over ``SPLIT_IN_THREAD_CHARS`` is
rendered and split in a worker thread, so other chats are not held while it is cut); a
chunk Telegram still refuses with "can't parse entities" is re-sent as its plain-text
twin. In groups the first chunk replies to the user's message
(``allow_sending_without_reply``: a deleted message does not block the answer); forum
replies stay in their topic. A flood wait of at most
``max_inline_wait_s`` is slept inside ``send``; a longer one becomes
``PlatformRateLimited`` and the outbox retries the reply later — the delivery loop
sends one reply at a time, so a long in-send wait would hold every other chat's
replies. Chunks already delivered are remembered per outbox row (in memory): a retry
after chunk 2 of 3 failed sends chunks 2 and 3 only. After a restart that memory is
gone; the outbox then re-sends the whole reply, labelled as a possible duplicate only
when the send was in flight at the crash. Telegram has no idempotency key, so a send
whose answer was lost on the network can be repeated.

Streaming (``gateway.ports.StreamsReplies``): ``stream_open`` posts one plain-text
message and ``stream_edit`` edits it (``editMessageText``); a flood wait is raised as
``PlatformRateLimited`` at once — the live reply skips edits, nothing sleeps. The
final reply (``send`` with ``stream_message_id``) edits that message into the first
formatted chunk, at least ``stream_interval_s`` after the last live edit (a wait of
at most that long inside ``send``), and sends the other chunks as usual; a streamed
message that is gone (deleted by the user) is replaced by a new one.

Errors: PTB's exceptions are mapped onto ``gateway.errors`` in ``platform_errors``, the
one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import re
import time
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, BotCommand, Message, ReplyParameters, Update
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.error import Forbidden as TgForbidden
from telegram.ext import Application, ApplicationBuilder, ContextTypes, ExtBot, JobQueue
from telegram.warnings import PTBDeprecationWarning

from mnemo.adapters.chat_typing import TypingLoops
from mnemo.adapters.telegram_format import TelegramChunk, render_chunks
from mnemo.adapters.telegram_polling import UpdatePoller
from mnemo.adapters.telegram_request import AiohttpRequest
from mnemo.adapters.telegram_updates import UNSUPPORTED_NOTE, Accept, BotIdentity, Unsupported, classify
from mnemo.gateway.config import TelegramSettings
from mnemo.gateway.errors import (
    Forbidden,
    PlatformError,
    PlatformRateLimited,
    PlatformUnavailable,
    StartupError,
)
from mnemo.gateway.events import Attachment, ChatRef, OutboundMessage, Submitted, delivery_label
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import CommandInfo, InboundSink, Leadership, UnreadableHook
from mnemo.gateway.webserver import WebServer

log = get_logger(__name__)

if TYPE_CHECKING:
    # What ``ApplicationBuilder()…build()`` returns: PTB's default bot and context types
    # (the user/chat/bot data dicts are PTB's own, unused here).
    TelegramApp: TypeAlias = Application[
        ExtBot[None],
        ContextTypes.DEFAULT_TYPE,
        dict[Any, Any],
        dict[Any, Any],
        dict[Any, Any],
        JobQueue[ContextTypes.DEFAULT_TYPE],
    ]

MAX_LEN = 4096
# The leader lock of long polling: one getUpdates per bot across replicas.
POLLING_LEADER = "telegram-polling"
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # the Bot API's getFile limit
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ("message", "edited_message")
MAX_INLINE_WAITS = 3
PROGRESS_ROWS = 1024  # outbox rows whose partial progress is remembered (and chats noted)
NOTE_INTERVAL_S = 60.0
# Rendering and splitting cost about 0.5 µs per character (bench/telegram_html.py):
# below this a reply takes the loop for a few ms at most, less than a thread hop's worth.
SPLIT_IN_THREAD_CHARS = 8_000
_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")

Sleep = Callable[[float], Awaitable[None]]


def retry_after_seconds(error: RetryAfter) -> float:
    """``RetryAfter.retry_after`` in seconds, whether PTB returns an int (and warns) or,
    with ``PTB_TIMEDELTA`` set, a timedelta."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = error.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def is_entity_error(error: BadRequest) -> bool:
    # PTB strips "Bad Request: " and capitalises the rest.
    return "can't parse entities" in error.message.lower()


def _not_modified(error: BadRequest) -> bool:
    return "message is not modified" in error.message.lower()


def _edit_target_gone(error: BadRequest) -> bool:
    text = error.message.lower()
    return "message to edit not found" in text or "message can't be edited" in text


@contextlib.contextmanager
def platform_errors(action: str) -> Iterator[None]:
    """Map python-telegram-bot failures of ``action`` onto ``gateway.errors``."""
    try:
        yield
    except RetryAfter as e:
        raise PlatformRateLimited(f"Telegram flood control on {action}", retry_after_seconds(e)) from e
    except TgForbidden as e:  # the user blocked the bot, or it was removed from the group
        raise Forbidden(f"Telegram refused {action}: {e.message}") from e
    except InvalidToken as e:  # 401/404: the token was revoked; replies wait for an operator
        raise PlatformUnavailable(
            f"Telegram rejected the bot token during {action}: check TELEGRAM_BOT_TOKEN (from @BotFather)"
        ) from e
    except Conflict as e:
        raise PlatformUnavailable(
            f"Telegram conflict during {action} (another instance polling, or a webhook is set): {e.message}"
        ) from e
    except ChatMigrated as e:  # only escapes when the re-send to the new id failed as well
        raise Forbidden(f"the group moved to chat {e.new_chat_id} during {action}") from e
    except BadRequest as e:  # chat not found, message too long…: sending it again cannot help
        raise Forbidden(f"Telegram refused {action}: {e.message}") from e
    except NetworkError as e:  # includes TimedOut and 5xx answers
        raise PlatformUnavailable(f"cannot reach Telegram for {action}: {e.message}") from e
    except TelegramError as e:
        raise PlatformUnavailable(f"Telegram failed {action}: {e.message}") from e


@contextlib.contextmanager
def startup_errors(action: str) -> Iterator[None]:
    """Like ``platform_errors``, for the calls ``start`` makes: a rejected token and a
    refused request are configuration errors (``StartupError``: ``mnemo run`` exits 2,
    and restarting cannot help), anything else stays a ``PlatformError`` to retry."""
    with platform_errors(action):
        try:
            yield
        except InvalidToken as e:  # getMe answered 401 / 404
            raise StartupError(
                f"Telegram rejected TELEGRAM_BOT_TOKEN while {action} (401 Unauthorized): "
                "check the token from @BotFather"
            ) from e
        except (BadRequest, TgForbidden) as e:  # e.g. a webhook URL Telegram will not use
            raise StartupError(f"Telegram refused {action}: {e.message}") from e


def label(message: OutboundMessage) -> str:
    marks = delivery_label(message)
    return marks + "\n\n" if marks else ""


@dataclass(frozen=True, slots=True)
class _Target:
    chat_id: int
    thread_id: int | None
    reply_to: int | None  # quoted by the first chunk (groups only)

    @classmethod
    def of(cls, message: OutboundMessage) -> _Target:
        chat = message.chat
        try:
            chat_id = int(chat.chat_id)
            thread_id = int(chat.thread_id) if chat.thread_id is not None else None
        except ValueError:
            raise Forbidden(f"{chat.chat_id!r} is not a Telegram chat id") from None
        reply = message.reply_to_message_id
        # Group and supergroup ids are negative. In a DM a quote is noise.
        quote = chat_id < 0 and reply is not None and reply.isdigit()
        return cls(chat_id, thread_id, int(reply) if quote and reply is not None else None)


class TelegramAdapter:
    name = "telegram"
    max_message_len = MAX_LEN
    supports_typing = True
    debounce_s: float | None = None
    stream_tokens = False

    def __init__(
        self,
        settings: TelegramSettings,
        *,
        web: WebServer | None = None,
        poll_timeout_s: float = 25.0,
        reconnect_backoff_s: tuple[float, float] = (1.0, 30.0),
        typing_interval_s: float = 5.0,
        max_inline_wait_s: float = 3.0,
        stream_interval_s: float = 1.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        # Telegram allows about one message per second in a chat; edits count.
        self.stream_interval_s = stream_interval_s
        # (chat, message) → monotonic time before which it must not be edited again
        self._stream_edited: OrderedDict[tuple[int, int], float] = OrderedDict()
        self.web = web
        self.menu: list[CommandInfo] = []  # the gateway's commands, given to start()
        self.poll_timeout_s = poll_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.max_inline_wait_s = max_inline_wait_s
        self._sleep = sleep
        self._app: TelegramApp | None = None
        self._identity: BotIdentity | None = None
        self._sink: InboundSink | None = None
        self._poller: UpdatePoller[Update] | None = None
        self._leadership: Leadership | None = None
        self._leading: asyncio.Task[None] | None = None
        self._typing = TypingLoops(self._send_typing, interval_s=typing_interval_s, platform="telegram")
        self._progress: OrderedDict[int, list[str]] = OrderedDict()
        self._noted: OrderedDict[str, float] = OrderedDict()  # chat → when it got the media note
        self._note_hook: UnreadableHook | None = None
        self.webhook_path: str | None = None
        if settings.webhook_url is not None and web is not None:
            # aiohttp freezes its routes when the server starts, which is before adapters.
            self.webhook_path = urlsplit(settings.webhook_url).path or "/"
            web.add_post(self.webhook_path, self._on_webhook)

    # --- lifecycle -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        if self._app is None or self._identity is None:
            return False
        if self.settings.webhook_url is not None:
            return True
        if self._leading is not None and self._poller is None:
            return not self._leading.done()  # a follower: sends replies, waits to lead
        return self._poller is not None and self._poller.running and self._poller.healthy

    def use_leadership(self, leadership: Leadership) -> None:
        self._leadership = leadership

    def on_unreadable(self, hook: UnreadableHook) -> None:
        self._note_hook = hook

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None:
        """Connect (``getMe``), set the menu, then poll or register the webhook.

        Raises ``StartupError`` for a configuration error — no token, a token Telegram
        rejects (401/404 from ``getMe``), a webhook Telegram refuses — and
        ``PlatformError`` when Telegram cannot be reached or fails (network, 5xx, flood
        wait): ``mnemo run``'s supervisor then calls ``start`` again later. A failed
        start leaves nothing open behind it, so the next call begins afresh."""
        if self._app is not None:
            return
        self.menu = list(commands)
        self._check_settings()
        assert self.settings.bot_token is not None
        root = self.settings.api_base_url.rstrip("/")
        app = (
            ApplicationBuilder()
            .token(self.settings.bot_token.get_secret_value())
            .base_url(root + "/bot")
            .base_file_url(root + "/file/bot")
            .request(AiohttpRequest())
            .get_updates_request(AiohttpRequest(pool_size=1))
            .updater(None)
            .build()
        )
        self._app, self._sink = app, sink
        try:
            with startup_errors(f"connecting to {root} (getMe)"):
                await app.initialize()
            bot = app.bot
            self._identity = BotIdentity(bot.id, bot.username)
            await self._set_commands(bot)
            if self.settings.webhook_url is not None:
                await self._set_webhook(bot, self.settings.webhook_url)
            else:
                with startup_errors("removing the webhook before polling"):
                    await bot.delete_webhook()
                if self._leadership is None:
                    self._start_polling()
                else:
                    self._leading = asyncio.create_task(self._lead(self._leadership), name="telegram-leader")
        except BaseException:
            await self.stop()
            raise
        mode = "webhook" if self.settings.webhook_url is not None else "polling"
        log.info("telegram_ready", bot=bot.username, mode=mode, groups=self.settings.groups_enabled)

    def _start_polling(self) -> None:
        low, high = self.reconnect_backoff_s
        self._poller = UpdatePoller(
            self._fetch, self._receive, timeout_s=self.poll_timeout_s, min_backoff_s=low, max_backoff_s=high
        )
        self._poller.start()

    async def _lead(self, leadership: Leadership) -> None:
        """Poll while this replica leads ``POLLING_LEADER``; wait for the lock otherwise."""
        while True:
            try:
                lease = await leadership.acquire(POLLING_LEADER)
            except Exception:  # loop boundary: the database is away; try again
                log.exception("telegram_leadership_failed")
                await self._sleep(self.reconnect_backoff_s[0])
                continue
            log.info("telegram_polling_leader")
            self._start_polling()
            try:
                await lease.lost()
                log.warning("telegram_polling_leadership_lost")
            finally:
                poller, self._poller = self._poller, None
                if poller is not None:
                    await poller.stop()
                await lease.release()

    def _check_settings(self) -> None:
        if self.settings.bot_token is None:
            raise StartupError("TELEGRAM_BOT_TOKEN is not set")
        if self.settings.webhook_url is None:
            return
        if self.settings.webhook_secret is None:
            raise StartupError(
                "TELEGRAM_WEBHOOK_URL is set without TELEGRAM_WEBHOOK_SECRET: anyone who learns the "
                "URL could post messages as any user. Set a secret (A-Z, a-z, 0-9, _ and -)."
            )
        if self.webhook_path is None:
            raise StartupError("Telegram webhook mode needs mnemo's local web server (mnemo run provides it)")

    async def _set_webhook(self, bot: Bot, url: str) -> None:
        assert self.settings.webhook_secret is not None
        with startup_errors("setting the webhook"):
            await bot.set_webhook(
                url,
                secret_token=self.settings.webhook_secret.get_secret_value(),
                allowed_updates=ALLOWED_UPDATES,
            )

    async def _set_commands(self, bot: Bot) -> None:
        commands = [
            BotCommand(c.name, (c.summary or c.name)[:256]) for c in self.menu if _COMMAND_NAME.match(c.name)
        ]
        try:
            with platform_errors("setting the command menu"):
                await bot.set_my_commands(commands)
        except PlatformError as e:  # messages work without a menu; say why it is missing
            log.warning("telegram_commands_not_set", error=str(e))

    async def stop(self) -> None:
        leading, self._leading = self._leading, None
        if leading is not None:
            leading.cancel()  # stops its poller and releases the lease
            await asyncio.gather(leading, return_exceptions=True)
        poller, self._poller = self._poller, None
        if poller is not None:
            await poller.stop()  # confirms handled updates: needs the bot still open
        await self._typing.close()
        app, self._app, self._identity = self._app, None, None
        if app is not None:
            await app.shutdown()
            # A start whose getMe failed left the Application uninitialised, which makes
            # its shutdown a no-op; the bot's HTTP pools are open all the same.
            await app.bot.shutdown()

    def _bot(self) -> Bot:
        if self._app is None:
            raise PlatformUnavailable("the Telegram adapter is not running")
        return self._app.bot

    # --- receiving -------------------------------------------------------------------

    async def _fetch(self, offset: int | None, timeout_s: float) -> Sequence[Update]:
        with platform_errors("polling for updates"):
            return await self._bot().get_updates(
                offset=offset, timeout=dt.timedelta(seconds=int(timeout_s)), allowed_updates=ALLOWED_UPDATES
            )

    async def _receive(self, updates: Sequence[Update]) -> None:
        """Hand a batch to the gateway: chats concurrently, each chat in order. Raises if
        a message could not be stored, so that the batch is not confirmed."""
        by_chat: defaultdict[int | None, list[Update]] = defaultdict(list)
        for update in updates:
            by_chat[update.effective_chat.id if update.effective_chat is not None else None].append(update)
        results = await asyncio.gather(
            *(self._receive_in_order(batch) for batch in by_chat.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _receive_in_order(self, updates: Sequence[Update]) -> None:
        for update in updates:
            await self._receive_one(update)

    async def _receive_one(self, update: Update) -> None:
        assert self._sink is not None and self._identity is not None
        try:
            verdict = classify(update, self._identity, groups_enabled=self.settings.groups_enabled)
        except Exception:  # loop boundary: an update we cannot read must not block the chat
            log.exception("telegram_update_unreadable", update_id=update.update_id)
            return
        if isinstance(verdict, Accept):
            await self._sink(verdict.message)  # a failure propagates: the update is fetched again
        elif isinstance(verdict, Unsupported):
            await self._answer_unsupported(verdict)
        else:
            log.debug("telegram_update_ignored", update_id=update.update_id, reason=verdict.reason)

    async def _answer_unsupported(self, note: Unsupported) -> None:
        """The "text only" note, through the gateway (``NotesUnreadable``): it answers
        only someone allowed to talk to the bot, after the same authorization as every
        message, and stores nothing. At most once per chat per ``NOTE_INTERVAL_S``: a
        burst of stickers must not become a burst of answers."""
        chat = note.message.chat_id
        log.info("telegram_media_unsupported", chat=chat, kind=note.kind)
        if self._note_hook is None:
            return
        last = self._noted.get(chat)
        if last is not None and time.monotonic() - last < NOTE_INTERVAL_S:
            return
        if await self._note_hook(note.message, UNSUPPORTED_NOTE) is not Submitted.ACCEPTED:
            return  # not for this person: a stranger's sticker does not silence the chat
        self._noted[chat] = time.monotonic()
        self._noted.move_to_end(chat)
        while len(self._noted) > PROGRESS_ROWS:
            self._noted.popitem(last=False)

    async def _on_webhook(self, request: web.Request) -> web.Response:
        secret = self.settings.webhook_secret
        given = request.headers.get(SECRET_HEADER)
        if (
            secret is None
            or given is None
            or not hmac.compare_digest(given.encode(), secret.get_secret_value().encode())
        ):
            log.warning("telegram_webhook_refused", remote=request.remote, reason="wrong or missing secret")
            return web.Response(status=403)
        app = self._app
        if app is None or self._identity is None:
            return web.Response(status=503)  # not started yet: Telegram delivers it again
        try:
            update = Update.de_json(await request.json(), app.bot)
        except (ValueError, TypeError, KeyError) as e:
            log.warning("telegram_webhook_bad_update", error=f"{type(e).__name__}: {e}")
            return web.Response(status=400)
        try:
            await self._receive([update])
        except Exception:  # boundary: not stored, so not acknowledged; Telegram retries
            log.exception("telegram_webhook_update_failed", update_id=update.update_id)
            return web.Response(status=500)
        return web.Response(status=200)

    # --- media ---------------------------------------------------------------------------

    async def fetch_media(self, attachment: Attachment) -> bytes:
        """``getFile`` then the file download (``ports.FetchesMedia``); the Bot API
        serves at most 20 MB, bigger files are refused before downloading."""
        with platform_errors("getFile"):
            file = await self._bot().get_file(attachment.ref)
            if file.file_size is not None and file.file_size > MAX_DOWNLOAD_BYTES:
                raise PlatformError(f"file too large: {file.file_size} bytes")
            return bytes(await file.download_as_bytearray())

    # --- sending ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> list[str]:
        bot = self._bot()
        target = _Target.of(message)
        text = label(message) + message.text
        if len(text) > SPLIT_IN_THREAD_CHARS:
            chunks = await asyncio.to_thread(render_chunks, text, self.max_message_len)
        else:
            chunks = render_chunks(text, self.max_message_len)
        row = message.outbox_id
        ids = list(self._progress.get(row, ())) if row is not None else []
        try:
            for index in range(len(ids), len(chunks)):
                if index == 0 and message.stream_message_id is not None:
                    ids.append(await self._finish_stream(bot, target, chunks[0], message.stream_message_id))
                else:
                    sent = await self._send_chunk(bot, target, chunks[index], first=index == 0)
                    ids.append(str(sent.message_id))
                if row is not None:
                    self._remember(row, ids)
        except Forbidden:
            if row is not None:
                self._progress.pop(row, None)
            raise
        if row is not None:
            self._progress.pop(row, None)
        return ids

    # --- streaming (ports.StreamsReplies) -----------------------------------------------

    async def stream_open(self, chat: ChatRef, text: str, *, reply_to: str | None) -> str:
        target = _Target.of(OutboundMessage(chat, text, reply_to_message_id=reply_to))
        reply = (
            ReplyParameters(target.reply_to, allow_sending_without_reply=True) if target.reply_to else None
        )
        with platform_errors("showing a reply"):
            sent = await self._bot().send_message(
                target.chat_id, text, message_thread_id=target.thread_id, reply_parameters=reply
            )
        self._hold_edits(target.chat_id, sent.message_id, self.stream_interval_s)
        return str(sent.message_id)

    async def stream_edit(self, chat: ChatRef, message_id: str, text: str) -> None:
        target = _Target.of(OutboundMessage(chat, text))
        try:
            with platform_errors("updating a reply"):
                try:
                    await self._bot().edit_message_text(
                        text, chat_id=target.chat_id, message_id=int(message_id)
                    )
                except BadRequest as e:
                    if not _not_modified(e):
                        raise
        except PlatformRateLimited as e:
            self._hold_edits(target.chat_id, int(message_id), e.retry_after)
            raise
        self._hold_edits(target.chat_id, int(message_id), self.stream_interval_s)

    def _hold_edits(self, chat_id: int, message_id: int, seconds: float) -> None:
        """No edit of this message for ``seconds`` (the pace, or a flood wait)."""
        self._stream_edited[(chat_id, message_id)] = time.monotonic() + seconds
        self._stream_edited.move_to_end((chat_id, message_id))
        while len(self._stream_edited) > PROGRESS_ROWS:
            self._stream_edited.popitem(last=False)

    async def _finish_stream(self, bot: Bot, target: _Target, chunk: TelegramChunk, stream_id: str) -> str:
        """The streamed message becomes the reply's first chunk; a new message when it is gone."""
        message_id = int(stream_id)
        not_before = self._stream_edited.get((target.chat_id, message_id))
        if not_before is not None:
            wait = not_before - time.monotonic()
            if wait > self.max_inline_wait_s:
                raise PlatformRateLimited("Telegram flood control on editing a streamed reply", wait)
            if wait > 0:
                await self._sleep(wait)
            self._stream_edited.pop((target.chat_id, message_id), None)
        waits = 0
        while True:
            try:
                with platform_errors("completing a streamed reply"):
                    try:
                        await self._edit_html(bot, target.chat_id, message_id, chunk)
                    except BadRequest as e:
                        if _not_modified(e):
                            return stream_id
                        if not _edit_target_gone(e):
                            raise
                        log.info("telegram_streamed_message_gone", chat=target.chat_id, error=e.message)
                        sent = await self._post(bot, target.chat_id, chunk, target, first=True)
                        return str(sent.message_id)
                    return stream_id
            except PlatformRateLimited as e:
                waits += 1
                if e.retry_after > self.max_inline_wait_s or waits > MAX_INLINE_WAITS:
                    raise
                log.info("telegram_flood_wait", chat=target.chat_id, retry_after=e.retry_after)
                await self._sleep(e.retry_after)

    async def _edit_html(self, bot: Bot, chat_id: int, message_id: int, chunk: TelegramChunk) -> None:
        try:
            await bot.edit_message_text(
                chunk.html, chat_id=chat_id, message_id=message_id, parse_mode=ParseMode.HTML
            )
        except BadRequest as e:
            if not is_entity_error(e):
                raise
            log.warning("telegram_html_refused", chat=chat_id, error=e.message)
            await bot.edit_message_text(chunk.plain, chat_id=chat_id, message_id=message_id)

    def _remember(self, row: int, ids: list[str]) -> None:
        self._progress[row] = list(ids)
        self._progress.move_to_end(row)
        while len(self._progress) > PROGRESS_ROWS:
            self._progress.popitem(last=False)

    async def _send_chunk(self, bot: Bot, target: _Target, chunk: TelegramChunk, *, first: bool) -> Message:
        waits = 0
        while True:
            try:
                with platform_errors("sending a message"):
                    try:
                        return await self._post(bot, target.chat_id, chunk, target, first=first)
                    except ChatMigrated as e:  # a group became a supergroup: same chat, new id
                        log.info("telegram_chat_migrated", chat=target.chat_id, new_chat=e.new_chat_id)
                        return await self._post(bot, e.new_chat_id, chunk, target, first=first)
            except PlatformRateLimited as e:
                waits += 1
                if e.retry_after > self.max_inline_wait_s or waits > MAX_INLINE_WAITS:
                    raise
                log.info("telegram_flood_wait", chat=target.chat_id, retry_after=e.retry_after)
                await self._sleep(e.retry_after)

    async def _post(
        self, bot: Bot, chat_id: int, chunk: TelegramChunk, target: _Target, *, first: bool
    ) -> Message:
        reply = (
            ReplyParameters(target.reply_to, allow_sending_without_reply=True)
            if first and target.reply_to is not None
            else None
        )
        try:
            return await bot.send_message(
                chat_id,
                chunk.html,
                parse_mode=ParseMode.HTML,
                message_thread_id=target.thread_id,
                reply_parameters=reply,
            )
        except BadRequest as e:
            if not is_entity_error(e):
                raise
            log.warning("telegram_html_refused", chat=chat_id, error=e.message)
            return await bot.send_message(
                chat_id, chunk.plain, message_thread_id=target.thread_id, reply_parameters=reply
            )

    # --- typing ----------------------------------------------------------------------

    def typing(self, chat: ChatRef) -> contextlib.AbstractAsyncContextManager[None]:
        """``typing…`` while the turn runs (``adapters.chat_typing``): Telegram shows it
        for 5 s, so it is re-sent every ``typing_interval_s``, one loop per chat. Never
        fails the turn."""
        return self._typing.hold(chat)

    async def _send_typing(self, chat: ChatRef) -> None:
        thread = int(chat.thread_id) if chat.thread_id is not None and chat.thread_id.isdigit() else None
        with platform_errors("showing typing"):
            await self._bot().send_chat_action(int(chat.chat_id), ChatAction.TYPING, message_thread_id=thread)
