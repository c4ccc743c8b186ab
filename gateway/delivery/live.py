"""A reply shown while it is generated: the per-turn stream sink.

The agent reports the model's text deltas (``delta``), a restart of a broken stream
(``reset``) and a tool call (``status``, a short line such as "🔧 search_sessions…")
to a ``StreamSink``. ``LiveReply`` is the one that shows them on a platform that
``StreamsReplies``: a task of its own posts one message and keeps editing it, so the
turn never waits for the platform.

Pacing. Edits of the message are at least ``interval_s`` apart, measured from the end
of the previous edit (``streaming.min_interval_s``, and never below the adapter's
``stream_interval_s``). The message is first posted only once the reply has been
coming for ``interval_s``: a quick reply is delivered exactly as without streaming. A
rate limit (``PlatformRateLimited``) skips edits until its ``retry_after`` has passed —
nothing sleeps in the turn. Any other platform error ends the live view of this reply
(logged); the reply itself is still delivered by the outbox. Adapters that take tokens
(``stream_tokens``, the web chat) get every change at once, without pacing.

Durability. As soon as the platform has given the message an id, it is recorded in the
stream ledger (``streams.py``) under the inbox row the reply answers; delivery then
edits that message into the final reply. A turn re-run after a crash finds the record,
edits the half-written message to ``INTERRUPTED`` first and keeps using it.

A turn can start before its adapter is connected (unfinished turns are resumed at
start-up): the task then waits for the connection, the turn does not.

``close`` ends the task; it waits for an edit already sent (bounded by
``close_wait_s``), so no stale edit can land after the final one. A post already sent
is never given up: once the platform may have the message, ``close`` waits for its id
and its record in the ledger whatever the load (the adapter's own request timeouts
bound the wait), because a message posted but not recorded would be sent again as a
second copy by delivery. A stream ended before its post leaves nothing to record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from mnemo.gateway.config import StreamingSettings
from mnemo.gateway.delivery.streams import INTERRUPTED, StreamLedger
from mnemo.gateway.errors import PlatformError, PlatformRateLimited
from mnemo.gateway.events import ChatRef
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import StreamsReplies
from mnemo.memory.errors import StoreError

log = get_logger(__name__)

CLOSE_WAIT_S = 10.0  # longest wait at the end of a turn for an edit already sent
CURSOR = " …"  # marks text still being written
CONNECT_POLL_S = 0.1  # how often a live reply looks whether its adapter is connected yet


class StreamSink(Protocol):
    def delta(self, text: str) -> None: ...

    def reset(self) -> None: ...

    def status(self, line: str) -> None: ...


def tool_status(name: str) -> str:
    return f"🔧 {name}…"


def fit_utf16(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-16 code units (Telegram's measure; at most
    as many characters as Discord's), with "…" when cut."""
    if len(text.encode("utf-16-le")) // 2 <= limit:
        return text
    cut = text.encode("utf-16-le")[: max(0, limit - 1) * 2].decode("utf-16-le", errors="ignore")
    return cut + "…"


class LiveReply:
    """The ``StreamSink`` of one turn on one chat. ``start`` it, hand it to the agent,
    ``close`` it before the reply is queued."""

    def __init__(
        self,
        adapter: StreamsReplies,
        streams: StreamLedger,
        chat: ChatRef,
        inbox_id: int,
        *,
        reply_to: str | None,
        interval_s: float,
        max_len: int,
        message_id: str | None = None,
        show_deltas: bool = True,
        close_wait_s: float = CLOSE_WAIT_S,
        on_shown: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.adapter = adapter
        self.streams = streams
        self.chat = chat
        self.inbox_id = inbox_id
        self.reply_to = reply_to
        self.tokens = bool(getattr(adapter, "stream_tokens", False))
        self.interval_s = 0.0 if self.tokens else interval_s
        self.max_len = max_len
        self.message_id = message_id
        self.show_deltas = show_deltas
        self.close_wait_s = close_wait_s
        self._on_shown = on_shown  # called once, when the message is first on screen
        self._clock = clock
        self._text = ""
        self._status: str | None = None
        self._after_tool = False  # the next delta starts a new response: the old text goes
        self._note = message_id is not None  # a re-run: INTERRUPTED is the first edit
        self._first_delta_at: float | None = None
        self._next_at = 0.0
        self._shown: str | None = None
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._posting: asyncio.Task[None] | None = None  # the post and its record, never cancelled
        self.edits = 0  # messages posted or edited (for logs and tests)

    # --- the sink (called from the agent; never blocks) -----------------------------
    def delta(self, text: str) -> None:
        if not self.show_deltas:
            return
        if self._after_tool:
            self._text, self._status, self._after_tool = "", None, False
        if self._first_delta_at is None:
            self._first_delta_at = self._clock()
        self._text += text
        self._changed.set()

    def reset(self) -> None:
        self._text = ""
        self._changed.set()

    def status(self, line: str) -> None:
        if not self.show_deltas:
            return
        self._status, self._after_tool = line, True
        if self._first_delta_at is None:
            self._first_delta_at = self._clock()
        self._changed.set()

    # --- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        if self._note:
            self._changed.set()
        self._task = asyncio.create_task(self._run(), name=f"live-reply-{self.inbox_id}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._closing.set()
        self._changed.set()
        try:
            async with asyncio.timeout(self.close_wait_s):
                await asyncio.shield(task)
        except TimeoutError:
            log.warning("live_reply_close_timeout", chat=self.chat.chat_id)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self._finish_post()

    async def _finish_post(self) -> None:
        """Wait for a post the cancelled task left in flight: its id must be recorded
        (or the message marked and dropped) before the reply is queued."""
        posting = self._posting
        if posting is None:
            return
        try:
            await posting
        except PlatformError as e:
            log.warning("live_reply_stopped", chat=self.chat.chat_id, error=f"{type(e).__name__}: {e}")
        except StoreError as e:
            log.warning("live_reply_not_recorded", chat=self.chat.chat_id, error=str(e))
            await self._abandon()

    def _display(self) -> str:
        if self._note:  # always shown first: the old text must not stay up meanwhile
            return INTERRUPTED
        cursor = "" if self.tokens else CURSOR  # token frames only ever append
        parts = [self._text.rstrip() + cursor if self._text.strip() else ""]
        if self._status:
            parts.append(self._status)
        return fit_utf16("\n\n".join(p for p in parts if p), self.max_len)

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` unless the turn ends first; False when it ended."""
        if seconds > 0:
            try:
                async with asyncio.timeout(seconds):
                    await self._closing.wait()
            except TimeoutError:
                return True
        return not self._closing.is_set()

    async def _run(self) -> None:
        try:
            while True:
                await self._changed.wait()
                if self._closing.is_set():
                    return
                now = self._clock()
                start_at = self._next_at
                if self.message_id is None and self._first_delta_at is not None:
                    start_at = max(start_at, self._first_delta_at + self.interval_s)
                if not await self._pause(start_at - now):
                    return
                while not getattr(self.adapter, "connected", True):  # a turn recovered at start-up
                    if not await self._pause(CONNECT_POLL_S):
                        return
                self._changed.clear()
                text = self._display()
                if not text.strip() or text == self._shown:
                    continue
                if not await self._show(text):
                    return
        except Exception:  # a bug here must not fail the turn: the outbox still delivers
            log.exception("live_reply_failed", chat=self.chat.chat_id)

    async def _show(self, text: str) -> bool:
        """Post or edit once; False when the live view ends."""
        try:
            if self.message_id is None:
                self._posting = asyncio.create_task(self._post(text), name=f"live-post-{self.inbox_id}")
                await asyncio.shield(self._posting)  # close() waits for it if it is cut short
                self._posting = None
            else:
                await self.adapter.stream_edit(self.chat, self.message_id, text)
        except PlatformRateLimited as e:
            self._next_at = self._clock() + max(e.retry_after, self.interval_s)
            log.info("live_reply_rate_limited", chat=self.chat.chat_id, retry_after=e.retry_after)
            self._changed.set()  # show the newest text once the wait is over
            return True
        except PlatformError as e:
            log.warning("live_reply_stopped", chat=self.chat.chat_id, error=f"{type(e).__name__}: {e}")
            return False
        except StoreError as e:
            # Not recorded: delivery cannot find this message, so it must not look like the answer.
            log.warning("live_reply_not_recorded", chat=self.chat.chat_id, error=str(e))
            await self._abandon()
            return False
        self.edits += 1
        self._shown = text
        if self._on_shown is not None:
            on_shown, self._on_shown = self._on_shown, None
            on_shown()
        if text == INTERRUPTED:
            self._note = False
            self._changed.set()  # the new text, if any, follows at the next slot
        self._next_at = self._clock() + self.interval_s
        return True

    async def _post(self, text: str) -> None:
        message_id = await self.adapter.stream_open(self.chat, text, reply_to=self.reply_to)
        self.message_id = message_id
        await self.streams.record(self.inbox_id, self.chat, message_id)

    async def _abandon(self) -> None:
        if self.message_id is None:
            return
        try:
            await self.adapter.stream_edit(self.chat, self.message_id, INTERRUPTED)
        except PlatformError as e:
            log.warning("live_reply_not_marked", chat=self.chat.chat_id, error=str(e))


async def live_reply(
    settings: StreamingSettings,
    adapter: object,
    streams: StreamLedger | None,
    chat: ChatRef,
    inbox_id: int,
    *,
    reply_to: str | None,
    dm: bool,
    on_shown: Callable[[], None] | None = None,
) -> LiveReply | None:
    """The turn's live reply, started; None when nothing is to be shown.

    Streaming applies per ``settings`` (DMs by default). A message left by a run that
    crashed mid-stream is taken over even when streaming is now off: it is marked
    ``INTERRUPTED`` at once, and delivery turns it into the answer."""
    if streams is None or not isinstance(adapter, StreamsReplies):
        return None
    previous = await streams.get(inbox_id)
    enabled = settings.applies(chat.platform, dm=dm)
    if not enabled and previous is None:
        return None
    live = LiveReply(
        adapter,
        streams,
        chat,
        inbox_id,
        reply_to=reply_to,
        interval_s=max(settings.min_interval_s, adapter.stream_interval_s),
        max_len=int(getattr(adapter, "max_message_len", 4096)),
        message_id=previous.message_id if previous is not None and previous.chat == chat else None,
        show_deltas=enabled,
        on_shown=on_shown,
    )
    live.start()
    return live


class LiveReplies:
    """Opens each turn's live reply (``live_reply``) on the adapter of its chat."""

    def __init__(
        self, settings: StreamingSettings, adapters: Mapping[str, object], streams: StreamLedger | None
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        self.streams = streams

    async def open(
        self,
        chat: ChatRef,
        inbox_id: int,
        *,
        reply_to: str | None,
        dm: bool,
        on_shown: Callable[[], None] | None = None,
    ) -> LiveReply | None:
        adapter = self.adapters.get(chat.platform)
        return await live_reply(
            self.settings, adapter, self.streams, chat, inbox_id, reply_to=reply_to, dm=dm, on_shown=on_shown
        )
