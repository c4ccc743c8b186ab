"""The platform-independent pipeline: ``Gateway.submit`` → lane → agent → outbox.

What happens to an inbound message, in this order, is one method (``submit``):

1. **authorize** — allowlists, admins, pairing, rate limit (``gateway.access``); a
   refused message is never stored, only logged, and its refusal is sent directly;
2. **bind log context** — platform, chat, user for every log line of this message;
3. **persist** — the durable inbox (insert-or-ignore on platform+chat+message id), so
   a redelivered update is a no-op and an accepted one survives a crash;
4. **dispatch** — control commands run now (they bypass the queue); everything else
   goes to the lane of its session key.

Authorization comes first so nothing of an unauthorized user is stored; persisting
comes before dispatch so a message is never acknowledged before it is durable.

A turn (``_run_turn``) first passes the speaker's budget (``gateway/budgets``: at a
cap, one notice per reset and no LLM request), then resolves the chat's session, builds a fresh ``Agent`` from the
store, runs it under the adapter's typing indicator, writes the reply to the outbox
and marks the inbox rows done, then enqueues background work. On start, inbox rows
left unfinished by a crash are fed back into their lanes; the agent recognises a user
message it already stored and a reply it already produced, so nothing is asked twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from mnemo.gateway.commands import ChatControl, parse_command
from mnemo.gateway.config import Settings
from mnemo.gateway.delivery import Ledgers
from mnemo.gateway.delivery.live import LiveReply, live_reply
from mnemo.gateway.delivery.outbox import DeliveryLoop
from mnemo.gateway.events import (
    SILENT,
    ChatRef,
    InboundMessage,
    OutboundMessage,
    Submitted,
    chat_of,
    from_payload,
    key_for,
    to_payload,
)
from mnemo.gateway.inbound.access import AccessControl, Verdict
from mnemo.gateway.inbound.lanes import LaneSet
from mnemo.gateway.llm.client import context_window
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MAX_ATTACHMENTS_PER_TURN, MAX_DOWNLOAD_BYTES
from mnemo.gateway.media import note as media_note
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.ports import Adapter, FetchesMedia, ReportsReachability
from mnemo.gateway.transcription import NOT_SET_UP as VOICE_NOT_SET_UP
from mnemo.gateway.transcription import NOTICE_INTERVAL_S as VOICE_NOTICE_INTERVAL_S
from mnemo.gateway.transcription import TRANSCRIBED, TranscriptionError, transcribe
from mnemo.gateway.turns.agent import Agent, AgentDeps, TurnInput, TurnResult
from mnemo.gateway.turns.model_input import turn_notes
from mnemo.gateway.turns.sessions import JobSink, SessionResolver
from mnemo.gateway.turns.tools import TurnContext, turn_context
from mnemo.memory.manager import MemoryManager
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import SessionRow

log = get_logger(__name__)

ORDER_RETRY_S = 0.05  # a turn waiting for an older message of its chat on another replica


class _GiveWay(Exception):
    """An older message of the chat is queued behind this turn in this process's lane."""


MEDIA_TIMEOUT_S = 60.0  # one attachment's download
VOICE_KINDS = frozenset({"voice", "audio"})


@dataclass(frozen=True, slots=True)
class Queued:
    inbox_id: int
    msg: InboundMessage


def turn_text(batch: Sequence[InboundMessage]) -> str:
    parts = []
    for m in batch:
        text = m.text
        if m.reply_to:
            quoted = m.reply_to[:500].replace("\n", "\n> ")
            text = f"> {quoted}\n{text}"
        unread = [a for a in m.attachments if not a.ref]  # downloadable ones: ``_media``
        if unread:
            kinds = ", ".join(a.kind + (f" ({a.name})" if a.name else "") for a in unread)
            text = f"{text}\n[attached: {kinds}]".strip()
        parts.append(text)
    return "\n".join(parts)


class Gateway:
    """The inbound chain and the turn. Collaborators, each a narrow port or a store:
    ``sessions`` (which session, its frozen prompt), ``agent`` (the LLM, the session
    store and the tools a turn's agent is built from), the two durable ledgers, access
    control, the command registry, the memory providers, the job queue, metrics."""

    def __init__(
        self,
        settings: Settings,
        *,
        sessions: SessionResolver,
        agent: AgentDeps,
        ledgers: Ledgers,
        access: AccessControl,
        commands: CommandHandler | None = None,
        providers: MemoryManager | None = None,
        jobs: JobSink | None = None,
        metrics: Metrics | None = None,
        budget: TurnBudget | None = None,
    ) -> None:
        self.settings = settings
        self.budget = budget
        self.sessions = sessions
        self.deps = agent
        self.inbox = ledgers.inbox
        self.outbox = ledgers.outbox
        self.access = access
        self.commands = commands
        self.providers = providers
        self.jobs = jobs
        self.adapters: dict[str, Adapter] = {}
        self.metrics = metrics or Metrics()
        self.metrics.on_scrape(self._refresh_gauges)
        self.streams = ledgers.streams
        self.delivery = DeliveryLoop(
            self.outbox, self.adapters, on_sent=self._count_sent, streams=self.streams
        )
        self.lanes: LaneSet[Queued] = LaneSet(
            self._run_turn,
            debounce_s=settings.gateway.debounce_s,
            idle_s=settings.gateway.lane_idle_s,
            debounce_for=self._debounce_for,
        )
        self.turn_listeners: list[Callable[[TurnContext, TurnResult], Awaitable[None]]] = []
        self._voice_noticed: dict[ChatRef, float] = {}  # chat -> when "voice is not set up" was said
        self._started = False

    # --- lifecycle -------------------------------------------------------------------
    def add_adapter(self, adapter: Adapter) -> None:
        if adapter.name in self.adapters:
            raise ValueError(f"adapter {adapter.name!r} already added")
        self.adapters[adapter.name] = adapter
        if isinstance(adapter, ReportsReachability):
            adapter.on_chat_reachable(self.delivery.chat_reachable)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await self.delivery.start()
        await self.recover()

    async def stop(self, drain_s: float = 5.0) -> None:
        if not self._started:
            return
        self._started = False
        await self.lanes.drain(drain_s)
        await self.lanes.stop()
        await self.delivery.deliver_due()
        await self.delivery.stop()

    async def recover(self, rows: Sequence[Any] | None = None) -> int:
        """Feed inbox rows left unfinished by a crash back into their lanes: at start the
        inbox's ``unfinished()``; on PostgreSQL also the rows adopted from a dead replica
        (``gateway/replicas.py``)."""
        rows = await self.inbox.unfinished() if rows is None else rows
        for row in rows:
            msg = from_payload(row.payload)
            self.lanes.submit(self.session_key(msg), Queued(row.id, msg))
        if rows:
            log.info("inbox_recovered", count=len(rows))
        return len(rows)

    # --- the inbound chain -----------------------------------------------------------
    def session_key(self, msg: InboundMessage) -> str:
        return key_for(msg, per_user=self.settings.sessions.group_sessions_per_user)

    def is_admin(self, msg: InboundMessage) -> bool:
        return self.access.is_admin(msg.platform, msg.user_id)

    def stop_turn(self, key: str) -> bool:
        return self.lanes.cancel_current(key)

    def queue_state(self, key: str) -> tuple[int, bool]:
        return self.lanes.queued(key), self.lanes.busy(key)

    async def submit(self, msg: InboundMessage) -> Submitted:
        """Called by adapters for every supported inbound message. Returns what became
        of it, so an adapter can close a pending interaction that will get no reply."""
        decision = await self.access.check(msg)
        if decision.verdict is not Verdict.ALLOW:
            self.metrics.refused.inc()
            if decision.verdict is Verdict.REFUSE and decision.reply:
                await self._send_direct(chat_of(msg), decision.reply, msg)
                return Submitted.REFUSED
            return Submitted.DROPPED
        with structlog.contextvars.bound_contextvars(
            platform=msg.platform, chat=msg.chat_id, user=msg.user_id
        ):
            row = await self.inbox.accept(msg.platform, msg.chat_id, msg.message_id, to_payload(msg))
            if row is None:
                log.debug("duplicate_delivery_ignored", message_id=msg.message_id)
                return Submitted.DUPLICATE
            self.metrics.messages_in.labels(msg.platform).inc()
            command = parse_command(msg.text) if msg.agent_context is AgentContext.PRIMARY else None
            if command is not None and self.commands is not None:
                # Known or not, a /word never reaches the model: an unknown one is
                # answered with a pointer to /help.
                await self._run_command(row.id, msg, *command)
                return Submitted.ACCEPTED
            self.lanes.submit(self.session_key(msg), Queued(row.id, msg))
            return Submitted.ACCEPTED

    async def _run_command(self, inbox_id: int, msg: InboundMessage, name: str, args: str) -> None:
        assert self.commands is not None
        try:
            reply = await self.commands.run(self, msg, name, args)
        except Exception:  # loop boundary: a broken command answers, never crashes the adapter
            log.exception("command_failed", command=name)
            reply = f"/{name} failed unexpectedly; the error is in the bot's log."
        await self.reply(msg, reply, inbox_id=inbox_id, kind="command")
        await self.inbox.mark_done(inbox_id)

    def _debounce_for(self, item: Queued) -> float | None:
        adapter = self.adapters.get(item.msg.platform)
        return adapter.debounce_s if adapter is not None else None

    # --- sessions ---------------------------------------------------------------------
    async def reset(self, msg: InboundMessage) -> SessionRow | None:
        """/reset: end the chat's session; the next message starts a new one."""
        return await self.sessions.reset(self.session_key(msg))

    def turn_context(self, msg: InboundMessage, session: SessionRow, key: str) -> TurnContext:
        return turn_context(
            msg,
            session_id=session.id,
            chat_key=key,
            is_admin=self.is_admin(msg),
            shared_room=self.sessions.shared_room(msg),
        )

    # --- a turn -----------------------------------------------------------------------
    def _typing(self, chat: ChatRef) -> contextlib.AbstractAsyncContextManager[None]:
        adapter = self.adapters.get(chat.platform)
        if adapter is None or not adapter.supports_typing or not adapter.connected:
            return contextlib.nullcontext()
        return adapter.typing(chat)

    async def _turn_notes(self, msg: InboundMessage, text: str, ctx: TurnContext) -> str:
        """This turn's notes for the model (``model_input.turn_notes``): the providers'
        recall, and in a shared room the speaker's profile."""
        recall = None
        if self.providers is not None:
            prefetched = await self.providers.prefetch(text, ctx.for_providers(self.settings.home))
            recall = prefetched.text if prefetched is not None else None
        profile = None
        if self.sessions.shared_room(msg):
            profile = (await asyncio.to_thread(self.sessions.files.blocks, msg.speaker)).user_block
        return turn_notes(recall=recall, speaker_profile=profile, speaker_label=msg.user_name or msg.user_id)

    async def _run_turn(self, key: str, batch: Sequence[Queued]) -> None:
        """A turn within its speaker's budget (``gateway/budgets``): someone at a cap is
        told once per reset when it lifts and no LLM request is made."""
        last = batch[-1].msg
        # The log context is this batch's: a lane's task was created in the context of
        # its first message, so in a shared room it would otherwise log that sender.
        with structlog.contextvars.bound_contextvars(
            platform=last.platform, chat=last.chat_id, user=last.user_id
        ):
            await self._run_turn_as(key, batch, last)

    async def _run_turn_as(self, key: str, batch: Sequence[Queued], last: InboundMessage) -> None:
        if self.budget is None:
            return await self._turn(key, batch)
        async with self.budget.turn(last.speaker, admin=self.is_admin(last)) as refusal:
            if refusal is None:
                return await self._turn(key, batch)
        log.info("turn_over_budget", key=key, cap=refusal.cap, notified=refusal.notify)
        if refusal.notify:
            await self._finish(batch, refusal.text, kind="notice")
        else:
            for q in batch:
                await self.inbox.mark_done(q.inbox_id)

    async def _turn(self, key: str, batch: Sequence[Queued]) -> None:
        last = batch[-1].msg
        for q in batch:
            await self.inbox.mark_processing(q.inbox_id)
        chat = chat_of(last)
        text = turn_text([q.msg for q in batch])
        try:
            if not text and self._voice_unavailable(batch):
                return await self._voice_not_set_up(batch)
            media_refs, media_text = await self._media([q.msg for q in batch])
            text = "\n".join(t for t in (text, media_text) if t) or "(attachment)"
            async with self._typing(chat), self._ordered_lock(key, batch):
                session = await self.sessions.resolve(last, key)
                ctx = self.turn_context(last, session, key)
                agent = await Agent.load(self.deps, session, ctx)
                agent.label_authors = self.sessions.shared_room(last)
                agent.stream = live = await self._live_reply(last, batch[-1].inbox_id)
                try:
                    result = await agent.run(
                        TurnInput(
                            text=text,
                            author_id=last.user_id,
                            author_name=last.user_name,
                            platform_message_id=last.message_id,
                            request_context=await self._turn_notes(last, text, ctx),
                            meta={"message_ids": [q.msg.message_id for q in batch]}
                            | ({"media": media_refs} if media_refs else {}),
                        )
                    )
                finally:
                    if live is not None:
                        await live.close()  # before the reply is queued: no edit after the final one
        except _GiveWay:  # an older message of the chat is queued behind: it goes first
            await asyncio.sleep(ORDER_RETRY_S)
            for q in batch:
                self.lanes.submit(key, q)
            return
        except asyncio.CancelledError:
            # /stop: the turn is abandoned; the messages are answered with a note.
            await self._finish(batch, "Stopped.", kind="notice")
            raise
        except Exception:
            self.metrics.errors.labels("turn").inc()
            log.exception("turn_failed", key=key)
            await self._finish(
                batch, "Sorry — something went wrong on my side. Please try again.", kind="notice"
            )
            return
        await self._finish(
            batch,
            self._with_recall_note(result.reply or "(no reply)", key),
            kind="reply",
            session_id=session.id,
        )
        await self._after_turn(last, session, ctx, text, result)

    @contextlib.asynccontextmanager
    async def _ordered_lock(self, key: str, batch: Sequence[Queued]) -> AsyncIterator[None]:
        """The session's lock, taken when no older message of the chat waits. With several
        replicas (PostgreSQL) a chat's messages may sit in different replicas' lanes: the
        inbox says whether an older one is unfinished elsewhere (then this turn waits for
        it) or queued behind this turn here, adopted from a dead replica (then this turn
        raises ``_GiveWay`` and goes to the back of its lane). One process (SQLite) has one
        FIFO lane per session: just the lock."""
        earlier = getattr(self.inbox, "earlier_unfinished", None)  # PgInbox only
        ids = [q.inbox_id for q in batch]
        while True:
            async with self.sessions.lock(key):
                waiting = None if earlier is None else await earlier(min(ids), ids)
                if waiting is None:
                    yield
                    return
            if waiting == "own":
                raise _GiveWay
            await asyncio.sleep(ORDER_RETRY_S)

    async def _live_reply(self, msg: InboundMessage, inbox_id: int) -> LiveReply | None:
        """The turn's stream sink (``gateway/delivery/live.py``), or None."""
        return await live_reply(
            self.settings.streaming,
            self.adapters.get(msg.platform),
            self.streams,
            chat_of(msg),
            inbox_id,
            reply_to=msg.message_id,
            dm=msg.is_dm and not msg.private,
        )

    def _voice_unavailable(self, batch: Sequence[Queued]) -> bool:
        atts = [a for q in batch for a in q.msg.attachments]
        return (
            self.settings.transcription.url is None
            and bool(atts)
            and all(a.kind in VOICE_KINDS for a in atts)
        )

    async def _voice_not_set_up(self, batch: Sequence[Queued]) -> None:
        """Only voice and no transcription server: no turn; "not set up" at most once
        per chat per hour."""
        chat = chat_of(batch[-1].msg)
        now = time.monotonic()
        last = self._voice_noticed.get(chat)
        if last is None or now - last >= VOICE_NOTICE_INTERVAL_S:
            self._voice_noticed[chat] = now
            await self._finish(batch, VOICE_NOT_SET_UP, kind="notice")
        else:
            for q in batch:
                await self.inbox.mark_done(q.inbox_id)

    async def _media(self, batch: Sequence[InboundMessage]) -> tuple[list[dict[str, Any]], str]:
        """Download and prepare the batch's attachments (``gateway.media``): stored
        references for the user message and text for the turn (inlined files, notes).
        A failure is a note for that attachment; the turn goes on."""
        refs: list[dict[str, Any]] = []
        texts: list[str] = []
        wanted = [(m, a) for m in batch for a in m.attachments if a.ref]
        if not wanted or self.deps.media is None:
            return refs, ""
        skipped = len(wanted) - MAX_ATTACHMENTS_PER_TURN
        for m, a in wanted[:MAX_ATTACHMENTS_PER_TURN]:
            adapter = self.adapters.get(m.platform)
            if a.size is not None and a.size > MAX_DOWNLOAD_BYTES:
                texts.append(media_note(a.name, "too large (over 20 MB), not read").text)
                continue
            if a.kind in VOICE_KINDS and self.settings.transcription.url is None:
                texts.append(media_note(a.name, "a voice message; voice is not set up on this bot").text)
                continue
            if not isinstance(adapter, FetchesMedia):
                texts.append(media_note(a.name, "could not be downloaded").text)
                continue
            try:
                async with asyncio.timeout(MEDIA_TIMEOUT_S):
                    data = await adapter.fetch_media(a)
            except Exception as e:  # a failed or timed-out download is a note, not a failed turn
                log.warning("media_download_failed", kind=a.kind, error=f"{type(e).__name__}: {e}")
                texts.append(media_note(a.name, "the download failed, not read").text)
                continue
            if a.kind in VOICE_KINDS:
                try:
                    spoken = await transcribe(
                        self.settings.transcription, data, filename=a.name, media_type=a.media_type
                    )
                except TranscriptionError as e:
                    log.warning("transcription_failed", error=str(e))
                    texts.append(media_note(a.name, "the voice message could not be transcribed").text)
                    continue
                texts.append(
                    f"{TRANSCRIBED} {spoken}" if spoken else media_note(a.name, "no speech heard").text
                )
                continue
            prepared = await asyncio.to_thread(self.deps.media.prepare, a.kind, a.name, a.media_type, data)
            refs.extend(prepared.refs)
            if prepared.text:
                texts.append(prepared.text)
        if skipped > 0:
            texts.append(
                f"[{skipped} more attachment(s) not read: at most {MAX_ATTACHMENTS_PER_TURN} per message]"
            )
        return refs, "\n".join(texts)

    def _with_recall_note(self, reply: str, key: str) -> str:
        if self.providers is None or not self.settings.memory.show_recall_indicator:
            return reply
        indicator = self.providers.recall_indicator(key)
        return f"{reply}\n\n{indicator.render()}" if indicator is not None and indicator.count else reply

    async def _finish(
        self, batch: Sequence[Queued], text: str, *, kind: str, session_id: str | None = None
    ) -> None:
        last = batch[-1]
        await self.reply(last.msg, text, inbox_id=last.inbox_id, kind=kind, session_id=session_id)
        for q in batch:
            await self.inbox.mark_done(q.inbox_id)

    async def reply(
        self,
        msg: InboundMessage,
        text: str,
        *,
        inbox_id: int | None = None,
        kind: str = "reply",
        session_id: str | None = None,
    ) -> int:
        out = OutboundMessage(
            chat=chat_of(msg),
            text=text,
            reply_to_message_id=msg.message_id,
            mention_user_id=msg.user_id,
            scheduled=kind == "cron",
        )
        row_id = await self.outbox.enqueue(out, kind=kind, session_id=session_id, inbox_id=inbox_id)
        self.delivery.wake()
        return row_id

    async def _send_direct(self, chat: ChatRef, text: str, msg: InboundMessage) -> None:
        """Refusals bypass the outbox: nothing of an unauthorized user is stored."""
        adapter = self.adapters.get(chat.platform)
        if adapter is None:
            return
        try:
            await adapter.send(
                OutboundMessage(
                    chat=chat, text=text, reply_to_message_id=msg.message_id, mention_user_id=msg.user_id
                )
            )
        except Exception as e:  # loop boundary: best effort, logged
            log.warning("refusal_not_sent", platform=chat.platform, error=f"{type(e).__name__}: {e}")

    async def run_scheduled(self, msg: InboundMessage, *, deliver: bool = True) -> TurnResult:
        """A cron run: the same agent pipeline in a fresh session (``source="cron"``,
        ``agent_context="cron"``) scoped to the target chat, never mirrored into that
        chat's conversation. The result goes out through the outbox unless it is exactly
        ``[SILENT]``."""
        if msg.agent_context is not AgentContext.CRON:
            raise ValueError("run_scheduled takes a cron message")
        key = self.session_key(msg)
        session = await self.sessions.start(msg, key, source="cron")
        ctx = self.turn_context(msg, session, key)
        try:
            agent = await Agent.load(self.deps, session, ctx)
            result = await agent.run(
                TurnInput(
                    text=msg.text,
                    author_id=msg.user_id,
                    author_name="scheduled job",
                    platform_message_id=msg.message_id,
                )
            )
        finally:
            await self.sessions.store.end_session(session.id, "cron_done")
        if deliver and result.reply.strip() != SILENT and not result.failed:
            await self.reply(msg, result.reply, kind="cron", session_id=session.id)
        return result

    async def notify_admins(self, text: str) -> None:
        """A notice to every admin's DM, through the outbox."""
        for admin in self.settings.access.admins:
            platform, _, user_id = admin.partition(":")
            await self.outbox.enqueue(OutboundMessage(ChatRef(platform, user_id), text), kind="notice")
        self.delivery.wake()

    def wake_delivery(self) -> None:
        self.delivery.wake()

    def _count_sent(self, row: Any) -> None:
        self.metrics.messages_out.labels(row.chat.platform).inc()

    async def _refresh_gauges(self) -> None:
        self.metrics.queue_depth.labels("lanes").set(sum(self.lanes.queued(k) for k in self.lanes.keys()))
        counts = await self.outbox.counts()
        self.metrics.queue_depth.labels("outbox").set(counts.get("queued", 0) + counts.get("sending", 0))
        if self.jobs is not None:
            self.metrics.queue_depth.labels("jobs").set(await self.jobs.depth())

    async def health(self) -> dict[str, Any]:
        """/healthz: adapters connected and queue depths."""
        counts = await self.outbox.counts()
        adapters = {name: a.connected for name, a in self.adapters.items()}
        body: dict[str, Any] = {
            "status": "ok" if self._started and all(adapters.values()) else "degraded",
            "adapters": adapters,
            "lanes": len(self.lanes),
            "queued_messages": sum(self.lanes.queued(k) for k in self.lanes.keys()),
            "outbox_pending": counts.get("queued", 0) + counts.get("sending", 0),
            "outbox_failed": counts.get("failed", 0),
        }
        if self.jobs is not None:
            body["jobs_pending"] = await self.jobs.depth()
        provider = self.providers.health() if self.providers is not None else None
        if provider is not None:
            body["provider"] = provider  # ok | degraded (external memory provider)
        return body

    async def _after_turn(
        self, msg: InboundMessage, session: SessionRow, ctx: TurnContext, text: str, result: TurnResult
    ) -> None:
        """Background work, never on the reply path."""
        if self.providers is not None and not result.failed:
            self.providers.sync_turn(text, result.reply, ctx.for_providers(self.settings.home))
        if self.jobs is not None and not result.failed:
            window = context_window(self.settings.llm)
            threshold = self.settings.compression.threshold * window
            over = result.last_prompt_tokens >= threshold or result.context_trimmed
            if self.settings.compression.enabled and over:
                await self.jobs.enqueue("compress", session.id, {"prompt_tokens": result.last_prompt_tokens})
            elif result.review_due:
                await self.jobs.enqueue("review", session.id, {"user_turns": result.user_turns})
        for listener in self.turn_listeners:
            await listener(ctx, result)


class TurnBudget(Protocol):
    """Whether a person's turn may ask the model (``BudgetGate``): entered around the
    turn, it yields None to go on or a refusal."""

    def turn(self, user: UserRef, *, admin: bool) -> contextlib.AbstractAsyncContextManager[Any]: ...


class CommandHandler(Protocol):
    """Runs a slash command for the chat it was typed in (``CommandRegistry``)."""

    async def run(self, chats: ChatControl, msg: InboundMessage, name: str, args: str) -> str: ...
