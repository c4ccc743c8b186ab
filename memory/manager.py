"""MemoryManager: the built-in provider plus at most one external one, isolated.

One manager serves the whole process; everything per turn comes in the
``ProviderContext`` argument, so concurrent chats never see each other's state.

Isolation is the point of this module. Every provider method runs in its own daemon
thread under a timeout: a provider that raises, hangs, blocks or returns the wrong type
is logged (structlog warning naming provider and method) and the turn goes on without
it. A hung call keeps its thread until the provider returns; ``max_inflight`` per
provider bounds how many can pile up, after which calls fail fast instead of spawning
more. Daemon threads never keep the process from exiting.

How the agent uses it, per turn::

    recall = await manager.prefetch(user_text, ctx)   # once, before the tool loop
    request_context = recall.text if recall else ""   # fenced block for the user turn
    ... tool loop: manager.has_tool(name) → await manager.handle_tool_call(name, args, ctx)
    manager.sync_turn(user_text, reply, ctx)          # returns at once (tracked task)
    manager.queue_prefetch(next_hint, ctx)            # optional warm-up, tracked

The result of ``prefetch`` is reused for every request of the turn — the manager does
not cache it, the caller keeps it. Writes (sync, mirroring, session-end and
pre-compress capture, delegation) reach providers only when
``ctx.agent_context is AgentContext.PRIMARY``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from mnemo.memory.durable import DurableWrites
from mnemo.memory.errors import MemoryRefused, ProviderError
from mnemo.memory.fence import fence, sanitize_recall, strip_fences
from mnemo.memory.identity import Identities
from mnemo.memory.journal import DocumentJournal
from mnemo.memory.provider import (
    Availability,
    MemoryProvider,
    Messages,
    ProviderContext,
    Recall,
    RecallIndicator,
    ToolSchema,
)
from mnemo.memory.provider_config import read_provider_config
from mnemo.memory.threats import guard_write
from mnemo.memory.trivial import is_trivial_prompt
from mnemo.memory.writes import (
    MirrorWrite,
    Operation,
    PreCompress,
    ProviderWrite,
    SessionEnd,
    SyncTurn,
    label,
)

if TYPE_CHECKING:
    from mnemo.memory.memory_tool import MemoryWrite

log = structlog.get_logger(__name__)

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INDICATOR_CHATS = 4096  # last indicator per chat, bounded


@dataclass(frozen=True, slots=True)
class ManagerLimits:
    """Timeouts (seconds) and bounds; from ``config.memory`` / ``config.worker``."""

    provider_timeout_s: float = 3.0  # hooks, mirroring, shutdown
    prefetch_timeout_s: float = 8.0  # cold remote providers need more than 8 s at times
    tool_timeout_s: float = 30.0
    background_timeout_s: float = 30.0  # sync_turn, queue_prefetch, session end, checkpoints
    init_timeout_s: float = 30.0
    drain_timeout_s: float = 10.0  # how long shutdown waits for pending syncs
    max_inflight: int = 8  # concurrent calls per provider before failing fast
    max_recall_chars: int = 6000


@dataclass(eq=False)
class _Slot:
    provider: MemoryProvider
    config: Mapping[str, Any] | None
    ready: bool = False
    prompt_block: str = ""
    inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.provider.name


_FAILED = object()

# Where durable providers' writes go: ``sink(provider_name, write)`` (the persisted job queue).
WriteSink = Callable[[str, ProviderWrite], Coroutine[Any, Any, None]]


def _error(message: str) -> str:
    return json.dumps({"ok": False, "error": message}, ensure_ascii=False)


def _durable_refusal(schema: ToolSchema, args: Mapping[str, Any]) -> str | None:
    """The threat scan over the arguments a tool stores durably; the refusal or None."""
    for key in schema.durable_args:
        values = args.get(key)
        for value in values if isinstance(values, list) else (values,):
            if isinstance(value, str):
                try:
                    guard_write(value, f"'{key}'")
                except MemoryRefused as e:
                    return e.reason
    return None


class MemoryManager:
    def __init__(self, home: Path, limits: ManagerLimits | None = None) -> None:
        self.home = Path(home)
        self.limits = limits or ManagerLimits()
        self._slots: list[_Slot] = []
        self._tools: dict[str, tuple[_Slot, ToolSchema]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._indicators: OrderedDict[str, RecallIndicator | None] = OrderedDict()
        self._started = False
        self._closed = False
        # Where durable providers' writes go (the persisted job queue); None: at once.
        self._write_sink: WriteSink | None = None
        # Linked accounts (``memory/identity.py``): calls for any of a person's accounts
        # use the person's provider scope. None: every account is its own person.
        self.identities: Identities | None = None
        # The memory journal's write port, handed to providers that store locally
        # (``MemoryProvider.use_journal``) before they initialize. None: not journaled.
        self.journal: DocumentJournal | None = None

    def _scoped(self, ctx: ProviderContext) -> ProviderContext:
        if self.identities is None or ctx.user is None:
            return ctx
        person = self.identities.canonical(ctx.user)
        return replace(ctx, person=person) if person != ctx.user else ctx

    # --- registration and lifecycle ----------------------------------------------
    def add_provider(self, provider: MemoryProvider, config: Mapping[str, Any] | None = None) -> bool:
        """Register before ``start``. ``config`` defaults to the provider's stored
        settings. Returns False (and logs why) when the provider is rejected."""
        if self._started:
            raise RuntimeError("memory providers must be added before MemoryManager.start()")
        for slot in self._slots:
            if slot.provider.builtin == provider.builtin:
                kind = "built-in" if provider.builtin else "external"
                log.warning(
                    f"memory provider {provider.name!r} rejected: {kind} provider "
                    f"{slot.name!r} is already registered (only one at a time)",
                    rejected=provider.name,
                    active=slot.name,
                )
                return False
        slot = _Slot(provider, config)
        # The built-in provider always comes first: its tools win name clashes, and
        # shutdown (reverse order) closes the external one before it.
        self._slots.insert(0 if provider.builtin else len(self._slots), slot)
        return True

    async def start(self) -> None:
        """Check availability, initialize, collect tools and prompt blocks. A provider
        failing any step is dropped with an error log — never registered-but-broken."""
        if self._started:
            return
        self._started = True
        for slot in list(self._slots):
            if not await self._start_slot(slot):
                self._slots.remove(slot)

    async def _start_slot(self, slot: _Slot) -> bool:
        t = self.limits.init_timeout_s
        if slot.config is None:
            schema = slot.provider.get_config_schema()
            slot.config = await self._run(
                slot, "read_config", read_provider_config, (self.home, slot.name, schema), t
            )
            if slot.config is _FAILED:
                log.error(
                    "memory provider settings unreadable; its tools are not offered", provider=slot.name
                )
                return False
        avail = await self._run(slot, "is_available", slot.provider.is_available, (self.home, slot.config), t)
        if not isinstance(avail, Availability) or not avail.ok:
            reason = avail.reason if isinstance(avail, Availability) else "availability check failed"
            log.error(
                "memory provider unavailable; its tools are not offered", provider=slot.name, reason=reason
            )
            return False
        if self.journal is not None:
            await self._run(slot, "use_journal", slot.provider.use_journal, (self.journal,), t)
        if (
            await self._run(slot, "initialize", slot.provider.initialize, (self.home, slot.config), t)
            is _FAILED
        ):
            log.error("memory provider failed to initialize; its tools are not offered", provider=slot.name)
            return False
        schemas = await self._run(slot, "get_tool_schemas", slot.provider.get_tool_schemas, (), t)
        block = await self._run(slot, "system_prompt_block", slot.provider.system_prompt_block, (), t)
        if schemas is _FAILED or block is _FAILED:
            return False
        if not isinstance(schemas, (list, tuple)):
            log.warning(
                "memory provider returned no tool list", provider=slot.name, got=type(schemas).__name__
            )
            schemas = ()
        for schema in schemas:
            self._register_tool(slot, schema)
        slot.prompt_block = block if isinstance(block, str) else ""
        slot.ready = True
        log.info(
            "memory provider ready",
            provider=slot.name,
            tools=[n for n, (s, _) in self._tools.items() if s is slot],
        )
        return True

    def _register_tool(self, slot: _Slot, schema: Any) -> None:
        if not isinstance(schema, ToolSchema) or not _TOOL_NAME.match(schema.name):
            log.warning(
                "memory provider offered an invalid tool schema",
                provider=slot.name,
                schema=repr(schema)[:200],
            )
            return
        if schema.name in self._tools:
            owner = self._tools[schema.name][0].name
            log.warning("memory provider tool name taken", provider=slot.name, tool=schema.name, owner=owner)
            return
        self._tools[schema.name] = (slot, schema)

    async def shutdown(self) -> None:
        """Drain pending background work (bounded), then shut providers down in
        reverse order. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pending = set(self._tasks)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.limits.drain_timeout_s)
            for task in late:
                task.cancel()
            if late:
                log.warning("memory provider work abandoned at shutdown", tasks=len(late))
                await asyncio.wait(late, timeout=1.0)
        for slot in reversed(self._slots):
            if slot.ready:
                await self._run(slot, "shutdown", slot.provider.shutdown, (), self.limits.provider_timeout_s)
                slot.ready = False

    async def __aenter__(self) -> MemoryManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # --- what the agent reads ------------------------------------------------------
    @property
    def providers(self) -> tuple[MemoryProvider, ...]:
        """Registered providers before ``start``; afterwards the ones in service."""
        return tuple(s.provider for s in self._slots if s.ready or not self._started)

    @property
    def external(self) -> MemoryProvider | None:
        return next((s.provider for s in self._slots if not s.provider.builtin), None)

    def system_prompt_block(self) -> str:
        """The providers' static blocks, for the session's frozen system prompt."""
        return "\n\n".join(s.prompt_block for s in self._slots if s.ready and s.prompt_block.strip())

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Anthropic tool definitions, in a stable order (built-in provider first)."""
        return [schema.to_api() for slot, schema in self._tools.values() if slot.ready]

    def has_tool(self, name: str) -> bool:
        entry = self._tools.get(name)
        return entry is not None and entry[0].ready

    def backup_paths(self) -> list[Path]:
        out: list[Path] = []
        for slot in self._slots:
            out.extend(Path(p) for p in slot.provider.backup_paths(self.home))
        return out

    def recall_indicator(self, chat_key: str) -> RecallIndicator | None:
        """What the last prefetch in this chat injected (None: nothing)."""
        return self._indicators.get(chat_key)

    def health(self) -> str | None:
        """``ok`` / ``degraded`` for the external provider (None: none configured)."""
        slot = next((s for s in self._slots if not s.provider.builtin), None)
        if slot is None:
            return None
        health = getattr(slot.provider, "health", None)
        return "ok" if slot.ready and getattr(health, "reachable", True) is not False else "degraded"

    # --- durable writes (memory/durable.py, memory/writes.py) -----------------------------
    def set_write_sink(self, sink: WriteSink | None) -> None:
        """Route durable providers' writes to ``sink(provider_name, write)``."""
        self._write_sink = sink

    def _durable(self, operation: Operation | None, ctx: ProviderContext) -> list[Coroutine[Any, Any, None]]:
        out: list[Coroutine[Any, Any, None]] = []
        if operation is None:
            return out
        for slot in self._slots:
            if not (slot.ready and isinstance(slot.provider, DurableWrites)):
                continue
            try:
                write = slot.provider.prepare_write(operation, ctx)
            except Exception as e:
                log.warning(
                    "memory provider failed",
                    provider=slot.name,
                    call=f"prepare_write:{label(operation)}",
                    error=f"{type(e).__name__}: {e}",
                )
                continue
            if write is None:
                continue
            if self._write_sink is not None:
                out.append(self._write_sink(slot.name, write))
            else:
                out.append(self._apply_logged(slot, write))
        return out

    async def _apply_logged(self, slot: _Slot, write: ProviderWrite) -> None:
        try:
            await self._apply(slot, write)
        except Exception as e:
            log.warning(
                "memory provider write failed",
                provider=slot.name,
                op=label(write.operation),
                error=f"{type(e).__name__}: {e}",
            )

    def _queue_durable(self, operation: Operation | None, ctx: ProviderContext) -> None:
        for coro in self._durable(operation, ctx):
            self._spawn(coro)

    async def apply_write(self, name: str, payload: Mapping[str, Any]) -> None:
        """Send one stored write (the job queue's handler; ``payload`` is
        ``ProviderWrite.to_payload()``, or an older mnemo's). Raises on failure, so the
        queue retries it; ``RetryLater.retry_after_s`` is the server's wish."""
        slot = next((s for s in self._slots if s.name == name and s.ready), None)
        if slot is None or not isinstance(slot.provider, DurableWrites):
            raise ProviderError(f"memory provider {name!r} is not running")
        await self._apply(slot, ProviderWrite.from_payload(payload))

    async def _apply(self, slot: _Slot, write: ProviderWrite) -> None:
        provider = slot.provider
        assert isinstance(provider, DurableWrites)
        async with asyncio.timeout(self.limits.background_timeout_s):
            await asyncio.to_thread(provider.apply_write, write)

    # --- per turn --------------------------------------------------------------------
    async def prefetch(self, query: str, ctx: ProviderContext) -> Recall | None:
        """Recall for this turn as one fenced block (``Recall.text``), or None when the
        prompt is trivial or nothing was recalled. Call once per turn."""
        ctx = self._scoped(ctx)
        if is_trivial_prompt(query):
            self._remember_indicator(ctx.chat_key, None)
            return None
        slots = [s for s in self._slots if s.ready]
        t = self.limits.prefetch_timeout_s
        results = await asyncio.gather(
            *(self._run(s, "prefetch", s.provider.prefetch, (query, ctx), t) for s in slots)
        )
        parts: list[str] = []
        labels: list[str] = []
        count = 0
        glyph = None
        for slot, result in zip(slots, results, strict=True):
            if result is _FAILED:
                continue
            if not isinstance(result, Recall) or not isinstance(result.text, str):
                log.warning(
                    "memory provider returned garbage from prefetch",
                    provider=slot.name,
                    got=type(result).__name__,
                )
                continue
            text = sanitize_recall(result.text)
            if not text:
                continue
            parts.append(text)
            labels.append(slot.provider.display_label)
            count += result.count if isinstance(result.count, int) and result.count > 0 else 0
            glyph = glyph or slot.provider.glyph
        if not parts:
            self._remember_indicator(ctx.chat_key, None)
            return None
        body = "\n\n".join(parts)
        if len(body) > self.limits.max_recall_chars:
            body = body[: self.limits.max_recall_chars].rstrip() + " …"
        recall = Recall(fence(body), count, " + ".join(labels), glyph or Recall("").glyph)
        self._remember_indicator(ctx.chat_key, recall.indicator())
        return recall

    def queue_prefetch(self, query: str, ctx: ProviderContext) -> None:
        ctx = self._scoped(ctx)
        if is_trivial_prompt(query):
            return
        self._background("queue_prefetch", lambda s: s.provider.queue_prefetch, (query, ctx))

    def sync_turn(self, user_text: str, assistant_text: str, ctx: ProviderContext) -> None:
        """Hand a finished turn to the providers without waiting (PRIMARY only)."""
        ctx = self._scoped(ctx)
        if not ctx.may_write:
            return
        args = (strip_fences(user_text), strip_fences(assistant_text), ctx)
        if not self._closed:
            self._queue_durable(SyncTurn(args[0], args[1]), ctx)
        self._background("sync_turn", lambda s: s.provider.sync_turn, args)

    async def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        """Route a tool call; always returns a JSON string (errors as ``{"ok": false}``)."""
        ctx = self._scoped(ctx)
        entry = self._tools.get(name)
        if entry is None or not entry[0].ready:
            return _error(f"no memory provider handles tool {name!r}")
        slot, schema = entry
        refused = _durable_refusal(schema, args)
        if refused is not None:
            return _error(refused)
        result = await self._run(
            slot, name, slot.provider.handle_tool_call, (name, dict(args), ctx), self.limits.tool_timeout_s
        )
        if result is _FAILED:
            return _error(f"{name} failed; the memory provider {slot.name!r} is unavailable right now")
        if not isinstance(result, str):
            log.warning(
                "memory provider returned garbage from a tool",
                provider=slot.name,
                tool=name,
                got=type(result).__name__,
            )
            return _error(f"{name} returned an invalid result")
        try:
            json.loads(result)
        except ValueError:
            log.warning("memory provider returned non-JSON from a tool", provider=slot.name, tool=name)
            return _error(f"{name} returned an invalid result")
        return result

    # --- hooks -------------------------------------------------------------------------
    async def on_turn_start(self, turn: int, message: str, ctx: ProviderContext) -> None:
        ctx = self._scoped(ctx)
        await self._each("on_turn_start", lambda s: s.provider.on_turn_start, (turn, message, ctx))

    async def on_session_switch(self, previous_session_id: str, ctx: ProviderContext) -> None:
        ctx = self._scoped(ctx)
        await self._each(
            "on_session_switch", lambda s: s.provider.on_session_switch, (previous_session_id, ctx)
        )

    async def on_session_end(self, messages: Messages, ctx: ProviderContext) -> None:
        ctx = self._scoped(ctx)
        if ctx.may_write:
            await asyncio.gather(*self._durable(SessionEnd.of(messages), ctx))
            t = self.limits.background_timeout_s
            await self._each(
                "on_session_end", lambda s: s.provider.on_session_end, (messages, ctx), timeout=t
            )

    async def on_memory_write(self, write: MemoryWrite, ctx: ProviderContext) -> None:
        """Mirror a successful built-in write to the external provider (awaited, so a
        replace that follows an add is mirrored in the same order)."""
        ctx = self._scoped(ctx)
        if ctx.may_write:
            await asyncio.gather(*self._durable(MirrorWrite.of(write, ctx), ctx))
            await self._each(
                "on_memory_write", lambda s: s.provider.on_memory_write, (write, ctx), external_only=True
            )

    def on_delegation(self, task: str, result: str, ctx: ProviderContext) -> None:
        ctx = self._scoped(ctx)
        if ctx.may_write:
            self._background("on_delegation", lambda s: s.provider.on_delegation, (task, result, ctx))

    async def pre_compress(self, messages: Messages, ctx: ProviderContext) -> bool:
        """Give providers the messages about to be compressed away. False means a
        fail-closed (checkpoint_version 2) provider failed: do not compress now."""
        ctx = self._scoped(ctx)
        if not ctx.may_write:
            return True
        ok = True
        await asyncio.gather(*self._durable(PreCompress.of(messages), ctx))
        t = self.limits.background_timeout_s
        for slot in [s for s in self._slots if s.ready]:
            result = await self._run(
                slot, "on_pre_compress", slot.provider.on_pre_compress, (messages, ctx), t
            )
            if result is _FAILED and slot.provider.checkpoint_version >= 2:
                log.error("fail-closed memory checkpoint failed; compression must wait", provider=slot.name)
                ok = False
        return ok

    # --- isolation -----------------------------------------------------------------------
    async def _each(
        self,
        what: str,
        method: Callable[[_Slot], Callable[..., Any]],
        args: tuple[Any, ...],
        *,
        timeout: float | None = None,
        external_only: bool = False,
    ) -> None:
        slots = [s for s in self._slots if s.ready and not (external_only and s.provider.builtin)]
        t = self.limits.provider_timeout_s if timeout is None else timeout
        await asyncio.gather(*(self._run(s, what, method(s), args, t) for s in slots))

    def _background(
        self, what: str, method: Callable[[_Slot], Callable[..., Any]], args: tuple[Any, ...]
    ) -> None:
        if self._closed:
            log.warning("memory manager is shut down; background call dropped", call=what)
            return
        coro = self._each(what, method, args, timeout=self.limits.background_timeout_s)
        self._spawn(coro)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def pending(self) -> None:
        """Wait until every background call started so far has finished (tests, drains)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _remember_indicator(self, chat_key: str, indicator: RecallIndicator | None) -> None:
        self._indicators[chat_key] = indicator
        self._indicators.move_to_end(chat_key)
        while len(self._indicators) > _INDICATOR_CHATS:
            self._indicators.popitem(last=False)

    async def _run(
        self, slot: _Slot, what: str, fn: Callable[..., Any], args: Sequence[Any], timeout: float
    ) -> Any:
        """``fn(*args)`` in a daemon thread; the value, or ``_FAILED`` (logged)."""
        with slot.lock:
            if slot.inflight >= self.limits.max_inflight:
                log.warning(
                    "memory provider saturated; call skipped",
                    provider=slot.name,
                    call=what,
                    inflight=slot.inflight,
                )
                return _FAILED
            slot.inflight += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if future.done():  # timed out or cancelled meanwhile
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def target() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as e:
                outcome = (False, e)
            finally:
                with slot.lock:
                    slot.inflight -= 1
            try:
                loop.call_soon_threadsafe(deliver, *outcome)
            except RuntimeError:
                # The loop closed while the provider hung; nobody waits for the answer.
                pass

        threading.Thread(target=target, name=f"mnemo-provider-{slot.name}-{what}", daemon=True).start()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel.
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            log.warning("memory provider timed out", provider=slot.name, call=what, timeout_s=timeout)
        except Exception as e:
            log.warning(
                "memory provider failed", provider=slot.name, call=what, error=f"{type(e).__name__}: {e}"
            )
        return _FAILED
