"""Wire conventions of the fake Discord's REST API: JSON responses, Discord's error
bodies, and the request keys carrying the parsed body to the route handlers.

Discord answers errors with ``{"code": <JSON error code>, "message": ..., "errors": ...}``;
discord.py turns that into ``HTTPException.status`` / ``.code`` / ``.text``. Responses
are ``Content-Type: application/json`` exactly: discord.py parses JSON only on that exact
header value (``web.Response(text=...)`` would append ``; charset=utf-8`` and discord.py
would hand the caller a str).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

# Set by the server's middleware before any route handler runs: the parsed JSON body
# ({} when there is none; a list for bulk command overwrites) and attached file names.
BODY: web.RequestKey[Any] = web.RequestKey("discord_body", object)
FILES: web.RequestKey[tuple[str, ...]] = web.RequestKey("discord_files", tuple)


class ApiError(Exception):
    """Raised inside a route handler; the server turns it into Discord's error JSON."""

    def __init__(self, status: int, code: int, message: str, errors: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.errors = status, code, message, errors

    def response(self) -> web.Response:
        body: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors is not None:
            body["errors"] = self.errors
        return json_response(body, status=self.status)


def invalid_form(field: str, code: str, message: str) -> ApiError:
    """400 / 50035 "Invalid Form Body" naming the offending field."""
    errors = {field: {"_errors": [{"code": code, "message": message}]}}
    return ApiError(400, 50035, "Invalid Form Body", errors)


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    # body= (bytes) keeps the header at exactly "application/json".
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )
