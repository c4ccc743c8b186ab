"""Durable provider writes and provider health, shared by every external provider.

External providers answer over the network, so a write must survive the provider being
down, slow or rate limited, and a restart of mnemo. A provider that implements
``DurableWrites`` (ours through ``memory.external.ExternalProvider``) splits each write
in two:

* ``prepare_write(operation, ctx)`` — pure, no I/O: a typed operation
  (``memory.writes``: ``SyncTurn``, ``MirrorWrite``, ``SessionEnd``, ``PreCompress``)
  becomes a ``ProviderWrite`` that carries the speaker's scope
  (``memory.provider_scope``) and an idempotency key derived from the turn. None:
  nothing to write (no speaker).
* ``apply_write(write)`` — sends it. Idempotent per ``write.key``, raises on failure;
  ``RetryLater`` carries the server's ``Retry-After``.

Erasure (``mnemo users erase``, ``/forget me``) queues one more operation,
``ForgetUser``: its payload (``forget_user``) names only the user's scope ``user_id``,
built here and not by ``prepare_write`` (the person is gone from mnemo by the time it
is sent), and ``apply_write`` deletes everything the provider holds for that user with
the API's own delete call. Like any write it waits in the job queue while the provider
is down.

``MemoryManager`` hands prepared writes to a write sink (the gateway's persisted job
queue, kind ``provider_write``, which stores ``ProviderWrite.to_payload()``), and the
queue calls ``MemoryManager.apply_write`` with the stored payload, with backoff and
bounded attempts. Without a sink (tools, tests) the manager applies the write in the
background at once.

Health: ``ProviderHealth`` remembers whether the last call reached the provider and
the last error, and keeps a copy in ``providers/<name>/status.json`` so that
``mnemo providers status`` (another process) can show it.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemo.memory.atomic import ensure_folder
from mnemo.memory.provider import Messages, ProviderContext
from mnemo.memory.writes import Operation, ProviderWrite

if TYPE_CHECKING:
    from mnemo.memory.memory_tool import MemoryWrite

STATUS_FILE = "status.json"


class RetryLater(Exception):
    """The provider asked to be called again later (429/503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def forget_user(user_id: str) -> dict[str, Any]:
    """The job payload that erases ``user_id`` (``PLATFORM:ID``) at an external provider:
    ``{"op": "forget_user", "key": …, "scope": {"user_id": …, …}, …}``, the scope's
    ``user_id`` in the form ``scope_for`` gives every provider call."""
    return ProviderWrite.forget(user_id).to_payload()


class DurableWrites(ABC):
    """The contract of a provider whose writes go through the durable write queue:
    ``prepare_write`` turns an operation into a ``ProviderWrite`` (None: nothing to
    write), stored as a job; ``apply_write`` sends one and raises ``RetryLater`` (or any
    error) to be tried again with backoff. Called by ``MemoryManager`` only, off the
    event loop."""

    @abstractmethod
    def prepare_write(self, operation: Operation, ctx: ProviderContext) -> ProviderWrite | None: ...

    @abstractmethod
    def apply_write(self, write: ProviderWrite) -> None: ...

    # The manager sends these through prepare_write/apply_write instead; the plain
    # hooks do nothing so that a write is never sent twice.
    def sync_turn(self, user_text: str, assistant_text: str, ctx: ProviderContext) -> None:
        return None

    def on_memory_write(self, write: MemoryWrite, ctx: ProviderContext) -> None:
        return None

    def on_session_end(self, messages: Messages, ctx: ProviderContext) -> None:
        return None

    def on_pre_compress(self, messages: Messages, ctx: ProviderContext) -> None:
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
