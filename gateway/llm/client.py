"""The LLM client: the only module that imports ``anthropic``.

It owns three things the rest of mnemo must not think about:

* **Retries.** The SDK's own retries are off (``max_retries=0``) because its
  ``retry-after`` handling has no cap (3600 means an hour). We retry 408/409/429/5xx/529,
  timeouts, connection errors and malformed bodies with jittered exponential backoff,
  honouring ``retry-after`` up to ``llm.retry_after_cap_s``; after the last attempt the
  SDK error is mapped onto ``gateway.errors`` (one place).
* **Prompt caching.** ``apply_cache_breakpoints`` puts the "system_and_3" markers on a
  *copy* of the request: the system prompt and the last three non-system messages, never
  more than four. Old markers are removed first, stored history is never mutated.
* **Usage and cost.** Every response carries a ``Usage`` (input, output, cache read,
  cache write) and ``cost_usd`` from the configurable price table.

A global semaphore bounds concurrent requests (``llm.max_concurrency``).

**Budgets.** Every ``create`` carries a ``Charge`` (who pays, what for) and passes the
client's ``RequestGate`` before anything is sent: the budget gate
(``gateway/budgets/gate.py``) raises ``OverBudget`` at a cap and no request is made.
This is the one place every model request goes through.

**Transport.** Requests go over the SDK's aiohttp transport
(``anthropic.DefaultAioHttpClient``, vendored in the SDK; aiohttp is a core dependency)
rather than its default httpx pool, which re-checks every idle connection on each
request — at 200 chats that was a fifth of the gateway's CPU. The SDK still builds and
maps every request and error (aiohttp errors reach it as httpx ones), so timeouts,
retries and the error mapping below are unchanged.

**Streaming.** ``create(on_text=…)`` asks for an SSE stream (``messages.stream``) and
reports every text delta to ``on_text`` as it arrives; the result is the same
``LLMResponse`` as without. Retries before the first delta are as above. A failure
after deltas were reported is retried the same way when it is retryable — ``on_reset``
is called first, so whoever shows the text starts over — and otherwise raised like any
other failure; a partial answer is never returned, so the stored history only ever
holds complete responses.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic

from mnemo.gateway.budgets.charge import Charge, RequestGate
from mnemo.gateway.config import LLMSettings, Price
from mnemo.gateway.errors import (
    BadLLMResponse,
    ContextTooLong,
    InvalidLLMRequest,
    LLMError,
    ProviderAuthError,
    RateLimited,
    TransientNetworkError,
)
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics
from mnemo.memory.usage import Usage

log = get_logger(__name__)

MAX_BREAKPOINTS = 4
DEFAULT_CONTEXT_WINDOW = 200_000
# Context windows by model-name prefix (longest prefix wins). Override with
# ``llm.context_window`` / ``MNEMO_CONTEXT_WINDOW`` for other models and for tests.
CONTEXT_WINDOWS: dict[str, int] = {
    "claude-opus-4-7": 1_000_000,
    "claude-sonnet-4-6": 1_000_000,
    "claude-opus-4-6": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-3": 200_000,
}


def _by_prefix(table: Mapping[str, Any], model: str) -> Any | None:
    best = None
    for key in table:
        if model.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return table[best] if best is not None else None


def context_window(settings: LLMSettings, model: str | None = None) -> int:
    if settings.context_window is not None:
        return settings.context_window
    return _by_prefix(CONTEXT_WINDOWS, model or settings.model) or DEFAULT_CONTEXT_WINDOW


def cost_usd(prices: Mapping[str, Price], model: str, usage: Usage) -> float:
    price: Price | None = _by_prefix(prices, model)
    if price is None:
        return 0.0
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_write_tokens * price.cache_write
        + usage.cache_read_tokens * price.cache_read
    ) / 1_000_000


@dataclass(frozen=True, slots=True)
class LLMResponse:
    content: tuple[dict[str, Any], ...]  # "text" and "tool_use" blocks as plain dicts
    stop_reason: str | None
    usage: Usage  # tokens and their cost
    model: str
    attempts: int = 1
    latency_s: float = 0.0

    @property
    def cost_usd(self) -> float:
        return self.usage.cost_usd

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> tuple[dict[str, Any], ...]:
        return tuple(b for b in self.content if b.get("type") == "tool_use")


def _marker(ttl: str | None) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": ttl} if ttl == "1h" else {"type": "ephemeral"}


def _strip_markers(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy([dict(m) for m in messages])
    for m in out:
        content = m.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    block.pop("cache_control", None)
    return out


def apply_cache_breakpoints(
    system: str, messages: Sequence[Mapping[str, Any]], *, system_ttl: str = "5m"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ "system_and_3": a marker on the system prompt and on the last 3 messages.

    Returns new ``(system_blocks, messages)``; the inputs are not modified. A longer TTL
    may only come first, which the system prompt always is.
    """
    system_blocks = [{"type": "text", "text": system, "cache_control": _marker(system_ttl)}] if system else []
    out = _strip_markers(messages)
    budget = MAX_BREAKPOINTS - len(system_blocks)
    for m in reversed(out):
        if budget == 0:
            break
        content = m.get("content")
        if isinstance(content, str):
            if not content:
                continue
            m["content"] = [{"type": "text", "text": content, "cache_control": _marker(None)}]
        elif isinstance(content, list) and content:
            content[-1]["cache_control"] = _marker(None)
        else:
            continue
        budget -= 1
    return system_blocks, out


def _retry_after(err: anthropic.APIStatusError) -> float | None:
    headers = err.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            continue
    return None


def _is_retryable(err: Exception) -> bool:
    # A malformed 200 body surfaces from the SDK as a bare JSONDecodeError.
    if isinstance(
        err, (anthropic.APIConnectionError, anthropic.APIResponseValidationError, json.JSONDecodeError)
    ):
        return True
    if isinstance(err, anthropic.APIStatusError):
        if err.status_code in (408, 409, 429) or err.status_code >= 500:
            return True
        # An error event inside a 200 stream arrives as status 200; classify by body.
        body = err.body if isinstance(err.body, dict) else {}
        etype = (body.get("error") or {}).get("type") if isinstance(body.get("error"), dict) else None
        return etype in ("overloaded_error", "api_error", "rate_limit_error")
    return False


def _map_error(err: Exception) -> LLMError:
    """The one place anthropic's exceptions become mnemo's."""
    if isinstance(err, anthropic.APIStatusError) and err.status_code == 200:
        # An ``event: error`` inside a streamed answer: the body says what it was.
        body = err.body if isinstance(err.body, dict) else {}
        raw = body.get("error")
        error = raw if isinstance(raw, dict) else {}
        etype, message = error.get("type"), str(error.get("message") or "")
        if etype in ("rate_limit_error", "overloaded_error"):
            return RateLimited(f"LLM rate limited or overloaded (mid-stream {etype})", None)
        if etype in ("authentication_error", "permission_error"):
            return ProviderAuthError(f"LLM endpoint refused the credentials (mid-stream {etype})")
        if etype == "invalid_request_error":
            if "prompt is too long" in message or "too many tokens" in message:
                return ContextTooLong(message)
            return InvalidLLMRequest(message or "LLM endpoint rejected the request mid-stream")
    if isinstance(err, anthropic.RateLimitError) or (
        isinstance(err, anthropic.APIStatusError) and err.status_code == 529
    ):
        return RateLimited(f"LLM rate limited or overloaded ({err.status_code})", _retry_after(err))
    if isinstance(err, (anthropic.AuthenticationError, anthropic.PermissionDeniedError)):
        return ProviderAuthError(f"LLM endpoint refused the credentials ({err.status_code})")
    if isinstance(err, anthropic.BadRequestError):
        message = str(err.message)
        if "prompt is too long" in message or "too many tokens" in message:
            return ContextTooLong(message)
        return InvalidLLMRequest(message)
    if (
        isinstance(err, anthropic.APIStatusError)
        and 400 <= err.status_code < 500
        and err.status_code not in (408, 409)
    ):
        # 404 (e.g. an unknown model name), 413, 422 …: retrying will not help.
        return InvalidLLMRequest(f"LLM endpoint rejected the request ({err.status_code}): {err.message}")
    if isinstance(err, (anthropic.APIConnectionError, anthropic.APIStatusError)):
        return TransientNetworkError(f"LLM unavailable: {type(err).__name__}")
    if isinstance(err, (anthropic.APIResponseValidationError, json.JSONDecodeError)):
        return BadLLMResponse("LLM returned a malformed response")
    return BadLLMResponse(f"unexpected LLM failure: {type(err).__name__}")


class LLMClient:
    """Async Anthropic Messages client with mnemo's retry, caching and accounting rules."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        gate: RequestGate,
        base_url: str | None = None,
        api_key: str | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self._gate = gate
        self._metrics = metrics
        key = api_key or (settings.api_key.get_secret_value() if settings.api_key else None)
        self._client = anthropic.AsyncAnthropic(
            api_key=key or "not-set",
            base_url=base_url or settings.base_url,
            max_retries=0,
            timeout=settings.timeout_s,
            http_client=anthropic.DefaultAioHttpClient(),
        )
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(settings.max_concurrency)

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _backoff(self, attempt: int, err: Exception) -> float:
        hinted = _retry_after(err) if isinstance(err, anthropic.APIStatusError) else None
        if hinted is not None:
            return min(hinted, self.settings.retry_after_cap_s)
        base = min(0.5 * (2.0**attempt), 8.0)
        return base * self._rng.uniform(0.75, 1.25)

    async def create(
        self,
        *,
        system: str,
        messages: Sequence[Mapping[str, Any]],
        charge: Charge,
        tools: Sequence[Mapping[str, Any]] = (),
        model: str | None = None,
        max_tokens: int | None = None,
        cache: bool = True,
        cache_last: bool = True,
        on_text: Callable[[str], None] | None = None,
        on_reset: Callable[[], None] | None = None,
    ) -> LLMResponse:
        """One Messages API call (with retries), if the gate admits ``charge``. Raises a
        ``gateway.errors.LLMError``, or ``OverBudget`` (nothing sent).

        With ``on_text`` the response is streamed and each text delta reported to it
        (see the module docstring); ``on_reset`` is called before a retry that follows
        reported deltas. ``cache_last=False``: no breakpoint on the last message (a
        background pass's instruction, which no later request repeats, so caching it
        would only cost the write)."""
        await self._gate.admit(charge)
        model = model or self.settings.model
        if cache:
            marked = messages if cache_last or not messages else messages[:-1]
            system_blocks, msgs = apply_cache_breakpoints(system, marked, system_ttl=self.settings.cache_ttl)
            if not cache_last and messages:
                msgs += _strip_markers(messages[-1:])
            system_param: Any = system_blocks
        else:
            msgs = _strip_markers(messages)
            system_param = system
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens or self.settings.max_tokens,
            "messages": msgs,
        }
        if system:
            kwargs["system"] = system_param
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        attempts = self.settings.max_retries + 1
        started = time.monotonic()
        async with self._semaphore:
            for attempt in range(attempts):
                streamed = _Deltas(on_text)
                try:
                    if on_text is None:
                        response = await self._client.messages.create(**kwargs)
                    else:
                        response = await self._stream(kwargs, streamed)
                except Exception as err:
                    if streamed.count and on_reset is not None:
                        on_reset()  # the text shown so far is not the answer
                    if streamed.count:
                        log.info("llm_stream_broken", model=model, attempt=attempt + 1, deltas=streamed.count)
                    if not _is_retryable(err) or attempt == attempts - 1:
                        mapped = _map_error(err)
                        if self._metrics is not None:
                            self._metrics.errors.labels(f"llm_{type(mapped).__name__}").inc()
                        log.warning("llm_call_failed", model=model, attempts=attempt + 1, error=str(mapped))
                        raise mapped from err
                    delay = self._backoff(attempt, err)
                    log.info(
                        "llm_retry",
                        model=model,
                        attempt=attempt + 1,
                        delay_s=round(delay, 3),
                        error=type(err).__name__,
                    )
                    await self._sleep(delay)
                    continue
                result = self._convert(response, model, attempt + 1, time.monotonic() - started)
                if self._metrics is not None:
                    u = result.usage
                    self._metrics.observe_llm(
                        result.latency_s,
                        u.input_tokens,
                        u.output_tokens,
                        u.cache_read_tokens,
                        u.cache_write_tokens,
                    )
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _stream(self, kwargs: Mapping[str, Any], deltas: _Deltas) -> Any:
        """One streamed request: text deltas to ``deltas``, the final message returned."""
        async with self._client.messages.stream(**kwargs) as stream:
            async for event in stream:
                if event.type == "text" and event.text:
                    deltas.report(event.text)
            return await stream.get_final_message()

    def _convert(self, response: Any, model: str, attempts: int, latency: float) -> LLMResponse:
        blocks: list[dict[str, Any]] = []
        for block in response.content or ():
            if block.type == "text":
                blocks.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                blocks.append(
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input or {})}
                )
        u = response.usage
        tokens = Usage(
            input_tokens=u.input_tokens or 0,
            output_tokens=u.output_tokens or 0,
            cache_read_tokens=getattr(u, "cache_read_input_tokens", None) or 0,
            cache_write_tokens=getattr(u, "cache_creation_input_tokens", None) or 0,
        )
        usage = dataclasses.replace(tokens, cost_usd=cost_usd(self.settings.prices, model, tokens))
        return LLMResponse(
            content=tuple(blocks),
            stop_reason=response.stop_reason,
            usage=usage,
            model=response.model or model,
            attempts=attempts,
            latency_s=latency,
        )


class _Deltas:
    """The text deltas of one streamed attempt: passed on, and counted."""

    def __init__(self, on_text: Callable[[str], None] | None) -> None:
        self._on_text = on_text
        self.count = 0

    def report(self, text: str) -> None:
        self.count += 1
        if self._on_text is not None:
            try:
                self._on_text(text)
            except Exception:  # a display problem must never fail the request
                log.exception("llm_stream_callback_failed")


@dataclass
class UsageTotals:
    """Running totals for reports (demo, bench)."""

    usage: Usage = field(default_factory=Usage)
    requests: int = 0

    def add(self, response: LLMResponse) -> None:
        self.usage = self.usage + response.usage
        self.requests += 1

    @property
    def cost_usd(self) -> float:
        return self.usage.cost_usd

    @property
    def cache_hit_ratio(self) -> float:
        total = self.usage.prompt_tokens
        return self.usage.cache_read_tokens / total if total else 0.0
