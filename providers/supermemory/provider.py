"""SupermemoryProvider: Supermemory's hosted (or self-hosted) memory API, official SDK.

Scope (``memory.provider_scope``): one Supermemory namespace per mnemo user — the
speaker, also in a shared room — named ``<namespace_prefix>:<user id>``
(``mnemo:telegram:42``, ``client.namespace_for``). Every call names it; a turn without
a speaker neither writes nor recalls. The mnemo session and the bot's agent id travel
in each document's metadata (``mnemo_session``, ``mnemo_agent``): a namespace is the
only isolation Supermemory has, and recall is user-wide, not per session.

Writes are durable (``memory.durable``): a turn, a mirrored memory entry, the
session-end and pre-compress transcripts are each one document whose ``id`` is the
write key, so a write retried after a lost answer is an unchanged duplicate on the
server, never a second copy. ``ForgetUser`` (erasure) deletes the user's namespace.
The ``supermemory_remember`` tool writes at once, also keyed.

Settings: ``api_key`` (or ``SUPERMEMORY_API_KEY``), ``base_url`` (or
``SUPERMEMORY_BASE_URL``, default https://api.supermemory.ai), ``namespace_prefix``,
``search_mode``, ``top_k``, ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider, missing_package
from mnemo.memory.provider import Availability
from mnemo.memory.provider_config import ConfigField, ConfigKind
from mnemo.memory.provider_scope import ProviderScope
from mnemo.memory.provider_tools import SharedTools, api_key_field, setting, timeout_field, top_k_field
from mnemo.memory.writes import (
    LegacyWrite,
    MirrorWrite,
    PreCompress,
    ProviderWrite,
    Remember,
    SessionEnd,
    SyncTurn,
    label,
)
from mnemo.providers.supermemory.client import (
    DEFAULT_URL,
    PREFIX_RE,
    SEARCH_MODES,
    SupermemoryClient,
    namespace_for,
)

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20
DEFAULT_PREFIX = "mnemo"


def transcript(messages: Sequence[tuple[str, str]]) -> str:
    """A conversation as one document: a ``role: text`` line per message."""
    return "\n".join(f"{role}: {text}" for role, text in messages)


class SupermemoryProvider(ExternalProvider[SupermemoryClient]):
    name = "supermemory"
    label = "Supermemory"
    description = "Supermemory hosted memory (official SDK), a namespace per user"
    shared_tools = SharedTools.standard(
        "supermemory",
        "Supermemory",
        "Supermemory's profile of the user you are talking to: stable facts and recent context.",
    )

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("Supermemory API key (or SUPERMEMORY_API_KEY)"),
            ConfigField("base_url", f"API base URL (or SUPERMEMORY_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField(
                "namespace_prefix",
                "namespaces are PREFIX:user (letters, digits, _ and -)",
                default=DEFAULT_PREFIX,
            ),
            ConfigField(
                "search_mode",
                "what recall searches: learned memories, source chunks, or both",
                ConfigKind.CHOICE,
                "hybrid",
                choices=SEARCH_MODES,
            ),
            top_k_field(),
            timeout_field(),
        )

    def save_config(self, values: Mapping[str, Any], home: Path) -> Path:
        reason = self._prefix_problem(values)
        if reason:
            raise ProviderError(reason)
        return super().save_config(values, home)

    @staticmethod
    def _prefix_problem(config: Mapping[str, Any]) -> str:
        prefix = str(config.get("namespace_prefix", DEFAULT_PREFIX) or "")
        if not PREFIX_RE.fullmatch(prefix):
            return f"namespace_prefix: {prefix!r} may hold only letters, digits, _ and - (at most 40)"
        return ""

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        missing = missing_package("supermemory", "supermemory", "supermemory")
        if missing is not None:
            return missing
        if not setting(config, "api_key", "SUPERMEMORY_API_KEY"):
            return self.key_missing("SUPERMEMORY_API_KEY")
        reason = self._prefix_problem(config)
        return Availability(not reason, reason)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        self._client = SupermemoryClient(  # no I/O: the first request is the first call
            setting(config, "base_url", "SUPERMEMORY_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "SUPERMEMORY_API_KEY"),
            self.timeout_s,
        )

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()

    # --- scope, recall and tools -------------------------------------------------------
    def namespace(self, scope: ProviderScope) -> str:
        return namespace_for(str(self._config.get("namespace_prefix", DEFAULT_PREFIX) or ""), scope.user_id)

    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        ns, mode = self.namespace(scope), str(self._config.get("search_mode", "hybrid"))
        return self.call("search", lambda: self.client.search(ns, query[:MAX_TEXT], limit=limit, mode=mode))

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        ns = self.namespace(scope)
        return self.call("profile", lambda: self.client.profile(ns)).as_dict()

    # --- writes -----------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                content = transcript([("user", user[:MAX_TEXT]), ("assistant", assistant[:MAX_TEXT])])
            case MirrorWrite(content=text):
                content = text[:MAX_TEXT]
            case Remember(content=text):
                content = text.strip()[:MAX_TEXT]
            case SessionEnd(messages=said) | PreCompress(messages=said):
                content = transcript([(m.role, m.text[:MAX_TEXT]) for m in said[-SESSION_END_MESSAGES:]])
            case _:
                raise ProviderError(f"supermemory: cannot send {label(write.operation)}")
        self._add(write, content)

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        self._add(write, str(operation.body["content"]))

    def _add(self, write: ProviderWrite, content: str) -> None:
        ns, key, scope = self.namespace(write.scope), write.key, write.scope
        metadata = {
            "mnemo_key": key,
            "mnemo_op": label(write.operation),
            "mnemo_session": scope.session_id,
            "mnemo_agent": scope.agent_id,
        }
        self.call("add", lambda: self.client.add(ns, content, doc_id=key, metadata=metadata))

    def forget(self, scope: ProviderScope) -> None:
        ns = self.namespace(scope)
        self.call("delete", lambda: self.client.delete_namespace(ns))
