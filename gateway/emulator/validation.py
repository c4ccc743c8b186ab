"""Request validation the way the real Messages API does it: a 400
``invalid_request_error`` with a message naming the offending field.

``validate_request(body)`` is a pure function (``None`` when valid, else the message), so
tests can also use it directly to check that a stored history is a valid conversation.

What is checked: the top-level fields and their types (unknown fields are refused, as the
real API does); messages non-empty, starting with ``user``, roles alternating; content a
non-empty string or a list of known blocks (text, image, tool_use, tool_result) placed in
the right role; each ``tool_result`` answers a ``tool_use`` of the immediately preceding
assistant message and comes before any other block of its message; every ``tool_use`` of
an assistant message that is not the last message is answered in the next user message;
tool_use ids unique; system a string or text blocks; tools with a unique name and an object
``input_schema``; ``tool_choice`` consistent with the tools; at most 4 ``cache_control``
breakpoints, each ``ephemeral`` with a ``5m``/``1h`` ttl, 1-hour ones before 5-minute ones.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from typing import Any, NoReturn

MAX_BREAKPOINTS = 4

_TOP_LEVEL = frozenset(
    {
        "model", "messages", "max_tokens", "system", "tools", "tool_choice", "stream",
        "temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking",
        "service_tier", "cache_control", "container", "mcp_servers", "context_management",
        "output_config", "output_format",
    }
)  # fmt: skip
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TTLS = ("5m", "1h")
_EMPTY = (
    "messages.{i}: all messages must have non-empty content except for the optional final assistant message"
)


class _Invalid(Exception):
    """Internal: carries the first problem found up to ``validate_request``."""


def validate_request(body: Any) -> str | None:
    """Return ``None`` for a valid Messages API request body, else the API's error message."""
    try:
        _check(body)
    except _Invalid as e:
        return str(e)
    return None


def iter_cache_controls(body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every ``cache_control`` in prefix order (tools, system, messages) with its location."""
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if isinstance(tool, dict) and "cache_control" in tool:
                yield f"tools.{i}", tool["cache_control"]
    system = body.get("system")
    if isinstance(system, list):
        for i, block in enumerate(system):
            if isinstance(block, dict) and "cache_control" in block:
                yield f"system.{i}", block["cache_control"]
    messages = body.get("messages")
    if isinstance(messages, list):
        for m, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                for b, block in enumerate(content):
                    if isinstance(block, dict) and "cache_control" in block:
                        yield f"messages.{m}.content.{b}", block["cache_control"]
    if "cache_control" in body:  # automatic caching: one slot, on the last block
        yield "cache_control", body["cache_control"]


def _fail(message: str) -> NoReturn:
    raise _Invalid(message)


def _check(body: Any) -> None:
    if not isinstance(body, dict):
        _fail("The request body must be a JSON object.")
    for key in body:
        if key not in _TOP_LEVEL:
            _fail(f"{key}: Extra inputs are not permitted")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        _fail("model: Field required" if model is None else "model: Input should be a non-empty string")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        _fail("max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        _fail("max_tokens: Input should be an integer greater than or equal to 1")
    if "stream" in body and not isinstance(body["stream"], bool):
        _fail("stream: Input should be a valid boolean")
    _check_sampling(body)
    _check_system(body.get("system"))
    tool_names = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), tool_names)
    _check_messages(body.get("messages"))
    _check_cache_controls(body)


def _check_sampling(body: dict[str, Any]) -> None:
    for key, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        if key in body:
            value = body[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
                _fail(f"{key}: Input should be a number between {low} and {high}")
    if "top_k" in body and (not isinstance(body["top_k"], int) or body["top_k"] < 0):
        _fail("top_k: Input should be a non-negative integer")
    stops = body.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
    ):
        _fail("stop_sequences: Input should be a list of non-empty strings")
    if "metadata" in body and not isinstance(body["metadata"], dict):
        _fail("metadata: Input should be a valid dictionary")


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        _fail("system: Input should be a valid string or a list of text blocks")
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            _fail(f"system.{i}: Input tag should be 'text'")
        _check_text(block, f"system.{i}")


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        _fail("tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            _fail(f"tools.{i}: Input should be a valid dictionary")
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            _fail(f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        if name in names:
            _fail(f"tools: Tool names must be unique. Found duplicate: {name}")
        names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            _fail(f"tools.{i}.input_schema: Field required")
        if schema.get("type") != "object":
            _fail(f"tools.{i}.input_schema.type: Input should be 'object'")
        if "description" in tool and not isinstance(tool["description"], str):
            _fail(f"tools.{i}.description: Input should be a valid string")
    return names


def _check_tool_choice(choice: Any, tool_names: set[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        _fail("tool_choice: Input tag should be one of 'auto', 'any', 'tool', 'none'")
    if choice["type"] == "tool" and choice.get("name") not in tool_names:
        _fail(f"tool_choice.name: Tool '{choice.get('name')}' not found in the provided tools")
    if choice["type"] in ("any", "tool") and not tool_names:
        _fail("tool_choice: tool_choice may only be specified while providing tools.")


def _check_messages(messages: Any) -> None:
    if messages is None:
        _fail("messages: Field required")
    if not isinstance(messages, list) or not messages:
        _fail("messages: at least one message is required")
    seen_tool_ids: set[str] = set()
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            _fail(f"messages.{i}: Input should be a valid dictionary")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            _fail(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            _fail('messages: first message must use the "user" role')
        if i > 0 and role == messages[i - 1].get("role"):
            _fail(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row'
            )
        _check_content(msg.get("content"), i, role, final_assistant=(i == last and role == "assistant"))
        blocks = msg["content"] if isinstance(msg["content"], list) else []
        if role == "assistant":
            for b, block in enumerate(blocks):
                if block["type"] == "tool_use":
                    if block["id"] in seen_tool_ids:
                        _fail(f"messages.{i}.content.{b}: `tool_use` ids must be unique")
                    seen_tool_ids.add(block["id"])
        _check_tool_pairing(messages, i)


def _check_content(content: Any, i: int, role: str, *, final_assistant: bool) -> None:
    where = f"messages.{i}.content"
    if isinstance(content, str):
        if not content and not final_assistant:
            _fail(_EMPTY.format(i=i))
        return
    if not isinstance(content, list):
        _fail(f"{where}: Input should be a valid string or a list of content blocks")
    if not content and not final_assistant:
        _fail(_EMPTY.format(i=i))
    seen_other = False
    for b, block in enumerate(content):
        at = f"{where}.{b}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            _check_text(block, at)
        elif kind == "image":
            _check_image(block, at)
        elif kind == "document":
            _check_document(block, at)
        elif kind == "tool_use":
            if role != "assistant":
                _fail(f"{at}: `tool_use` blocks can only be in `assistant` messages")
            _check_tool_use(block, at)
        elif kind == "tool_result":
            if role != "user":
                _fail(f"{at}: `tool_result` blocks can only be in `user` messages")
            if seen_other:
                _fail(f"{at}: `tool_result` blocks must come before any other content in a user message")
            _check_tool_result(block, at)
        else:
            _fail(
                f"{at}: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
                "'text', 'image', 'document', 'tool_use', 'tool_result'"
            )
        if kind != "tool_result":
            seen_other = True


def _check_text(block: dict[str, Any], at: str) -> None:
    text = block.get("text")
    if not isinstance(text, str):
        _fail(f"{at}.text: Field required")
    if not text:
        _fail(f"{at}: text content blocks must be non-empty")


def _check_image(block: dict[str, Any], at: str) -> None:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") not in ("base64", "url"):
        _fail(f"{at}.source: Input tag should be 'base64' or 'url'")
    if source["type"] == "base64":
        if source.get("media_type") not in ("image/jpeg", "image/png", "image/gif", "image/webp"):
            _fail(
                f"{at}.source.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"
            )
        if not isinstance(source.get("data"), str) or not source["data"]:
            _fail(f"{at}.source.data: Field required")
        data = _base64(source["data"], at)
        if len(data) > MAX_IMAGE_BYTES:
            _fail(
                f"{at}.source.base64: image exceeds 5 MB maximum: {len(data)} bytes > {MAX_IMAGE_BYTES} bytes"
            )
        declared = source["media_type"]
        actual = _sniff_image(data)
        if actual is None:
            _fail(f"{at}.source.base64.data: Could not process image")
        if actual != declared:
            _fail(f"{at}.source.base64.data: Image does not match the provided media type {declared}")
    elif not isinstance(source.get("url"), str):
        _fail(f"{at}.source.url: Field required")


MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_PDF_BYTES = 32 * 1024 * 1024


def _base64(text: str, at: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        _fail(f"{at}.source.data: Invalid base64 data")


def _sniff_image(data: bytes) -> str | None:
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _check_document(block: dict[str, Any], at: str) -> None:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") not in ("base64", "text", "url"):
        _fail(f"{at}.source: Input tag should be 'base64', 'text' or 'url'")
    if source["type"] == "base64":
        if source.get("media_type") != "application/pdf":
            _fail(f"{at}.source.base64.media_type: Input should be 'application/pdf'")
        data = _base64(str(source.get("data") or ""), at)
        if not data.startswith(b"%PDF-"):
            _fail(f"{at}.source.base64.data: The PDF specified was not valid.")
        if len(data) > MAX_PDF_BYTES:
            _fail(f"{at}.source.base64.data: PDF exceeds the 32 MB maximum")
    elif source["type"] == "text":
        if source.get("media_type") != "text/plain" or not isinstance(source.get("data"), str):
            _fail(f"{at}.source.text: media_type 'text/plain' and data are required")
    elif not isinstance(source.get("url"), str):
        _fail(f"{at}.source.url: Field required")


def _check_tool_use(block: dict[str, Any], at: str) -> None:
    if not isinstance(block.get("id"), str) or not block["id"]:
        _fail(f"{at}.id: Field required")
    if not isinstance(block.get("name"), str) or not block["name"]:
        _fail(f"{at}.name: Field required")
    if not isinstance(block.get("input"), dict):
        _fail(f"{at}.input: Input should be a valid dictionary")


def _check_tool_result(block: dict[str, Any], at: str) -> None:
    if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
        _fail(f"{at}.tool_use_id: Field required")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        _fail(f"{at}.is_error: Input should be a valid boolean")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        _fail(f"{at}.content: Input should be a valid string or a list of content blocks")
    for n, inner in enumerate(content):
        kind = inner.get("type") if isinstance(inner, dict) else None
        if kind == "text":
            _check_text(inner, f"{at}.content.{n}")
        elif kind == "image":
            _check_image(inner, f"{at}.content.{n}")
        else:
            _fail(f"{at}.content.{n}: Input tag '{kind}' does not match the expected tags: 'text', 'image'")


def _blocks_of(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


def _check_tool_pairing(messages: list[Any], i: int) -> None:
    """Checked at each user message, whose content (and the previous one's) is known valid:
    its results answer the previous assistant turn, and that turn's calls are all answered."""
    msg = messages[i]
    if msg["role"] != "user" or i == 0:
        return
    uses = [b["id"] for b in _blocks_of(messages[i - 1], "tool_use")]
    results = [b["tool_use_id"] for b in _blocks_of(msg, "tool_result")]
    stray = [r for r in results if r not in uses]
    if stray:
        _fail(
            f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: "
            f"{', '.join(stray)}. Each `tool_result` block must have a corresponding "
            "`tool_use` block in the previous message."
        )
    if len(results) != len(set(results)):
        _fail(f"messages.{i}.content: each `tool_use` id may be answered by only one `tool_result` block")
    missing = [u for u in uses if u not in results]
    if missing:
        _fail(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )


def _check_cache_controls(body: dict[str, Any]) -> None:
    count = 0
    seen_short = False
    for where, cc in iter_cache_controls(body):
        count += 1
        if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
            _fail(f"{where}.cache_control.type: Input should be 'ephemeral'")
        ttl = cc.get("ttl", "5m")
        if ttl not in _TTLS:
            _fail(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
        if ttl == "5m":
            seen_short = True
        elif seen_short:
            _fail(
                f"{where}.cache_control: a ttl='1h' cache_control block must not come after a "
                "ttl='5m' cache_control block"
            )
    if count > MAX_BREAKPOINTS:
        _fail(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {count}.")
