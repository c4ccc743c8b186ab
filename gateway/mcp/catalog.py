"""The MCP tools the agent is offered: one immutable ``Catalog`` per fetch.

A catalog is built at start and on reload from what each server listed, and stored
(``McpRepository.add_catalog``); a session uses the newest catalog created at or before
it started, so its tool definitions — part of the cached prompt prefix — never change
under it. The order is stable: servers by name, then tools by name.

Everything a server says about its tools is untrusted and reaches every request's
prefix, so a tool is left out (with a warning) when its description does not pass the
threat scan, when its schema is not a JSON object schema or is too big, or when its
name cannot be made a valid Anthropic tool name (``SERVER__TOOL``, at most 128 of
``[A-Za-z0-9_-]``; other characters become ``_``, and a clash drops the later tool).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mnemo.memory.threats import scan

SEPARATOR = "__"
MAX_NAME = 128
MAX_DESCRIPTION = 1024
MAX_SCHEMA_CHARS = 8000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ListedTool:
    """A tool as a server listed it (the connection turns SDK objects into these)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class McpTool:
    server: str
    tool: str  # the server's own name, used for the call
    name: str  # SERVER__TOOL, as the model sees it
    description: str
    input_schema: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        """The Anthropic tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}


@dataclass(frozen=True, slots=True)
class Catalog:
    tools: tuple[McpTool, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            [
                {
                    "server": t.server,
                    "tool": t.tool,
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.input_schema,
                }
                for t in self.tools
            ],
            ensure_ascii=False,
            sort_keys=True,
        )

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> Catalog:
        return cls(
            tuple(
                McpTool(t["server"], t["tool"], t["name"], t["description"], t["input_schema"])
                for t in json.loads(text)
            )
        )

    def of(self, server: str) -> tuple[McpTool, ...]:
        return tuple(t for t in self.tools if t.server == server)


def qualified_name(server: str, tool: str) -> str | None:
    """``SERVER__TOOL`` made a valid tool name, or None when it would be too long."""
    name = f"{server}{SEPARATOR}{_UNSAFE.sub('_', tool)}"
    return name if 0 < len(tool) and len(name) <= MAX_NAME else None


def _object_schema(schema: Mapping[str, Any]) -> dict[str, Any] | str:
    out = dict(schema)
    out.setdefault("type", "object")
    if out["type"] != "object":
        return "its input schema is not an object"
    if len(json.dumps(out, ensure_ascii=False)) > MAX_SCHEMA_CHARS:
        return f"its input schema is longer than {MAX_SCHEMA_CHARS:,} characters"
    return out


def server_tools(
    server: str, listed: Iterable[ListedTool], allow: tuple[str, ...] | None
) -> tuple[list[McpTool], list[str]]:
    """One server's offered tools (``allow``: the configured allowlist, None for all),
    sorted, and a warning for each tool left out."""
    items = sorted(listed, key=lambda t: t.name)
    tools: list[McpTool] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for item in items:
        if allow is not None and item.name not in allow:
            continue
        name = qualified_name(server, item.name)
        if name is None:
            warnings.append(f"{server}: tool {item.name[:60]!r} left out: its name is too long")
            continue
        if name in seen:
            warnings.append(f"{server}: tool {item.name!r} left out: {name} is taken by another of its tools")
            continue
        description = " ".join(item.description.split())[:MAX_DESCRIPTION]
        threat = scan(description)
        if threat is not None:
            warnings.append(f"{server}: tool {item.name!r} left out: its description {threat.detail}")
            continue
        schema = _object_schema(item.input_schema)
        if isinstance(schema, str):
            warnings.append(f"{server}: tool {item.name!r} left out: {schema}")
            continue
        seen.add(name)
        tools.append(McpTool(server, item.name, name, f"[MCP {server}] {description}".strip(), schema))
    for tool in sorted(set(allow or ()) - {i.name for i in items}):
        warnings.append(f"{server}: tool {tool!r} is in the allowlist but the server does not offer it")
    return tools, warnings
