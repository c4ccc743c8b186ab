"""OpenVikingProvider: an OpenViking server (context database) through its HTTP SDK.

Scope (``memory.provider_scope``): an OpenViking account (setting ``account``, default
``mnemo``) with one OpenViking *user* per mnemo user (``tenant_user``: the speaker's id
made URI-safe, ``telegram:42`` → ``telegram_42``), named on every request; the bot is the actor peer (``agent_id``); the
mnemo session is an OpenViking session of that user. Recall searches
``viking://user/memories`` of the speaker only. A turn without a speaker neither writes
nor recalls. Settings: ``api_key`` (or ``OPENVIKING_API_KEY``; a key that may act for
the account's users), ``base_url`` (or ``OPENVIKING_BASE_URL``, default
http://127.0.0.1:1933).

Writes are durable (``memory.durable``): a turn adds its two messages to the session
(``turn_id`` = the write key); session end and pre-compress commit the session, which
makes the server extract memories from it before mnemo forgets the detail; mirrored
memory entries and ``openviking_remember`` write a fact file named by the write key
(the same write again leaves the file as it is). ``ForgetUser`` deletes the user's
memories and sessions.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider
from mnemo.memory.extras import install_hint
from mnemo.memory.provider import Availability
from mnemo.memory.provider_config import ConfigField
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope
from mnemo.memory.provider_tools import SharedTools, api_key_field, setting, timeout_field, top_k_field
from mnemo.memory.writes import (
    LegacyWrite,
    MirrorWrite,
    PreCompress,
    ProviderWrite,
    Remember,
    SessionEnd,
    SyncTurn,
    WriteOp,
    label,
)

DEFAULT_URL = "http://127.0.0.1:1933"  # a self-hosted openviking-server's default port
MAX_TEXT = 4000


class OpenVikingProvider(ExternalProvider[Any]):  # client.OpenVikingClient: imports the SDK
    name = "openviking"
    label = "OpenViking"
    description = "OpenViking context database (HTTP SDK), one OpenViking user per mnemo user"
    shared_tools = SharedTools.standard(
        "openviking", "OpenViking", "The profile OpenViking keeps of the user you are talking to."
    )

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("OpenViking API key that may act for the account's users (or OPENVIKING_API_KEY)"),
            ConfigField("base_url", f"server URL (or OPENVIKING_BASE_URL); empty: {DEFAULT_URL}"),
            ConfigField("account", "OpenViking account holding mnemo's users", default="mnemo"),
            ConfigField("agent_id", "the bot's actor peer id", default=DEFAULT_AGENT_ID),
            top_k_field(),
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        if importlib.util.find_spec("openviking_sdk") is None:
            return Availability(False, f"the OpenViking SDK is missing: {install_hint('openviking')}")
        if not setting(config, "api_key", "OPENVIKING_API_KEY"):
            return self.key_missing("OPENVIKING_API_KEY")
        return Availability(True)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        from mnemo.providers.openviking.client import OpenVikingClient  # the SDK, only when used

        # every call opens and closes its own SDK client: nothing to shut down
        self._client = OpenVikingClient(
            setting(config, "base_url", "OPENVIKING_BASE_URL", DEFAULT_URL),
            setting(config, "api_key", "OPENVIKING_API_KEY"),
            str(config.get("account") or "mnemo"),
            self.timeout_s,
        )

    # --- recall and tools -------------------------------------------------------------
    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        return self.call("find", lambda: self.client.find(query, scope, limit=limit))

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        return {"profile": self.call("profile", lambda: self.client.profile(scope))}

    # --- writes -----------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                self._add_turn(write, user[:MAX_TEXT], assistant[:MAX_TEXT])
            case MirrorWrite(content=content) | Remember(content=content):
                self._write_fact(write, content[:MAX_TEXT])
            case SessionEnd() | PreCompress():
                # the turns are in the session already: committing extracts memories from them
                self.call("commit", lambda: self.client.commit(write.scope))
            case _:
                raise ProviderError(f"openviking: cannot send {label(write.operation)}")

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        body = operation.body
        if operation.kind is WriteOp.TURN:
            self._add_turn(write, str(body["user"]), str(body["assistant"]))
        elif operation.kind is WriteOp.MEMORY:
            self._write_fact(write, str(body["content"]))
        else:
            self.call("commit", lambda: self.client.commit(write.scope))

    def _add_turn(self, write: ProviderWrite, user: str, assistant: str) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": user, "turn_id": write.key},
            {"role": "assistant", "content": assistant, "turn_id": write.key},
        ]
        self.call("add_turns", lambda: self.client.add_turns(messages, write.scope))

    def _write_fact(self, write: ProviderWrite, content: str) -> None:
        self.call("write_fact", lambda: self.client.write_fact(write.key, content, write.scope))

    def forget(self, scope: ProviderScope) -> None:
        self.call("forget", lambda: self.client.forget(scope))
