"""What a test (or the trial model) tells the emulator to answer, and what it recorded.

A script item is one of:

- ``Reply`` — a model answer: text and/or ``ToolUse`` blocks, optionally slow;
- ``Fault`` — an HTTP error with the real error JSON, a malformed body, or an
  ``event: error`` in the middle of an SSE stream;
- a responder: a callable taking the ``RecordedRequest`` and returning a ``Reply`` or a
  ``Fault`` (or an awaitable of one, so a test can hold a response open on an event).

Random fault injection (``FaultInjector``) draws from its own seeded RNG once per valid
request, so the same request sequence always fails at the same places.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

STOP_REASONS = frozenset({"end_turn", "tool_use", "max_tokens", "stop_sequence", "pause_turn", "refusal"})

# The error ``type`` the real API puts in its JSON for each status.
ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_DEFAULT_MESSAGES: Mapping[str, str] = {
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit (emulated).",
    "overloaded_error": "Overloaded (emulated).",
    "api_error": "Internal server error (emulated).",
    "timeout_error": "Request timed out (emulated).",
}


def error_type_for(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The real API's error envelope: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = error_type_for(status)
    body: dict[str, Any] = {
        "type": "error",
        "error": {
            "type": kind,
            "message": message or _DEFAULT_MESSAGES.get(kind, f"Emulated error {status}."),
        },
    }
    if request_id is not None:
        body["request_id"] = request_id
    return body


@dataclass(frozen=True, slots=True)
class ToolUse:
    name: str
    input: Mapping[str, Any]
    id: str | None = None  # generated as ``toolu_…`` when None


@dataclass(frozen=True, slots=True)
class Reply:
    text: str = ""
    tool_uses: Sequence[ToolUse] = ()
    # None: ``tool_use`` when tool_uses are present, else ``end_turn`` (or ``max_tokens``
    # / ``stop_sequence`` when the request's limits cut the reply).
    stop_reason: str | None = None
    delay: float = 0.0  # seconds before the response starts (real time: for client timeouts)
    # Streaming only: seconds between two text deltas (real time: a reply being written).
    chunk_delay: float = 0.0

    def __post_init__(self) -> None:
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"unknown stop_reason {self.stop_reason!r}; expected one of {sorted(STOP_REASONS)}"
            )
        object.__setattr__(self, "tool_uses", tuple(self.tool_uses))


@dataclass(frozen=True, slots=True)
class Fault:
    status: int
    retry_after: float | None = None  # seconds, sent as the ``retry-after`` header
    # str: the error message (the raw body when malformed); mapping: the whole JSON body.
    body: str | Mapping[str, Any] | None = None
    delay: float = 0.0
    malformed: bool = False  # answer ``status`` (use 200) with a body that is not valid JSON
    # On a streaming request: start a normal stream, then send ``event: error`` (typed after
    # ``status``) and close. On a non-streaming request this is an ordinary HTTP error.
    mid_stream: bool = False


@dataclass(slots=True)
class RecordedRequest:
    """One HTTP request as the emulator saw it; the server fills in the outcome fields."""

    method: str
    path: str
    headers: Mapping[str, str]
    raw: bytes
    at: float  # the emulator clock at arrival
    body: Any = None  # parsed JSON, None when the body was not JSON
    response_status: int | None = None  # None: the client went away before the answer
    usage: dict[str, Any] | None = None  # the usage object sent back, for answered messages
    reply: Reply | None = None
    fault: Fault | None = None
    error: str | None = None  # the error message sent back, for rejected requests

    # Read-only views of the Messages API body, used by responders and the trial model.

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def model(self) -> str:
        return str(self.body.get("model", "")) if isinstance(self.body, dict) else ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages") if isinstance(self.body, dict) else None
        return msgs if isinstance(msgs, list) else []

    @property
    def tool_names(self) -> tuple[str, ...]:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        if not isinstance(tools, list):
            return ()
        return tuple(t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str))

    def tool_schema(self, name: str) -> dict[str, Any] | None:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        for tool in tools if isinstance(tools, list) else ():
            if isinstance(tool, dict) and tool.get("name") == name:
                schema = tool.get("input_schema")
                return schema if isinstance(schema, dict) else None
        return None

    @property
    def system_text(self) -> str:
        system = self.body.get("system") if isinstance(self.body, dict) else None
        if isinstance(system, str):
            return system
        if isinstance(system, list):
            return "\n".join(b.get("text", "") for b in system if isinstance(b, dict))
        return ""


ScriptResult: TypeAlias = Reply | Fault
Responder: TypeAlias = Callable[[RecordedRequest], "ScriptResult | Awaitable[ScriptResult]"]
ScriptItem: TypeAlias = Reply | Fault | Responder


class ManualClock:
    """A clock tests advance by hand (prompt-cache TTLs without sleeping)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock only moves forward")
        self.now += seconds


def monotonic_clock() -> float:
    return time.monotonic()


@dataclass(slots=True)
class FaultInjector:
    """Fails a share of requests at random, reproducibly (one draw per valid request)."""

    rate: float = 0.0
    statuses: tuple[int, ...] = (429, 529, 500)
    seed: int = 0
    retry_after: float | None = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must be within [0, 1], got {self.rate}")
        if self.rate > 0 and not self.statuses:
            raise ValueError("a fault rate needs at least one status")
        self._rng = random.Random(self.seed)

    def draw(self) -> Fault | None:
        if self.rate <= 0.0:
            return None
        # Both draws happen on every call so the sequence depends only on the request count.
        hit = self._rng.random() < self.rate
        status = self._rng.choice(self.statuses)
        return Fault(status, retry_after=self.retry_after) if hit else None
