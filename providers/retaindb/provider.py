"""RetainDBProvider: RetainDB's hosted memory API over a small aiohttp client.

Scope (``memory.provider_scope``): ``user_id`` = the speaker (``telegram:42``),
``session_id`` = the mnemo session, ``project`` = a setting (default ``mnemo``). Every
request names the speaker's ``user_id``; a turn without a speaker neither writes nor
recalls. Settings: ``api_key`` (or ``RETAINDB_API_KEY``), ``base_url`` (or
``RETAINDB_BASE_URL``, default https://api.retaindb.com).

Writes are durable (``memory.durable``): turns and session-end / pre-compress
transcripts go to ``POST /v1/memory/ingest/session``, mirrored memory entries and the
``retaindb_remember`` tool to ``POST /v1/memory``; each carries its write key in
``metadata.mnemo_key``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider
from mnemo.memory.provider import Availability
from mnemo.memory.provider_config import ConfigField
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
from mnemo.providers.retaindb.client import DEFAULT_URL, RetainDBClient

MAX_TEXT = 4000
SESSION_END_MESSAGES = 20


class RetainDBProvider(ExternalProvider[RetainDBClient]):
    name = "retaindb"
    label = "RetainDB"
    description = "RetainDB hosted memory (REST API), per-user scopes"
    shared_tools = SharedTools.standard(
        "retaindb", "RetainDB", "Everything RetainDB remembers about the user you are talking to."
    )

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("RetainDB API key (or RETAINDB_API_KEY)"),
            ConfigField("base_url", f"API base URL (or RETAINDB_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("project", "RetainDB project the memories live in", default="mnemo"),
            top_k_field(),
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        if not setting(config, "api_key", "RETAINDB_API_KEY"):
            return self.key_missing("RETAINDB_API_KEY")
        return Availability(True)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        # every call opens and closes its own HTTP session: nothing to shut down
        self._client = RetainDBClient(
            setting(config, "base_url", "RETAINDB_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "RETAINDB_API_KEY"),
            str(config.get("project") or "mnemo"),
            self.timeout_s,
        )

    # --- recall and tools --------------------------------------------------------------
    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        return self.call("search", lambda: self.client.search(query, scope, top_k=limit))

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        return {"memories": self.call("profile", lambda: self.client.profile(scope))}

    # --- writes -----------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        metadata = {"mnemo_key": write.key, "mnemo_op": label(write.operation)}
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                turn = [
                    {"role": "user", "content": user[:MAX_TEXT]},
                    {"role": "assistant", "content": assistant[:MAX_TEXT]},
                ]
                self._ingest(turn, write.scope, metadata)
            case MirrorWrite(content=content) | Remember(content=content):
                self._remember(content[:MAX_TEXT], write.scope, metadata)
            case SessionEnd(messages=said) | PreCompress(messages=said):
                messages = [
                    {"role": m.role, "content": m.text[:MAX_TEXT]} for m in said[-SESSION_END_MESSAGES:]
                ]
                self._ingest(messages, write.scope, metadata)
            case _:
                raise ProviderError(f"retaindb: cannot send {label(write.operation)}")

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        metadata = {"mnemo_key": write.key, "mnemo_op": label(operation)}
        if "content" in operation.body:
            self._remember(str(operation.body["content"]), write.scope, metadata)
        else:
            self._ingest(list(operation.body["messages"]), write.scope, metadata)

    def _remember(self, content: str, scope: ProviderScope, metadata: Mapping[str, str]) -> None:
        self.call(
            "remember", lambda: self.client.remember(content, scope, memory_type="fact", metadata=metadata)
        )

    def _ingest(
        self, messages: list[dict[str, str]], scope: ProviderScope, metadata: Mapping[str, str]
    ) -> None:
        self.call("ingest", lambda: self.client.ingest_session(messages, scope, metadata=metadata))

    def forget(self, scope: ProviderScope) -> None:
        self.call("forget", lambda: self.client.forget(scope))
