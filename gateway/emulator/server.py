"""An Anthropic Messages API emulator on 127.0.0.1 (aiohttp).

It speaks ``POST /v1/messages`` — JSON or SSE (``stream: true``) — closely enough that
the real ``anthropic`` SDK runs against it unchanged: same JSON shapes, error envelope,
``retry-after`` headers and SSE event sequence. Every request is recorded (rejected ones
too), in arrival order, with its outcome.

Order of handling, as in the real service: authentication (``x-api-key`` or
``Authorization: Bearer``), ``anthropic-version`` header, JSON parse, request validation
(400), then random fault injection, then the next script item — or, when the script is
empty, ``emu.default`` (the scripted trial model unless a test sets another). Invalid
requests and injected faults do not consume script items; scripted faults do. Only an
answered (or mid-stream-failed) request touches the prompt cache: a 429 never reached
the model.

Who uses it: the whole test suite (scripted per test), ``mnemo demo``, and ``mnemo
run``'s local trial mode (the default responder only).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
import socket
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from mnemo.gateway.emulator.cache import PromptCache, Usage
from mnemo.gateway.emulator.script import (
    Fault,
    FaultInjector,
    RecordedRequest,
    Reply,
    Responder,
    ScriptItem,
    ScriptResult,
    error_body,
    monotonic_clock,
)
from mnemo.gateway.emulator.trial import trial_reply
from mnemo.gateway.emulator.validation import validate_request
from mnemo.gateway.logs import get_logger
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens

log = get_logger(__name__)

_MAX_BODY = 32 * 1024 * 1024  # the real API's request size limit
_TEXT_CHUNK = 24  # characters per text_delta, so clients really accumulate deltas
_MALFORMED = b'{"id": "msg_01broken", "type": "message", "content": [{"type": "te'
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_id(prefix: str) -> str:
    """``msg_01…`` / ``toolu_01…`` / ``req_01…``: the real API's id shapes."""
    return prefix + "01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))


class Emulator:
    """A scriptable fake of the Messages API; see the module docstring for the flow."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] | None = None,
        min_cacheable_tokens: int = 1024,
        responder: Responder | None = None,
        *,
        record_limit: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        # Tests keep every request; a long-running trial mode keeps only the newest ones.
        self.record_limit = record_limit
        self.clock: Callable[[], float] = clock or monotonic_clock
        self.default: Responder = responder or trial_reply
        self.requests: list[RecordedRequest] = []
        self.received = 0  # requests ever arrived (``requests`` may be trimmed by record_limit)
        # The lambda reads ``self.clock`` at call time, so a test may swap the clock later.
        self.cache = PromptCache(lambda: self.clock(), min_cacheable_tokens)
        self._script: deque[ScriptItem] = deque()
        self._faults = FaultInjector()
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._arrived = asyncio.Condition()

    # -- lifecycle -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("the emulator is not started")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> Emulator:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A short shutdown grace: a test's responder blocked on an event must not hold
        # ``stop()`` for aiohttp's default minute.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        # Binding the socket ourselves is how port 0 tells us the port it got.
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            await runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        # Fresh primitives per start: asyncio objects bind to the loop that first uses them.
        self._closing, self._arrived = asyncio.Event(), asyncio.Condition()
        self._runner = runner
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._closing.set()  # ends scripted delays early
        await runner.cleanup()

    async def __aenter__(self) -> Emulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- scripting -------------------------------------------------------------------

    def script(self, *items: ScriptItem) -> None:
        """Queue answers, consumed FIFO by the next valid requests."""
        for item in items:
            if not (isinstance(item, Reply | Fault) or callable(item)):
                raise TypeError(f"a script item is a Reply, a Fault or a callable, not {type(item).__name__}")
        self._script.extend(items)

    def pending(self) -> int:
        """Script items not consumed yet."""
        return len(self._script)

    def set_fault_rate(
        self,
        rate: float,
        statuses: Sequence[int] = (429, 529, 500),
        seed: int = 0,
        retry_after: float | None = 0,
    ) -> None:
        """Fail ``rate`` of valid requests at random (seeded: the same run fails the same way)."""
        self._faults = FaultInjector(rate, tuple(statuses), seed, retry_after)

    @property
    def min_cacheable_tokens(self) -> int:
        return self.cache.min_cacheable_tokens

    @min_cacheable_tokens.setter
    def min_cacheable_tokens(self, value: int) -> None:
        self.cache.min_cacheable_tokens = value

    def reset(self) -> None:
        """Forget the script, the recorded requests, the cache and random faults."""
        self._script.clear()
        self.requests.clear()
        self.received = 0
        self.cache.clear()
        self._faults = FaultInjector()

    # -- inspection ------------------------------------------------------------------

    @property
    def last_request(self) -> RecordedRequest:
        if not self.requests:
            raise LookupError("no request recorded yet")
        return self.requests[-1]

    def total_usage(self) -> Usage:
        """Usage summed over every answered request."""
        total = Usage()
        for rec in self.requests:
            if rec.usage is not None:
                total = total + Usage.from_api(rec.usage)
        return total

    async def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` requests have arrived (for concurrency tests)."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: self.received >= count), timeout)

    # -- request handling ------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            headers=CIMultiDict(request.headers),
            raw=raw,
            at=self.clock(),
        )
        try:
            rec.body = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            rec.body = None
        self.requests.append(rec)
        self.received += 1
        if self.record_limit is not None and len(self.requests) > self.record_limit:
            del self.requests[: len(self.requests) - self.record_limit]
        async with self._arrived:
            self._arrived.notify_all()

        if request.method != "POST" or request.path.rstrip("/") != "/v1/messages":
            return self._error(rec, 404, f"Not found: {request.method} {request.path}")
        if not _has_auth(request):
            return self._error(rec, 401, "x-api-key header is required")
        if not request.headers.get("anthropic-version"):
            return self._error(rec, 400, "anthropic-version: header is required")
        if rec.body is None:
            return self._error(rec, 400, "There was an error parsing the body of your request: invalid JSON")
        problem = validate_request(rec.body)
        if problem is not None:
            return self._error(rec, 400, problem)

        result = self._faults.draw() or await self._next_result(rec)
        if isinstance(result, Fault):
            rec.fault = result
            return await self._fail(request, rec, result)
        rec.reply = result
        return await self._answer(request, rec, result)

    async def _next_result(self, rec: RecordedRequest) -> ScriptResult:
        item: ScriptItem = self._script.popleft() if self._script else self.default
        if isinstance(item, Reply | Fault):
            return item
        # The per-request boundary: a broken responder becomes a visible 500, logged.
        try:
            result = item(rec)
            if inspect.isawaitable(result):
                result = await result
        except Exception as e:
            log.error("emulator responder failed", error=repr(e), exc_info=True)
            return Fault(500, body=f"emulator responder failed: {e!r}")
        if not isinstance(result, Reply | Fault):
            return Fault(500, body=f"emulator responder returned {type(result).__name__}, not Reply/Fault")
        return result

    def _error(
        self, rec: RecordedRequest, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        request_id = new_id("req_")
        body = error_body(status, message, request_id)
        rec.response_status, rec.error = status, body["error"]["message"]
        return web.json_response(body, status=status, headers={"request-id": request_id, **(headers or {})})

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless the emulator is stopping; False when cut short."""
        if seconds <= 0:
            return True
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def _fail(self, request: web.Request, rec: RecordedRequest, fault: Fault) -> web.StreamResponse:
        if not await self._sleep(fault.delay):
            raise web.HTTPServiceUnavailable()
        headers = {"request-id": new_id("req_")}
        if fault.retry_after is not None:
            headers["retry-after"] = _number(fault.retry_after)
        if fault.malformed:
            rec.response_status = fault.status
            raw = fault.body.encode() if isinstance(fault.body, str) else _MALFORMED
            if rec.stream:
                return await self._stream(request, rec, [b"event: message_start\ndata: " + raw + b"\n\n"])
            return web.Response(
                status=fault.status, body=raw, headers=headers, content_type="application/json"
            )
        if fault.mid_stream and rec.stream:
            usage = self.cache.account(rec.body)
            message = _message(rec.body, Reply(text="Partial answer before the failure"), usage)
            rec.usage = message["usage"]
            error = error_body(fault.status, fault.body if isinstance(fault.body, str) else None)
            frames = list(_frames(message))[:4]  # message_start, ping, block start, one delta
            return await self._stream(request, rec, [*frames, _frame("error", error)])
        if isinstance(fault.body, Mapping):
            body = dict(fault.body)
            rec.response_status, rec.error = fault.status, json.dumps(body)
            return web.json_response(body, status=fault.status, headers=headers)
        return self._error(rec, fault.status, fault.body or "", headers)  # "" -> the default message

    async def _answer(self, request: web.Request, rec: RecordedRequest, reply: Reply) -> web.StreamResponse:
        usage = self.cache.account(rec.body)
        message = _message(rec.body, reply, usage)
        rec.usage = message["usage"]
        if not await self._sleep(reply.delay):
            raise web.HTTPServiceUnavailable()
        if rec.stream:
            return await self._stream(request, rec, list(_frames(message)), pause=reply.chunk_delay)
        rec.response_status = 200
        return web.json_response(message, headers={"request-id": new_id("req_")})

    async def _stream(
        self, request: web.Request, rec: RecordedRequest, frames: list[bytes], *, pause: float = 0.0
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={"content-type": "text/event-stream; charset=utf-8", "request-id": new_id("req_")},
        )
        rec.response_status = 200
        try:
            await response.prepare(request)
            for frame in frames:
                if pause > 0 and frame.startswith(b"event: content_block_delta") and b'"text_delta"' in frame:
                    if not await self._sleep(pause):
                        break
                await response.write(frame)
            await response.write_eof()
        except ConnectionResetError:
            rec.response_status = None  # the client hung up mid-stream
        return response


def _has_auth(request: web.Request) -> bool:
    if request.headers.get("x-api-key"):
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip())


def _number(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _cut_to_tokens(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose estimate fits ``limit`` (the estimate is monotonic)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _message(body: dict[str, Any], reply: Reply, usage: Usage) -> dict[str, Any]:
    """The complete response message, with the request's stop sequences and max_tokens applied."""
    text, tool_uses = reply.text, list(reply.tool_uses)
    stop_reason = "tool_use" if tool_uses else "end_turn"
    stop_sequence = None
    found = [(text.find(s), s) for s in body.get("stop_sequences") or () if s in text]
    if found:
        index, stop_sequence = min(found)
        text, tool_uses, stop_reason = text[:index], [], "stop_sequence"
    output = estimate_tokens(text) + sum(estimate_json_tokens(dict(t.input)) for t in tool_uses)
    if output > body["max_tokens"]:
        text = _cut_to_tokens(text, body["max_tokens"])
        tool_uses, stop_reason, stop_sequence = [], "max_tokens", None
        output = estimate_tokens(text)
    if reply.stop_reason is not None:
        stop_reason = reply.stop_reason
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": t.id or new_id("toolu_"), "name": t.name, "input": dict(t.input)}
        for t in tool_uses
    ]
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": replace(usage, output_tokens=max(1, output)).as_api(),
    }


def _frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return _frame(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _frames(message: dict[str, Any]) -> Iterator[bytes]:
    """The SSE sequence of a complete message, every frame with its ``event:`` line."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    yield _frame("message_start", {"type": "message_start", "message": start})
    yield _frame("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield _block_start(index, {"type": "text", "text": ""})
            for i in range(0, len(block["text"]), _TEXT_CHUNK):
                delta = {"type": "text_delta", "text": block["text"][i : i + _TEXT_CHUNK]}
                yield _frame(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
        else:
            opening = {**block, "input": {}}
            yield _block_start(index, opening)
            encoded = json.dumps(block["input"], ensure_ascii=False)
            step = max(1, len(encoded) // 3 + 1)
            for i in range(0, len(encoded), step):
                delta = {"type": "input_json_delta", "partial_json": encoded[i : i + step]}
                yield _frame(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
        yield _frame("content_block_stop", {"type": "content_block_stop", "index": index})
    final = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield _frame("message_delta", {"type": "message_delta", "delta": final, "usage": message["usage"]})
    yield _frame("message_stop", {"type": "message_stop"})
