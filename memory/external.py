"""``ExternalProvider``: what mnemo's own network memory providers share.

Mem0, Hindsight, Honcho, Supermemory, RetainDB, ByteRover and OpenViking
(``mnemo.providers.*``) are the same shape around different APIs. A subclass keeps only
what differs — its settings, its client and the calls that send each operation — and
inherits:

* **state and lifecycle**: no config, no client and health in memory until
  ``initialize``, which keeps the settings, mirrors health to
  ``providers/<name>/status.json`` and calls ``connect`` (build the client, no I/O);
* **the per-speaker scope** (``scope``, ``memory.provider_scope``), the bot's id from the
  ``agent_id`` setting: every write and recall is in the speaker's scope, and a turn
  without a speaker neither writes nor recalls;
* **calls**: ``call(what, fn)`` is one API call with health bookkeeping, and
  ``retry_later`` classifies its errors (``RetryLater`` with the server's delay, or an
  error the job queue retries on its own schedule);
* **durable writes** (``memory.durable``, ``memory.writes``): ``prepare_write`` is the
  same for every provider (scope, key); ``apply_write`` sends an erasure to ``forget``,
  a write queued by an older mnemo to ``apply_legacy``, and every other operation to
  ``send``, which the subclass writes as a ``match`` over the typed operations;
* **recall**: ``prefetch`` renders what ``recall`` finds as one bulleted block;
* **the shared tools** (``shared_tools``: profile, search, and remember or conclude),
  answered from ``profile``, ``search`` and a ``Remember`` write sent at once.

This is a convenience for our providers, not part of the contract: a third-party
provider implements ``MemoryProvider`` (and, for durable writes, ``DurableWrites``).

Every durable write is journaled once it is applied (``journal_entry``: the gateway's
job handler appends it, keyed by the write's dedupe key so a retried job never
journals twice): what reached the provider, in whose scope, from which session. An
erasure's ``forget_user`` is not journaled: it would name the person it erases.
"""

from __future__ import annotations

import importlib
import json
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from mnemo.memory.durable import DurableWrites, ProviderHealth, RetryLater
from mnemo.memory.extras import install_hint
from mnemo.memory.journal import Actor, Layer, NewEntry, Provenance, Trust
from mnemo.memory.provider import Availability, MemoryProvider, ProviderContext, Recall, ToolSchema
from mnemo.memory.provider_config import provider_dir
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, scope_for
from mnemo.memory.provider_tools import SEARCH_MAX_LIMIT, SharedTools
from mnemo.memory.writes import (
    Conversation,
    ForgetUser,
    LegacyWrite,
    MirrorWrite,
    Operation,
    ProviderWrite,
    Remember,
    SyncTurn,
)

C = TypeVar("C")
T = TypeVar("T")

DEFAULT_SEARCH_LIMIT = 10


def journal_entry(provider: str, write: ProviderWrite) -> NewEntry | None:
    """The journal entry of an applied provider write (None: not journaled)."""
    op = write.operation
    if isinstance(op, ForgetUser | LegacyWrite):
        return None
    new: str | None = None
    if isinstance(op, MirrorWrite | Remember):
        new = op.content
    if isinstance(op, SyncTurn):
        note = "a conversation turn"
    elif isinstance(op, Conversation):
        note = f"{len(op.messages)} messages of the conversation"
    else:
        note = None
    by = Provenance(
        Actor.job("provider_write"),
        Trust.INFERRED,
        speaker=write.scope.user_id,
        session=write.session_id or None,
    )
    return NewEntry(
        Layer.PROVIDER, write.scope.user_id, str(op.op), None, new, by, f"{provider}: {note or op.op}"
    )


def answer(ok: bool = True, **fields: Any) -> str:
    """A tool result: ``{"ok": …, …}`` as JSON."""
    return json.dumps({"ok": ok, **fields}, ensure_ascii=False)


def refuse(error: str) -> str:
    return answer(False, error=error)


def missing_package(module: str, package: str, extra: str) -> Availability | None:
    """Unavailable when ``module`` cannot be imported, saying which extra installs it."""
    try:
        importlib.import_module(module)
    except ImportError:
        return Availability(False, f"the {package} package is missing: {install_hint(extra)}")
    return None


class ExternalProvider(DurableWrites, MemoryProvider, Generic[C]):
    """Subclass, set ``name``/``label``/``description`` (and ``shared_tools`` when it offers
    them), implement ``is_available``, ``get_config_schema``, ``send``, ``forget``,
    ``apply_legacy`` and what recall and the tools need."""

    shared_tools: ClassVar[SharedTools | None] = None
    max_text: ClassVar[int] = 4000  # a recall query is cut to this many characters

    def __init__(self) -> None:
        super().__init__()
        self._config: Mapping[str, Any] = {}
        self._client: C | None = None
        self.health = ProviderHealth()

    # --- lifecycle -------------------------------------------------------------------
    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self.health = ProviderHealth(provider_dir(home, self.name))
        self.connect(home, self._config)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        """Build the client from the settings, without I/O (the first call is the first
        request). Default: nothing to build now."""

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # the memories live on the provider's server; settings are in the profile

    def key_missing(self, env: str) -> Availability:
        return Availability(
            False, f"set api_key (mnemo providers setup {self.name} --set api_key=…) or {env}"
        )

    @property
    def client(self) -> C:
        if self._client is None:
            raise RuntimeError(f"{self.name} provider is not initialised")
        return self._client

    @property
    def timeout_s(self) -> float:
        return float(self._config.get("timeout_s", 10.0))

    @property
    def top_k(self) -> int:
        return int(self._config.get("top_k", 5))

    # --- scope and calls ----------------------------------------------------------------
    def scope(self, ctx: ProviderContext) -> ProviderScope | None:
        """The speaker's scope for this call; None when nobody speaks."""
        return scope_for(ctx, str(self._config.get("agent_id") or DEFAULT_AGENT_ID))

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """One API call: health records the outcome, and an error the server wants
        retried later is raised as ``RetryLater`` (``retry_later``)."""
        try:
            result = fn()
        except Exception as e:
            self.health.failed(e)
            later = self.retry_later(what, e)
            if later is None or later is e:
                raise
            raise later from e
        self.health.ok()
        return result

    def retry_later(self, what: str, error: Exception) -> RetryLater | None:
        """``error`` as ``RetryLater`` when the server asked for a pause (429/503), else
        None. Default: only a ``RetryLater`` the client raised itself."""
        return error if isinstance(error, RetryLater) else None

    # --- durable writes ---------------------------------------------------------------
    def prepare_write(self, operation: Operation, ctx: ProviderContext) -> ProviderWrite | None:
        scope = self.scope(ctx)
        return None if scope is None else ProviderWrite.of(operation, ctx, scope)

    def apply_write(self, write: ProviderWrite) -> None:
        if isinstance(write.operation, ForgetUser):
            self.forget(write.scope)
        elif isinstance(write.operation, LegacyWrite):
            self.apply_legacy(write.operation, write)
        else:
            self.send(write)

    @abstractmethod
    def send(self, write: ProviderWrite) -> None:
        """Send one write (never ``ForgetUser`` or ``LegacyWrite``); idempotent per
        ``write.key``; raise to have it retried."""

    @abstractmethod
    def forget(self, scope: ProviderScope) -> None:
        """Delete everything the provider holds of ``scope.user_id``; succeeds when there
        is nothing (left) to delete."""

    @abstractmethod
    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        """Send a write queued by mnemo 0.2 or older: ``operation.body`` holds the fields
        this provider's ``prepare_write`` produced then."""

    # --- recall ----------------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self.scope(ctx)
        if scope is None:
            return Recall("")
        found = self.recall(query[: self.max_text], scope)
        if not found:
            return Recall("")
        lines = "\n".join(f"- {m}" for m in found)
        return Recall(f"{self.display_label} remembers about this user:\n{lines}", len(found))

    def recall(self, query: str, scope: ProviderScope) -> list[str]:
        """What to recall for this turn; default: the ``top_k`` best search results."""
        return self.search(query, scope, self.top_k)

    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        raise NotImplementedError(f"{self.name} does not search")

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        """The ``<name>_profile`` tool's answer (without ``ok``)."""
        raise NotImplementedError(f"{self.name} has no profile")

    # --- tools -----------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return () if self.shared_tools is None else self.shared_tools.schemas()

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self.scope(ctx)
        if scope is None:
            return refuse("no user in this conversation")
        tools = self.shared_tools
        if tools is not None and name == tools.profile.name:
            return answer(**self.profile(scope))
        if tools is not None and name == tools.search.name:
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return refuse("query is required")
            return answer(results=self.search(query, scope, search_limit(args.get("limit"))))
        if tools is not None and name == tools.write.name:
            if not ctx.may_write:
                return refuse("memory is read-only in this context")
            text = args.get(tools.write_arg)
            if not isinstance(text, str) or not text.strip():
                return refuse(f"{tools.write_arg} is required")
            self.remember(text, scope, ctx, tools.verb)
            return answer()
        return refuse(f"unknown tool {name}")

    def remember(self, text: str, scope: ProviderScope, ctx: ProviderContext, verb: str) -> None:
        """A tool's explicit write, sent at once (the model hears whether it worked)."""
        self.apply_write(ProviderWrite.of(Remember(text, verb), ctx, scope))


def search_limit(value: object) -> int:
    """The search tool's ``limit``, or the default when it is not an integer in range."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= SEARCH_MAX_LIMIT
    return value if ok and isinstance(value, int) else DEFAULT_SEARCH_LIMIT
