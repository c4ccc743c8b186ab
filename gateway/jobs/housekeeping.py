"""The background jobs behind layer 3: compression (flush → summary → rollover), memory
review (the nudge) and session end. Registered on the ``JobQueue`` by kind; the reply
path never waits for any of them.

**Every model request here reads the conversation's cache.** It is the conversation's
own request (``_conversation``: tools, frozen system prompt, stored messages, built by
``turns/model_input.py`` exactly as a turn builds it) on the conversation's model, with
a tagged instruction appended after it (``with_instruction``; the instruction gets no
cache breakpoint of its own — it is never repeated). A cache belongs to one model, so
the auxiliary model is not used here; a cache read of the main model costs less than
the auxiliary model reading the same tokens afresh. Each request first passes
``memory.upkeep``'s hourly limit (``Upkeep.before_request``) and is recorded in
upkeep's account; the token caps are the budget gate's.

**The repeat guard** (``loop_guard.py``): a compress, review or session_end job that
would run again for a session with no new user message since ``max_runs_without_message``
runs of its kind ends without a request.

**compress** (enqueued when a reply's prompt crossed ``compression.threshold``):

1. *Plan* where to cut (head, middle, tail; ``memory/compressor.py``).
2. *Flush* with ``AgentContext.FLUSH`` (add-only, enforced by the memory tool): only
   the memory tool's calls run, through the same registry path as a turn's. Nothing of
   it is stored in the conversation. Recorded in the job's checkpoint, so a retry or a
   restart never flushes the same turns twice — and skipped when flushes and reviews
   already read every user turn of the middle (their ``covered`` spans).
3. *Summary* of the middle, named by where it starts and ends in the conversation
   above (an update of the earlier summary when there is one). A transient failure
   (network, overload, credentials) raises: the transcript stays as it is and the queue
   retries after 60 → 300 → 900 s. Any other failure uses the compressor's
   deterministic fallback summary.
4. *Rollover*, under ``gateway.session_lock(chat_key)`` so no turn of that chat runs
   meanwhile: a new session is created with a freshly rendered system prompt (memory
   written during the old session appears now) under the hidden source ``rollover``,
   filled with head + summary + tail — the tail taken from the rows as they are *now*,
   so messages answered while the summary was written move along, once and in order —
   and then one transaction ends the old session (``end_reason="compression"``) and
   makes the new one the chat's active session. A crash before that transaction leaves
   only an invisible, unfinished session, ended as ``abandoned`` by the next attempt.
   The outcome records tokens saved per later request against what the job spent.

**review**: the model reads the conversation and looks at the turns since the last
memory write (bounded); it may add entries (``AgentContext.REVIEW``); nothing reaches
the conversation or the user.

**session_end** (idle/daily reset, ``/reset``): a flush when the session had at least
``compression.flush_min_user_turns`` user turns, then the ``on_session_end`` hook
(memory providers), each recorded once.

**UploadSweep** (not a queue job: a timer): web uploads are removed a day after they
were made, whoever made them, and released from ``media.quota``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from mnemo.gateway.budgets.charge import Charge, RequestKind
from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import LLMSettings, Settings
from mnemo.gateway.errors import LLMError, ProviderAuthError, RateLimited, TransientNetworkError
from mnemo.gateway.events import ChatType, InboundMessage, session_key
from mnemo.gateway.jobs.loop_guard import LoopGuard
from mnemo.gateway.jobs.queue import DEFAULT_BACKOFF, Job, JobQueue, JobRun
from mnemo.gateway.llm.client import LLMResponse, context_window
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MediaStore
from mnemo.gateway.media_quota import UPLOAD_KEEP_S, KeepsUploads, MediaKind, MediaQuota
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.model_input import ModelInput, model_input, with_instruction
from mnemo.gateway.turns.sessions import SessionResolver
from mnemo.gateway.turns.tools import ToolRegistry, TurnContext, turn_context
from mnemo.memory.compressor import (
    CompressionPlan,
    CompressionPolicy,
    ContextCompressor,
    Row,
    is_summary,
    rows_tokens,
)
from mnemo.memory.errors import ProviderError
from mnemo.memory.flush import (
    BACKGROUND_TAG,
    MemoryPass,
    memory_pass_instruction,
    review_window,
    user_turns,
)
from mnemo.memory.scope import AgentContext
from mnemo.memory.sessions import MessageRow, SessionRow
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens
from mnemo.memory.usage import Usage

log = get_logger(__name__)

# Failures that say nothing about the request: keep the transcript, try again later.
TRANSIENT = (RateLimited, TransientNetworkError, ProviderAuthError)
COMPRESS_BACKOFF: tuple[float, ...] = (60.0, 300.0, 900.0)
PENDING_SOURCE = "rollover"  # a session being assembled: never the chat's active one
MEMORY_PASS_MAX_TOKENS = 1024


class SessionHooks(Protocol):
    """Session lifecycle events for the memory providers (``ProviderSessionHooks``)."""

    async def session_end(self, session: SessionRow, rows: Sequence[MessageRow]) -> None: ...

    async def session_switch(self, old: SessionRow, new: SessionRow) -> None: ...

    async def pre_compress(self, session: SessionRow, rows: Sequence[MessageRow]) -> bool:
        """False: a provider that promised durable capture failed, so the transcript
        must stay as it is and the compression is retried later."""
        ...


class AdminCheck(Protocol):
    def is_admin(self, platform: str, user_id: str) -> bool: ...


def compression_policy(settings: Settings) -> CompressionPolicy:
    c = settings.compression
    return CompressionPolicy(
        context_window=context_window(settings.llm),
        threshold=c.threshold,
        head_messages=c.head_messages,
        tail_min_messages=c.tail_min_messages,
        tail_token_ratio=c.tail_token_ratio,
    )


@dataclass(frozen=True, slots=True)
class CompressionOutcome:
    session_id: str
    new_session_id: str | None  # None: skipped (see reason)
    tokens_before: int  # estimated request size: system prompt + tools + messages
    tokens_after: int
    summarised_messages: int
    fallback: bool  # the deterministic summary was used
    compressor_s: float  # time in the compressor itself (planning, prompt, assembly)
    reason: str = ""
    # What the compression's own model requests (flush, summary) cost, to weigh against
    # ``tokens_saved``, which every later request of the chat no longer sends.
    spent: Usage = Usage()

    @property
    def tokens_saved(self) -> int:
        """Tokens each later request no longer sends (0 when skipped)."""
        return max(0, self.tokens_before - self.tokens_after) if self.new_session_id else 0


def session_message(session: SessionRow, rows: Sequence[MessageRow]) -> InboundMessage:
    """A stand-in for the chat's inbound message, rebuilt from the session row, for the
    gateway's per-message helpers (system prompt, admin check, speaker)."""
    parts = session.chat_key.split(":")
    chat_type = ChatType.GROUP if len(parts) > 1 and parts[1] == ChatType.GROUP.value else ChatType.DM
    user_id = session.user_id or session.chat_id
    per_user_key = session_key(session.platform, chat_type, session.chat_id, session.thread_id, user_id)
    name = next((r.author_name for r in reversed(rows) if r.role == "user" and r.author_name), "")
    return InboundMessage(
        platform=session.platform,
        chat_id=session.chat_id,
        user_id=user_id,
        message_id=f"housekeeping-{session.id}",
        text="",
        user_name=name or "",
        chat_type=chat_type,
        thread_id=session.thread_id,
        agent_context=AgentContext(session.agent_context),
        shared_room=chat_type is ChatType.GROUP and per_user_key != session.chat_key,
    )


def conversation_input(
    session: SessionRow,
    rows: Sequence[Row],
    tools: ToolRegistry,
    llm: LLMSettings,
    *,
    media: MediaStore | None,
    label_authors: bool,
    compressor: ContextCompressor | None = None,
) -> ModelInput:
    """The conversation's own request without its per-turn notes: the same tools, frozen
    system prompt and messages (``turns/model_input.py``), so a background request built
    on it reads the conversation's cached prefix. Trimmed like a turn's request only when
    it would not fit the context window."""
    schemas = tools.schemas(AgentContext(session.agent_context))
    budget = int((context_window(llm) - llm.max_tokens) * 0.9)
    overhead = estimate_tokens(session.system_prompt) + (
        estimate_json_tokens(list(schemas)) if schemas else 0
    )
    if overhead + rows_tokens(rows) > budget:
        trimmer = compressor or ContextCompressor(CompressionPolicy(context_window=context_window(llm)))
        rows = trimmer.trim(rows, budget - overhead)
    return model_input(session.system_prompt, rows, tools=schemas, label_authors=label_authors, media=media)


class Housekeeping:
    """Collaborators: ``sessions`` (locks, new sessions for a rollover), ``agent`` (the
    LLM, the session store and the tool registry), ``access`` (who is an admin), and the
    providers' session ``hooks``."""

    def __init__(
        self,
        settings: Settings,
        *,
        sessions: SessionResolver,
        agent: AgentDeps,
        access: AdminCheck,
        hooks: SessionHooks | None = None,
        upkeep: Upkeep | None = None,
        compress_backoff: Sequence[float] = COMPRESS_BACKOFF,
        backoff: Sequence[float] = DEFAULT_BACKOFF,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.store = agent.store
        self.llm = agent.llm
        self.tools = agent.tools
        self.files = sessions.files
        self.media = agent.media
        self.upkeep = upkeep
        self.access = access
        self.hooks = hooks
        self.compressor = ContextCompressor(compression_policy(settings))
        self._compress_backoff = tuple(compress_backoff)
        self._backoff = tuple(backoff)
        self._queue: JobQueue | None = None
        self.loop_guard: LoopGuard | None = None  # set by ``register``
        self.compressions: deque[CompressionOutcome] = deque(maxlen=1000)  # for /status, benchmarks
        # What the running compress job of a session has spent so far (one job per
        # session at a time; the entry lives while the job runs).
        self._spent: dict[str, Usage] = {}

    def register(self, queue: JobQueue) -> None:
        self._queue = queue
        self.loop_guard = LoopGuard(
            lambda sid, kind: queue.jobs(session_id=sid, kind=kind),
            self.settings.memory.upkeep.max_runs_without_message,
        )
        queue.register("compress", self.compress, backoff=self._compress_backoff)
        queue.register("review", self.review, backoff=self._backoff)
        queue.register("session_end", self.session_end, backoff=self._backoff)

    # --- compress ---------------------------------------------------------------------
    async def compress(self, job: Job, run: JobRun) -> None:
        store = self.store
        session = await store.get_session(job.session_id)
        if (
            session is None
            or session.is_ended
            or session.source != "chat"
            or session.agent_context != "primary"
        ):
            return  # reset or rolled over since it was queued: nothing to do
        rows = await store.load_messages(session.id)
        if not await self._admit(job, run, rows):
            return
        self._spent[session.id] = Usage()  # this compression's requests, for its outcome
        try:
            await self._compress(session, rows, run)
        finally:
            self._spent.pop(session.id, None)

    async def _compress(self, session: SessionRow, rows: Sequence[MessageRow], run: JobRun) -> None:
        store = self.store
        overhead = self._overhead(session)
        started = time.perf_counter()
        # The API measured the prompt over the threshold; estimates may disagree.
        plan = self.compressor.plan(rows, overhead_tokens=overhead, force=True)
        spent = time.perf_counter() - started
        if plan is None:
            self._record(CompressionOutcome(session.id, None, 0, 0, 0, False, spent, "nothing to summarise"))
            return
        # The flush is for the turns about to become a summary: none of them goes
        # unreviewed, and none is reviewed twice (a memory review may have read them all).
        if await self._uncovered(session, plan.turns):
            await self._flush_once(session, rows, MemoryPass.COMPRESSION, run)
        elif not run.checkpoint.get("flushed"):
            log.info("flush_skipped_already_reviewed", session=session.id)
            await run.save(flushed=True, flush_writes=0, flush_skipped=True)
        if self.hooks is not None and not await self.hooks.pre_compress(session, rows):
            raise ProviderError(
                "a memory provider could not checkpoint the transcript; compression retried later"
            )
        summary, fallback, spent_prompt = await self._summarise(session, plan)
        async with self.sessions.lock(session.chat_key):
            outcome = await self._rollover(session, plan, summary, fallback, spent + spent_prompt, overhead)
        self._record(outcome)
        if outcome.new_session_id is not None and self.hooks is not None:
            new = await store.get_session(outcome.new_session_id)
            if new is not None:
                await self.hooks.session_switch(session, new)

    def _overhead(self, session: SessionRow) -> int:
        schemas = self.tools.schemas(AgentContext(session.agent_context))
        return estimate_tokens(session.system_prompt) + (
            estimate_json_tokens(list(schemas)) if schemas else 0
        )

    async def _summarise(self, session: SessionRow, plan: CompressionPlan) -> tuple[str, bool, float]:
        started = time.perf_counter()
        ask = self.compressor.summary_instruction(plan, tag=BACKGROUND_TAG)
        request = with_instruction(self._conversation(session, plan.rows), ask.prompt)
        spent = time.perf_counter() - started
        try:
            response = await self._ask(
                session,
                RequestKind.SUMMARY,
                request,
                max_tokens=ask.max_tokens + ask.max_tokens // 4,
            )
        except TRANSIENT:
            raise  # the transcript stays; the queue retries after a cooldown
        except LLMError as e:
            log.warning("summary_failed_using_fallback", session=session.id, error=f"{type(e).__name__}: {e}")
        else:
            if response.text.strip():
                return response.text.strip(), False, spent
            log.warning("summary_empty_using_fallback", session=session.id)
        started = time.perf_counter()
        fallback = self.compressor.fallback_summary(plan)
        return fallback, True, spent + time.perf_counter() - started

    async def _rollover(
        self,
        session: SessionRow,
        plan: CompressionPlan,
        summary: str,
        fallback: bool,
        spent: float,
        overhead: int,
    ) -> CompressionOutcome:
        """Runs under the chat's session lock."""
        store = self.store
        current = await store.get_session(session.id)
        if current is None or current.is_ended:
            return CompressionOutcome(session.id, None, 0, 0, 0, fallback, spent, "session ended meanwhile")
        rows = await store.load_messages(session.id)
        started = time.perf_counter()
        new_rows = self.compressor.assemble(
            plan, summary, current=rows, meta={"source_session": session.id, "fallback": fallback}
        )
        before, after = overhead + rows_tokens(rows), overhead + rows_tokens(new_rows)
        spent += time.perf_counter() - started
        if after >= before:
            log.warning(
                "compression_ineffective", session=session.id, tokens_before=before, tokens_after=after
            )
            return CompressionOutcome(
                session.id, None, before, after, 0, fallback, spent, "would not shrink the history"
            )
        msg = session_message(session, rows)
        new = await self.sessions.start(
            msg, session.chat_key, source=PENDING_SOURCE, parent_session_id=session.id
        )
        await store.append_messages(new.id, new_rows)
        switched = await store.switch_session(session.id, new.id, pending_source=PENDING_SOURCE)
        if not switched:
            return CompressionOutcome(
                session.id, None, before, after, 0, fallback, spent, "session ended meanwhile"
            )
        # The new session's prompt is larger than the summarised rows suggest when the
        # system prompt grew (memory written meanwhile): count it as it is now.
        after = after - estimate_tokens(session.system_prompt) + estimate_tokens(new.system_prompt)
        log.info(
            "session_compressed",
            old=session.id,
            new=new.id,
            tokens_before=before,
            tokens_after=after,
            summarised=len(plan.middle),
            carried=len(new_rows) - 1,
            fallback=fallback,
        )
        return CompressionOutcome(session.id, new.id, before, after, len(plan.middle), fallback, spent)

    def _record(self, outcome: CompressionOutcome) -> None:
        outcome = replace(outcome, spent=self._spent.get(outcome.session_id, Usage()))
        self.compressions.append(outcome)
        if outcome.new_session_id is None:
            log.info("compression_skipped", session=outcome.session_id, reason=outcome.reason)
        else:
            log.info(
                "compression_economy",
                session=outcome.session_id,
                tokens_saved_per_request=outcome.tokens_saved,
                spent_tokens=outcome.spent.prompt_tokens + outcome.spent.output_tokens,
                spent_cache_read=outcome.spent.cache_read_tokens,
                spent_usd=round(outcome.spent.cost_usd, 6),
            )

    # --- review -----------------------------------------------------------------------
    async def review(self, job: Job, run: JobRun) -> None:
        if run.checkpoint.get("reviewed"):
            return
        session = await self.store.get_session(job.session_id)
        if session is None or session.agent_context != "primary":
            return
        rows = await self.store.load_messages(session.id)
        if not await self._admit(job, run, rows):
            return
        window = review_window(rows, max(4, 2 * self.settings.memory.nudge_interval))
        recent = user_turns(window)
        if recent == 0:
            return
        try:
            writes = await self._memory_pass(
                session, rows, MemoryPass.REVIEW, AgentContext.REVIEW, recent_user_turns=recent
            )
        except TRANSIENT:
            raise
        except LLMError as e:
            log.warning("review_failed", session=session.id, error=f"{type(e).__name__}: {e}")
            await run.save(reviewed=True, writes=0)  # read nothing: covers nothing
            return
        await run.save(reviewed=True, writes=writes, covered=_span(window))

    # --- session end ------------------------------------------------------------------
    async def session_end(self, job: Job, run: JobRun) -> None:
        session = await self.store.get_session(job.session_id)
        if session is None:
            return
        rows = await self.store.load_messages(session.id)
        if not await self._admit(job, run, rows):
            return
        if (
            session.agent_context == "primary"
            and user_turns(rows) >= self.settings.compression.flush_min_user_turns
        ):
            await self._flush_once(session, rows, MemoryPass.SESSION_END, run)
        if self.hooks is not None and not run.checkpoint.get("hooked"):
            await self.hooks.session_end(session, rows)
            await run.save(hooked=True)

    async def _admit(self, job: Job, run: JobRun, rows: Sequence[MessageRow]) -> bool:
        """The repeat guard (``loop_guard.py``): False stops a job that would run again
        without anything new said."""
        if self.loop_guard is None:
            return True
        last_user = max((r.id for r in rows if r.role == "user"), default=0)
        return await self.loop_guard.admit(job, run.save, last_user)

    # --- the memory pass (flush and review) -------------------------------------------
    async def _flush_once(
        self, session: SessionRow, rows: Sequence[MessageRow], kind: MemoryPass, run: JobRun
    ) -> None:
        """Flush unless this job already did, or an earlier job flushed these turns."""
        if run.checkpoint.get("flushed"):
            return
        last_user = max((r.id for r in rows if r.role == "user"), default=0)
        if last_user and await self._flushed_upto(session.id) >= last_user:
            await run.save(flushed=True, flushed_upto=last_user, flush_writes=0)
            return
        try:
            writes = await self._memory_pass(session, rows, kind, AgentContext.FLUSH)
        except TRANSIENT:
            raise
        except LLMError as e:
            # A request the model rejects will not improve with retries; the flush is
            # the bonus, the compression the job.
            log.warning("flush_failed", session=session.id, error=f"{type(e).__name__}: {e}")
            await run.save(flushed=True, flushed_upto=last_user, flush_writes=0)  # covers nothing
            return
        await run.save(flushed=True, flushed_upto=last_user, flush_writes=writes, covered=_span(rows))

    async def _uncovered(self, session: SessionRow, turns: Sequence[Row]) -> list[Row]:
        """The user turns among ``turns`` no flush or review has read: neither the row
        nor, for a row carried over by the last rollover, its original lies in a span a
        finished flush or review of this session or its parent recorded."""
        if self._queue is None:
            return [r for r in turns if r.role == "user"]
        spans: list[tuple[int, int]] = []
        for sid in (session.id, session.parent_session_id):
            if sid is None:
                continue
            for j in await self._queue.jobs(session_id=sid):
                span = j.checkpoint.get("covered")
                if (
                    isinstance(span, list)
                    and len(span) == 2
                    and (j.state.value == "done" or sid == session.id)
                ):
                    spans.append((int(span[0]), int(span[1])))

        def covered(row: Row) -> bool:
            ids = [row.id if isinstance(row, MessageRow) else None, row.meta.get("carried_from")]
            return any(isinstance(i, int) and a <= i <= b for i in ids for a, b in spans)

        return [r for r in turns if r.role == "user" and not is_summary(r) and not covered(r)]

    async def _flushed_upto(self, session_id: str) -> int:
        if self._queue is None:
            return 0
        marks = [j.checkpoint.get("flushed_upto") for j in await self._queue.jobs(session_id=session_id)]
        return max((m for m in marks if isinstance(m, int)), default=0)

    async def _memory_pass(
        self,
        session: SessionRow,
        rows: Sequence[MessageRow],
        kind: MemoryPass,
        context: AgentContext,
        *,
        recent_user_turns: int | None = None,
    ) -> int:
        """One request after the conversation's cached prefix (its own tool set, so the
        prefix matches); only its ``memory`` calls run, through the registry under
        ``context`` (add-only). ``recent_user_turns``: a review looks at the newest
        turns only. Returns the number of entries written."""
        msg = session_message(session, rows)
        ctx = turn_context(
            msg,
            session_id=session.id,
            chat_key=session.chat_key,
            is_admin=self.access.is_admin(msg.platform, msg.user_id),
            shared_room=self.sessions.shared_room(msg),
            agent_context=context,
            background=True,
        )
        if not self.tools.schemas(context, only=["memory"]):
            log.warning("memory_pass_without_memory_tool", session=session.id)
            return 0
        conversation = self._conversation(session, rows)
        if "memory" not in {t.get("name") for t in conversation.tools}:
            log.warning("memory_pass_without_memory_tool", session=session.id)
            return 0
        memory_block, user_block = await asyncio.to_thread(self._current_memory, ctx)
        ask = memory_pass_instruction(
            kind, memory_block=memory_block, user_block=user_block, recent_user_turns=recent_user_turns
        )
        response = await self._ask(
            session,
            RequestKind.REVIEW if context is AgentContext.REVIEW else RequestKind.FLUSH,
            with_instruction(conversation, ask),
            max_tokens=MEMORY_PASS_MAX_TOKENS,
        )
        writes = 0
        for call in response.tool_uses:
            if call.get("name") != "memory":
                continue  # only the memory tool ever runs here, whatever else was offered
            result = await self.tools.call("memory", call.get("input") or {}, ctx)
            writes += int(result.memory_write)
        log.info(
            "memory_pass", kind=str(kind), session=session.id, calls=len(response.tool_uses), writes=writes
        )
        return writes

    def _current_memory(self, ctx: TurnContext) -> tuple[str, str | None]:
        """The files as they are now — never the session's frozen snapshot."""
        blocks = self.files.blocks(ctx.speaker)
        return blocks.memory_text, blocks.user_text

    def _conversation(self, session: SessionRow, rows: Sequence[Row]) -> ModelInput:
        msg = session_message(session, ())
        return conversation_input(
            session,
            rows,
            self.tools,
            self.settings.llm,
            media=self.media,
            label_authors=self.sessions.shared_room(msg),
            compressor=self.compressor,
        )

    async def _ask(
        self,
        session: SessionRow,
        kind: RequestKind,
        request: ModelInput,
        *,
        max_tokens: int,
    ) -> LLMResponse:
        """One background request on the conversation's model, with cache breakpoints:
        a prompt cache belongs to one model, so only the conversation's model can read
        the prefix its turns wrote (a cache read of the main model costs a tenth of its
        input price — less than the auxiliary model reading the same tokens afresh).
        Usage is added to the session's counters and billed to the session's person (a
        shared room's background work to nobody), whose caps apply: at one the budget
        gate raises ``OverBudget`` and the job waits for the reset. The upkeep guard
        (``gateway/jobs/upkeep.py``) is asked first and told what it cost."""
        stand_in = session_message(session, ())
        payer = None if stand_in.shared_room else stand_in.speaker
        admin = payer is not None and self.access.is_admin(payer.platform, payer.user_id)
        if self.upkeep is not None:
            await self.upkeep.before_request(session.id, kind)
        response = await self.llm.create(
            system=request.system,
            messages=request.messages,
            charge=Charge(kind, payer, admin),
            tools=request.tools,
            model=self.settings.llm.model,
            max_tokens=max_tokens,
            cache_last=False,  # the instruction: never repeated, so never worth a cache write
        )
        await self.store.add_usage(session.id, response.usage, payer=None if payer is None else str(payer))
        if session.id in self._spent:  # a compression's own request
            self._spent[session.id] += response.usage
        if self.upkeep is not None:
            await self.upkeep.record(session.id, kind, payer, response.usage)
        return response


def _span(rows: Sequence[Row]) -> list[int]:
    """The first and last user message ids a memory pass read (a job checkpoint's
    ``covered``), or an empty span."""
    ids = [r.id for r in rows if isinstance(r, MessageRow) and r.role == "user" and not is_summary(r)]
    return [min(ids), max(ids)] if ids else [0, -1]


# --- web uploads never sent ---------------------------------------------------------------
SWEEP_INTERVAL_S = 3600.0


class UploadSweep:
    """Removes every upload older than ``keep_s`` (a day), whoever made it, and gives
    back what it held of ``media.quota``: an upload the page never sent in a message,
    or one whose message is long answered (its image or PDF was stored on its own,
    text was inlined), holds nobody's space for longer than a day. Runs once at
    ``start`` and then every ``interval_s`` in a task it owns; the removal is blocking
    file work and runs in a thread. ``sweep`` is the one pass, for tests and tools."""

    def __init__(
        self,
        keepers: Sequence[KeepsUploads],
        quota: MediaQuota | None,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        keep_s: float = UPLOAD_KEEP_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keepers = tuple(keepers)
        self.quota = quota
        self.interval_s = interval_s
        self.keep_s = keep_s
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    async def sweep(self) -> int:
        """One pass over every keeper; returns how many uploads were removed."""
        removed = 0
        for keeper in self.keepers:
            gone = await asyncio.to_thread(keeper.prune_uploads, self.clock() - self.keep_s)
            if gone and self.quota is not None:
                await self.quota.release(MediaKind.UPLOAD, gone)
            removed += len(gone)
        if removed:
            log.info("uploads_pruned", count=removed)
        return removed

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="upload-sweep")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as e:  # loop boundary: the next pass tries again
                log.warning("upload_sweep_failed", error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.interval_s)
