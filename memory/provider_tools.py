"""What the external memory providers (``mnemo.providers.*``) share: their tool schemas,
their common settings and the settings lookup.

Most providers offer the model the same few tools under their own prefix:

* ``<prefix>_profile`` — no arguments: what the provider holds about the speaker;
* ``<prefix>_search`` — ``query`` (required) and ``limit`` (1 to ``max_limit``);
* ``<prefix>_remember`` — one ``content`` sentence, stored durably (so the manager scans
  it before the provider sees it: ``durable_args``);
* ``<prefix>_conclude`` — the same with a ``conclusion`` argument (Mem0, Honcho).

``SharedTools`` is that set for one provider (``memory.external.ExternalProvider``
answers it); a provider whose tools differ keeps its own ``ToolSchema``. A setting is
read from the provider's config, else from its environment variable, else a default
(``setting``); ``api_key_field``, ``top_k_field`` and ``timeout_field`` are the settings
most providers ask for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mnemo.memory.provider import ToolSchema
from mnemo.memory.provider_config import ConfigField, ConfigKind

SEARCH_MAX_LIMIT = 50


def setting(config: Mapping[str, Any], key: str, env: str, default: str = "") -> str:
    """``config[key]``, else the environment variable ``env``, else ``default`` (an empty
    value counts as unset)."""
    return str(config.get(key) or os.environ.get(env) or default)


def api_key_field(help: str) -> ConfigField:
    return ConfigField("api_key", help, secret=True)


def top_k_field(help: str = "memories recalled per turn") -> ConfigField:
    return ConfigField("top_k", help, ConfigKind.INTEGER, 5, minimum=1, maximum=50)


def timeout_field() -> ConfigField:
    return ConfigField(
        "timeout_s", "HTTP timeout per request (seconds)", ConfigKind.NUMBER, 10.0, minimum=0.1, maximum=300
    )


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


@dataclass(frozen=True, slots=True)
class SharedTools:
    """One provider's profile, search and write tool (``remember`` or ``conclude``)."""

    profile: ToolSchema
    search: ToolSchema
    write: ToolSchema

    @classmethod
    def standard(
        cls,
        prefix: str,
        label: str,
        profile: str,
        *,
        conclude: bool = False,
        search: str | None = None,
    ) -> SharedTools:
        """``<prefix>_profile`` described by ``profile``, ``<prefix>_search`` and
        ``<prefix>_remember`` (``<prefix>_conclude`` with ``conclude``)."""
        write = conclude_tool(prefix, label) if conclude else remember_tool(prefix, label)
        return cls(profile_tool(prefix, profile), search_tool(prefix, label, description=search), write)

    @property
    def write_arg(self) -> str:
        """The write tool's one argument (``content`` or ``conclusion``)."""
        return self.write.durable_args[0]

    @property
    def verb(self) -> str:
        """The write tool's verb: its name after the prefix (``remember``, ``conclude``)."""
        return self.write.name.rsplit("_", 1)[-1]

    def schemas(self) -> tuple[ToolSchema, ...]:
        return (self.profile, self.search, self.write)
