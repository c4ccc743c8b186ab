"""What the external memory providers (``mnemo.providers.*``) share: their tool schemas,
the settings lookup and the state they start with.

Most providers offer the model the same few tools under their own prefix:

* ``<prefix>_profile`` — no arguments: what the provider holds about the speaker;
* ``<prefix>_search`` — ``query`` (required) and ``limit`` (1 to ``max_limit``);
* ``<prefix>_remember`` — one ``content`` sentence, stored durably (so the manager scans
  it before the provider sees it: ``durable_args``);
* ``<prefix>_conclude`` — the same with a ``conclusion`` argument (Mem0, Honcho).

A provider whose tools differ keeps its own ``ToolSchema``. A setting is read from the
provider's config, else from its environment variable, else a default (``setting``).
``ProviderState`` is the state a provider has before ``initialize``: no config, no
client, health kept in memory only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from mnemo.memory.durable import ProviderHealth
from mnemo.memory.provider import ToolSchema

SEARCH_MAX_LIMIT = 50


def setting(config: Mapping[str, Any], key: str, env: str, default: str = "") -> str:
    """``config[key]``, else the environment variable ``env``, else ``default`` (an empty
    value counts as unset)."""
    return str(config.get(key) or os.environ.get(env) or default)


class ProviderState:
    """Mixed in before ``MemoryProvider``: ``_config``, ``_client`` and ``health`` as they are
    until ``initialize`` sets them (construction does no I/O)."""

    _config: Mapping[str, Any]
    _client: Any
    health: ProviderHealth

    def __init__(self) -> None:
        super().__init__()
        self._config = {}
        self._client = None
        self.health = ProviderHealth()


def profile_tool(prefix: str, description: str) -> ToolSchema:
    """``<prefix>_profile``, no arguments."""
    return ToolSchema(
        name=f"{prefix}_profile", description=description, input_schema={"type": "object", "properties": {}}
    )


def search_tool(
    prefix: str, label: str, *, description: str | None = None, max_limit: int = SEARCH_MAX_LIMIT
) -> ToolSchema:
    """``<prefix>_search``: a required ``query`` and an optional ``limit``; the description
    defaults to a search of ``label``'s long-term memories of the speaker."""
    return ToolSchema(
        name=f"{prefix}_search",
        description=description or f"Search {label}'s long-term memories of the user you are talking to.",
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer", "minimum": 1, "maximum": max_limit},
            },
            "required": ["query"],
        },
    )


def _sentence_tool(name: str, description: str, arg: str) -> ToolSchema:
    return ToolSchema(
        name=name,
        description=description,
        input_schema={
            "type": "object",
            "properties": {arg: {"type": "string", "description": "one declarative sentence"}},
            "required": [arg],
        },
        durable_args=(arg,),
    )


def remember_tool(prefix: str, label: str) -> ToolSchema:
    """``<prefix>_remember``: one durable fact or preference (``content``)."""
    return _sentence_tool(
        f"{prefix}_remember", f"Store one durable fact or preference about the user in {label}.", "content"
    )


def conclude_tool(prefix: str, label: str) -> ToolSchema:
    """``<prefix>_conclude``: one durable conclusion (``conclusion``)."""
    return _sentence_tool(
        f"{prefix}_conclude",
        f"Store one durable conclusion about the user in {label} (a fact, preference or decision).",
        "conclusion",
    )
