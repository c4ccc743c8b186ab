"""The stateless per-message agent.

An ``Agent`` is built for one turn from what is stored — the session row (with its
frozen system prompt) and the session's messages — and thrown away afterwards. Nothing
survives in process memory between turns, so a restart changes nothing about the next
reply. Counters (user turns, turns since the last memory write) are rebuilt from the
history each time.

The history is read once, when the turn starts (``Agent.load``); what the turn stores
is appended to it as it is written (``_persist``, ``memory.sessions.stored_row``), not
read back. The tool loop persists every assistant message and every tool result as soon as it
exists. Whatever fails, the stored history stays a valid Messages API conversation:
a tool_use is always answered (by its result or by an error result), and an LLM
failure closes the turn with a short apology stored as the assistant's reply.

Preflight: before each request the agent estimates its size. When it would not fit the
context window (minus ``max_tokens`` for the answer, with a 10% margin: the estimate is
~4 characters per token, the real tokenizer differs; the images and PDFs the request
re-sends count as the API counts them, width × height / 750 and ~1,500 per page —
``MediaStore.shown_tokens``), the oldest middle turns are left
out *of that request only* (``ContextCompressor.trim``: head, the last summary, a note,
as much tail as fits) and the turn reports ``context_trimmed``, so the gateway enqueues
a real compression after the reply. If the API still answers "prompt is too long", the
request is trimmed to half the budget and sent once more. Compressing synchronously
here is not possible: the turn holds the chat's session lock, which the rollover needs,
and a tool loop may be half-way (an open ``tool_use``) when a big tool result makes the
next request too long.

Streaming: a turn given a ``stream`` (``gateway.delivery.live.StreamSink``) has its
requests streamed; the text deltas and a status line per tool call go to the sink as
they happen. What is stored is unchanged: complete responses only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from mnemo.gateway.budgets.charge import Billing, Charge, RequestKind, billed_to
from mnemo.gateway.config import MemorySettings, SessionSettings
from mnemo.gateway.delivery.live import StreamSink, tool_status
from mnemo.gateway.errors import ContextTooLong, LLMError, ProviderAuthError, RateLimited
from mnemo.gateway.llm.client import LLMClient, LLMResponse, context_window
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MediaStore
from mnemo.gateway.turns.history import Counters, missing_tool_results, rebuild_counters
from mnemo.gateway.turns.model_input import ModelInput, model_input
from mnemo.gateway.turns.tools import ToolRegistry, ToolSet, TurnContext
from mnemo.memory.compressor import CompressionPolicy, ContextCompressor, Row, rows_tokens
from mnemo.memory.fence import strip_fences
from mnemo.memory.ports import SessionStorage
from mnemo.memory.scope import AgentContext
from mnemo.memory.sessions import MessageRow, NewMessage, SessionRow, ToolCall, stored_row
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens
from mnemo.memory.usage import Usage

log = get_logger(__name__)

PREFLIGHT_MARGIN = 0.90  # share of (window - max_tokens) a request may fill by our estimate

APOLOGY = "Sorry — I couldn't reach my language model just now. Please try again in a moment."
AUTH_APOLOGY = "Sorry — my language model refused my credentials. The operator needs to check the API key."
TOO_MANY_TOOLS = "I stopped after too many tool calls in one turn. Please rephrase or narrow the request."
# What an agent's requests are, for the budget gate (gateway/budgets/charge.py).
_REQUEST_KIND = {AgentContext.CRON: RequestKind.CRON, AgentContext.SUBAGENT: RequestKind.DELEGATE}
OUT_OF_TOKENS = "I stopped: this task used up its token budget before it was finished."


@dataclass(frozen=True, slots=True)
class TurnInput:
    text: str
    author_id: str | None = None
    author_name: str = ""
    platform_message_id: str | None = None
    # Recalled provider context / per-turn profile: goes into this request's user turn
    # inside a fence and is never stored.
    request_context: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnResult:
    reply: str
    session_id: str
    usage: Usage
    cost_usd: float
    requests: int
    last_prompt_tokens: int  # prompt size of the last request (compression trigger)
    memory_written: bool
    review_due: bool
    user_turns: int
    failed: bool = False
    reply_message_id: int | None = None
    llm_seconds: float = 0.0  # time spent waiting for the model (all requests, retries included)
    # The preflight had to leave old turns out of a request: compress whatever the threshold.
    context_trimmed: bool = False


@dataclass(frozen=True)
class AgentDeps:
    llm: LLMClient
    store: SessionStorage
    tools: ToolRegistry
    sessions: SessionSettings
    memory: MemorySettings
    media: MediaStore | None = None  # images/PDFs of stored turns (gateway/media.py)


class Agent:
    """One turn of one session. Build with ``Agent.load``; call ``run`` once."""

    def __init__(
        self, deps: AgentDeps, session: SessionRow, history: Sequence[MessageRow], ctx: TurnContext
    ) -> None:
        self.deps = deps
        self.session = session
        self.history = list(history)
        self.ctx = ctx
        self.label_authors = False
        self.stream: StreamSink | None = None  # shows the reply while it is generated
        self._llm_seconds = 0.0
        self._trimmed = False  # the preflight left old turns out of a request
        self._fallback_trim = False  # the API said "too long" despite the preflight
        # A delegated sub-agent (``delegate.py``): the tools it was granted instead of the
        # registry's, and a cap on the tokens of all its requests together.
        self.granted: ToolSet | None = None
        self.token_limit: int | None = None

    @classmethod
    async def load(cls, deps: AgentDeps, session: SessionRow, ctx: TurnContext) -> Agent:
        rows = await deps.store.load_messages(session.id)
        repairs = missing_tool_results(rows)
        if repairs:
            log.warning("history_repaired", session=session.id, unanswered_tool_calls=len(repairs))
            await deps.store.append_messages(session.id, repairs)
            rows = await deps.store.load_messages(session.id)
        return cls(deps, session, rows, ctx)

    @property
    def counters(self) -> Counters:
        return rebuild_counters(self.history, self.deps.memory.nudge_interval)

    def pending_user_row(self, platform_message_id: str | None) -> MessageRow | None:
        """The stored user row for this message if a previous run persisted it (recovery)."""
        if platform_message_id is None:
            return None
        for row in reversed(self.history):
            if row.role == "user" and row.platform_message_id == platform_message_id:
                return row
        return None

    def reply_after(self, user_row: MessageRow) -> MessageRow | None:
        """The final assistant reply stored after ``user_row``, if the turn completed."""
        final = None
        for row in self.history:
            if row.id <= user_row.id:
                continue
            if row.role == "user":
                break
            if row.role == "assistant" and not row.tool_calls:
                final = row
        return final

    async def _persist(self, messages: Sequence[NewMessage], usage: Usage | None = None) -> list[int]:
        """Store ``messages`` and append them to the history this turn loaded: the turn
        holds its session's lock, so nobody else appends meanwhile and the history is
        never read again until the next turn."""
        ids = await self.deps.store.append_messages(self.session.id, messages, usage=usage, payer=self._payer)
        now = datetime.now(UTC)
        self.history.extend(
            stored_row(self.session.id, i, m, now) for i, m in zip(ids, messages, strict=True)
        )
        return ids

    def _fitted_history(self, extra_context: str, schemas: Sequence[Any]) -> Sequence[Row]:
        """The preflight (see the module docstring): the history, trimmed for this
        request only when it would not fit the context window."""
        settings = self.deps.llm.settings
        window = context_window(settings)
        budget = int((window - settings.max_tokens) * (0.5 if self._fallback_trim else PREFLIGHT_MARGIN))
        overhead = (
            estimate_tokens(self.session.system_prompt)
            + (estimate_json_tokens(list(schemas)) if schemas else 0)
            + estimate_tokens(extra_context)
            + (self.deps.media.shown_tokens(self.history) if self.deps.media is not None else 0)
        )
        needed = overhead + rows_tokens(self.history)
        if needed <= budget:
            return self.history
        self._trimmed = True
        trimmed = ContextCompressor(CompressionPolicy(context_window=window)).trim(
            self.history, budget - overhead
        )
        log.warning(
            "request_trimmed_to_fit",
            session=self.session.id,
            tokens_needed=needed,
            budget=budget,
            messages=len(self.history),
            sent=len(trimmed),
        )
        return trimmed

    @property
    def _payer(self) -> str | None:
        """Whose budget this turn's requests count against: the speaker (nobody for a
        shared room's background work)."""
        return str(self.ctx.speaker) if self.ctx.speaker is not None else None

    @property
    def _charge(self) -> Charge:
        kind = _REQUEST_KIND.get(self.ctx.agent_context, RequestKind.TURN)
        return Charge(kind, self.ctx.speaker, self.ctx.is_admin)

    def _model_input(self, notes: str, schemas: Sequence[Any] = ()) -> ModelInput:
        return model_input(
            self.session.system_prompt,
            self._fitted_history(notes, schemas),
            notes=notes,
            tools=schemas,
            label_authors=self.label_authors,
            media=self.deps.media,
        )

    async def run(self, turn: TurnInput) -> TurnResult:
        before = self.counters
        stored = self.pending_user_row(turn.platform_message_id)
        if stored is None:
            row = NewMessage(
                role="user",
                content=turn.text,
                author_id=turn.author_id,
                author_name=turn.author_name,
                platform_message_id=turn.platform_message_id,
                meta=dict(turn.meta),
            )
            await self._persist([row])
        else:
            done = self.reply_after(stored)
            if done is not None:
                # The reply already exists: never ask the model again.
                return self._result(done.content, Usage(), 0.0, 0, 0, False, before, reply_id=done.id)

        usage = Usage()
        cost = 0.0
        requests = 0
        last_prompt = 0
        memory_written = False
        tools = self.granted or await self.deps.tools.for_turn(self.ctx, self.session)
        schemas = tools.schemas()
        for _ in range(self.deps.sessions.max_tool_iterations):
            if self.token_limit is not None and usage.prompt_tokens + usage.output_tokens >= self.token_limit:
                break
            try:
                request = self._model_input(turn.request_context, schemas)
                stream = self.stream
                response = await self.deps.llm.create(
                    system=request.system,
                    messages=request.messages,
                    charge=self._charge,
                    tools=request.tools,
                    on_text=stream.delta if stream is not None else None,
                    on_reset=stream.reset if stream is not None else None,
                )
            except ContextTooLong as e:
                if self._fallback_trim:
                    return await self._failed(e, usage, cost, requests, last_prompt, memory_written, before)
                # Our estimate said it fits, the API disagrees: trim harder, try once more.
                log.warning("context_too_long_retrying_trimmed", session=self.session.id, error=str(e))
                self._fallback_trim = True
                continue
            except LLMError as e:
                return await self._failed(e, usage, cost, requests, last_prompt, memory_written, before)
            requests += 1
            self._llm_seconds += response.latency_s
            usage = usage + response.usage
            cost += response.cost_usd
            last_prompt = response.usage.prompt_tokens + response.usage.output_tokens
            assistant = _assistant_row(response)
            ids = await self._persist([assistant], response.usage)  # the answer and its cost, one write
            if not response.tool_uses:
                return self._result(
                    assistant.content,
                    usage,
                    cost,
                    requests,
                    last_prompt,
                    memory_written,
                    before,
                    reply_id=ids[-1],
                )
            results: list[NewMessage] = []
            for call in response.tool_uses:
                if self.stream is not None:
                    self.stream.status(tool_status(call["name"]))
                ctx = replace(self.ctx, tool_call_id=call["id"])  # a write names its tool call
                with billed_to(Billing(self.session.id, self._payer, self.ctx.is_admin)):
                    result = await tools.call(call["name"], call.get("input") or {}, ctx)
                memory_written = memory_written or result.memory_write
                results.append(
                    NewMessage(
                        role="tool",
                        content=result.content,
                        tool_call_id=call["id"],
                        tool_name=call["name"],
                        is_error=result.is_error,
                        meta={"memory_write": True} if result.memory_write else {},
                    )
                )
            await self._persist(results)
        over = self.token_limit is not None and usage.prompt_tokens + usage.output_tokens >= self.token_limit
        text, reason = (OUT_OF_TOKENS, "token_limit") if over else (TOO_MANY_TOOLS, "tool_limit")
        ids = await self._persist([NewMessage(role="assistant", content=text, finish_reason=reason)])
        return self._result(
            text, usage, cost, requests, last_prompt, memory_written, before, reply_id=ids[-1]
        )

    async def _failed(
        self,
        e: LLMError,
        usage: Usage,
        cost: float,
        requests: int,
        last_prompt: int,
        memory_written: bool,
        before: Counters,
    ) -> TurnResult:
        """Close the turn with a short apology stored as the reply (history stays valid)."""
        text = AUTH_APOLOGY if isinstance(e, ProviderAuthError) else APOLOGY
        log.warning(
            "turn_failed", session=self.session.id, error=str(e), rate_limited=isinstance(e, RateLimited)
        )
        ids = await self._persist(
            [
                NewMessage(
                    role="assistant", content=text, finish_reason="error", meta={"error": type(e).__name__}
                )
            ]
        )
        return self._result(
            text, usage, cost, requests, last_prompt, memory_written, before, failed=True, reply_id=ids[-1]
        )

    def _result(
        self,
        reply: str,
        usage: Usage,
        cost: float,
        requests: int,
        last_prompt: int,
        memory_written: bool,
        before: Counters,
        *,
        failed: bool = False,
        reply_id: int | None = None,
    ) -> TurnResult:
        interval = self.deps.memory.nudge_interval
        since = 0 if memory_written else before.raw_since_memory + 1
        review_due = (
            interval > 0
            and not failed
            and self.ctx.agent_context.value == "primary"
            and since > 0
            and since % interval == 0
        )
        return TurnResult(
            reply=strip_fences(reply).strip() or reply,
            session_id=self.session.id,
            usage=usage,
            cost_usd=cost,
            requests=requests,
            last_prompt_tokens=last_prompt,
            memory_written=memory_written,
            review_due=review_due,
            user_turns=before.user_turns + 1,
            failed=failed,
            reply_message_id=reply_id,
            llm_seconds=self._llm_seconds,
            context_trimmed=self._trimmed,
        )


def _assistant_row(response: LLMResponse) -> NewMessage:
    calls = tuple(
        ToolCall(id=b["id"], name=b["name"], input=b.get("input") or {}) for b in response.tool_uses
    )
    return NewMessage(
        role="assistant",
        content=strip_fences(response.text),
        tool_calls=calls,
        finish_reason=response.stop_reason,
        token_count=response.usage.output_tokens,
        meta={"model": response.model},
    )


def tool_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
