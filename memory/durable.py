"""Durable provider writes and provider health, shared by every external provider.

External providers answer over the network, so a write must survive the provider being
down, slow or rate limited, and a restart of mnemo. A provider that mixes in
``DurableWrites`` splits each write in two:

* ``prepare_write(op, data, ctx)`` — pure, no I/O: turns a finished turn
  (``op="turn"``), a mirrored built-in memory write (``"memory"``) or a session's
  messages (``"session_end"``, ``"pre_compress"``) into a JSON payload that already
  carries the speaker's scope (``memory.provider_scope``). None: nothing to write.
* ``apply_write(payload)`` — sends it. Idempotent per ``payload["key"]`` (derived from
  the turn: session, op and content), raises on failure; ``RetryLater`` carries the
  server's ``Retry-After``.

Erasure (``mnemo users erase``, ``/forget me``) queues one more op, ``"forget_user"``:
its payload (``forget_user``) names only the user's scope ``user_id``, built here and
not by ``prepare_write`` (the person is gone from mnemo by the time it is sent), and
``apply_write`` deletes everything the provider holds for that user with the API's own
delete call. Like any write it waits in the job queue while the provider is down.

``MemoryManager`` hands prepared payloads to a write sink (the gateway's persisted job
queue, kind ``provider_write``) and the queue calls ``MemoryManager.apply_write`` with
backoff and bounded attempts. Without a sink (tools, tests) the manager applies the
write in the background at once.

Health: ``ProviderHealth`` remembers whether the last call reached the provider and
the last error, and keeps a copy in ``providers/<name>/status.json`` so that
``mnemo providers status`` (another process) can show it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mnemo.memory.atomic import ensure_folder
from mnemo.memory.provider import ProviderContext
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, safe_id

STATUS_FILE = "status.json"
FORGET_USER = "forget_user"
WRITE_OPS = ("turn", "memory", "session_end", "pre_compress", FORGET_USER)


class RetryLater(Exception):
    """The provider asked to be called again later (429/503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def write_key(op: str, ctx: ProviderContext, *parts: str) -> str:
    """The idempotency key of one write: the same turn gives the same key."""
    h = hashlib.sha256()
    for part in (op, ctx.session_id, str(ctx.user or ""), *parts):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return f"{op}-{h.hexdigest()[:32]}"


def forget_user(user_id: str) -> dict[str, Any]:
    """The durable write that erases ``user_id`` (``PLATFORM:ID``) at an external provider:
    ``{"op": "forget_user", "key": …, "scope": {"user_id": …, …}}``, the scope's
    ``user_id`` in the form ``scope_for`` gives every provider call."""
    scope = ProviderScope(safe_id(user_id), "forget", DEFAULT_AGENT_ID)
    digest = hashlib.sha256(scope.user_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return {"op": FORGET_USER, "key": f"{FORGET_USER}-{digest}", "scope": scope.as_dict()}


def forget_scope(payload: Mapping[str, Any]) -> ProviderScope:
    """The scope a ``forget_user`` payload names (only its ``user_id`` matters)."""
    scope = payload.get("scope")
    user_id = scope.get("user_id") if isinstance(scope, Mapping) else payload.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("forget_user: the payload names no user_id")
    return ProviderScope(user_id, "forget", DEFAULT_AGENT_ID)


class DurableWrites(ABC):
    """The contract of a provider whose writes go through the durable write queue:
    ``prepare_write`` turns a hook's data into a JSON payload (None: nothing to write),
    stored as a job; ``apply_write`` sends one payload and raises ``RetryLater`` (or any
    error) to be tried again with backoff."""

    @abstractmethod
    def prepare_write(
        self, op: str, data: Mapping[str, Any], ctx: ProviderContext
    ) -> dict[str, Any] | None: ...

    @abstractmethod
    def apply_write(self, payload: Mapping[str, Any]) -> None: ...

    # The manager sends these through prepare_write/apply_write instead; the plain
    # hooks do nothing so that a write is never sent twice.
    def sync_turn(self, user_text: str, assistant_text: str, ctx: ProviderContext) -> None:
        return None

    def on_memory_write(self, write: Any, ctx: ProviderContext) -> None:
        return None

    def on_session_end(self, messages: Any, ctx: ProviderContext) -> None:
        return None

    def on_pre_compress(self, messages: Any, ctx: ProviderContext) -> None:
        return None


class ProviderHealth:
    """Reachability and the last error of one provider, mirrored to status.json."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.reachable: bool | None = None  # None: not contacted yet
        self.last_error: str = ""
        self.last_error_at: float | None = None
        self._lock = threading.Lock()

    def ok(self) -> None:
        self._set(True, None)

    def failed(self, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._set(False, text[:500])

    def _set(self, reachable: bool, error: str | None) -> None:
        with self._lock:
            changed = reachable != self.reachable or (error is not None and error != self.last_error)
            self.reachable = reachable
            if error is not None:
                self.last_error, self.last_error_at = error, time.time()
            snapshot = self.as_dict()
        if changed and self.folder is not None:
            try:
                ensure_folder(self.folder)
                tmp = self.folder / f".{STATUS_FILE}.tmp"
                tmp.write_text(json.dumps(snapshot) + "\n", encoding="utf-8")
                tmp.replace(self.folder / STATUS_FILE)
            except OSError:
                pass  # health is advisory; never fail a call over it

    def as_dict(self) -> dict[str, Any]:
        return {
            "reachable": self.reachable,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


def read_status(folder: Path) -> dict[str, Any]:
    """What the last process recorded in ``status.json`` ({} when nothing)."""
    try:
        data = json.loads((folder / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
