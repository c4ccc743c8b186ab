"""Calls to an OpenViking server through the official ``openviking-sdk`` HTTP SDK.

OpenViking is multi-tenant: an *account* holds *users*, and what ``viking://user/…``
means depends on the user a request is made for. mnemo connects with a key that may act
for the users of its account (a root key in trusted mode) and names the user on every
request (``X-OpenViking-Account`` / ``X-OpenViking-User``, the bot as
``X-OpenViking-Actor-Peer``): one SDK client per call, bound to the call's
``ProviderScope`` — the SDK's own advice ("a separate credential-bound client for each
OpenViking user"). There is no default user.

Endpoints used (through the SDK): ``POST /api/v1/search/find`` (recall, inside
``viking://user/memories``), ``POST /api/v1/content/write`` and ``GET
/api/v1/content/read`` (facts and the profile), ``GET /api/v1/sessions/{id}`` (auto
create), ``POST …/messages/batch`` and ``POST …/commit`` (a session's turns and the
server's memory extraction), ``DELETE /api/v1/fs`` and ``DELETE /api/v1/sessions/{id}``
(erasure).

The SDK keeps no ``Retry-After``: a response hook turns 429/503 into ``RetryLater``
before the SDK sees them. SDK and transport errors become ``ProviderError``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx
from openviking_sdk import OpenVikingError, SyncHTTPClient

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider_scope import ProviderScope

MEMORIES = "viking://user/memories"
PROFILE = f"{MEMORIES}/profile.md"
RETRY_CODES = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
_UNSAFE = re.compile(r"[^A-Za-z0-9-]")
_PLATFORM = re.compile(r"[a-z0-9]+")
MAX_TENANT_USER = 128

R = TypeVar("R")


def _escape(text: str) -> str:
    return _UNSAFE.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode("utf-8")), text)


def tenant_user(scope: ProviderScope) -> str:
    """The OpenViking user id of a scope, safe inside a ``viking://`` URI and never
    shared by two mnemo users: ``platform_id`` with every character of the id but
    letters, digits and ``-`` written as ``_xx`` (hex) — ``telegram:42`` →
    ``telegram_42``, ``web:a_b`` → ``web_a_5fb``. (A platform is lowercase letters and
    digits, so the first ``_`` ends it; any other id is ``x-`` and its escaped form; a
    form longer than 128 characters is ``h-`` and the SHA-256 of the id.)"""
    platform, sep, ident = scope.user_id.partition(":")
    if sep and _PLATFORM.fullmatch(platform):
        out = f"{platform}_{_escape(ident)}"
    else:
        out = f"x-{_escape(scope.user_id)}"
    if len(out) > MAX_TENANT_USER:
        out = "h-" + hashlib.sha256(scope.user_id.encode("utf-8", "surrogatepass")).hexdigest()
    return out


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def _raise_for_retry(response: httpx.Response) -> None:
    if response.status_code in (429, 503):
        await response.aclose()
        raise RetryLater(
            f"openviking answered {response.status_code}", _retry_after(response.headers.get("Retry-After"))
        )


class OpenVikingClient:
    def __init__(self, base_url: str, api_key: str, account: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.account = account
        self.timeout_s = timeout_s

    def call(self, what: str, scope: ProviderScope, fn: Callable[[SyncHTTPClient], R]) -> R:
        """``fn`` with an SDK client bound to ``scope``'s user; errors made plain."""
        client = SyncHTTPClient(
            url=self.base_url,
            api_key=self.api_key or None,
            account=self.account,
            user=tenant_user(scope),
            actor_peer_id=scope.agent_id,
            timeout=self.timeout_s,
            profile_enabled=False,
            event_hooks={"response": [_raise_for_retry]},
        )
        client.initialize()
        try:
            return fn(client)
        except RetryLater:
            raise
        except httpx.TimeoutException as e:
            raise ProviderError(f"openviking {what}: timed out after {self.timeout_s} s") from e
        except httpx.HTTPError as e:
            raise ProviderError(f"openviking {what}: {type(e).__name__}: {e}") from e
        except OpenVikingError as e:
            if e.code in RETRY_CODES:
                raise RetryLater(f"openviking {what}: {e.code}: {e}") from e
            raise ProviderError(f"openviking {what}: {e.code}: {e}") from e
        finally:
            client.close()

    # --- the API -----------------------------------------------------------------------
    def find(self, query: str, scope: ProviderScope, *, limit: int) -> list[str]:
        """The user's memories for ``query`` (their abstracts or contents)."""
        result = self.call("find", scope, lambda c: c.find(query=query, target_uri=MEMORIES, limit=limit))
        return memory_texts(result, scope)[:limit]

    def profile(self, scope: ProviderScope) -> str:
        """The profile OpenViking keeps of the user ("" when it has none yet)."""

        def read(c: SyncHTTPClient) -> str:
            try:
                text = c.read(PROFILE)
            except OpenVikingError as e:
                if e.code == "NOT_FOUND":
                    return ""
                raise
            if not isinstance(text, str):
                raise ProviderError(f"openviking read: unexpected body: {str(text)[:200]}")
            return text

        return self.call("read", scope, read)

    def write_fact(self, name: str, content: str, scope: ProviderScope) -> None:
        """One fact file ``viking://user/memories/mnemo/<name>.md``; the same name again
        is the same write (an existing file is left as it is)."""
        uri = f"{MEMORIES}/mnemo/{name}.md"

        def write(c: SyncHTTPClient) -> None:
            try:
                c.write(uri, content, mode="create")
            except OpenVikingError as e:
                if e.code != "ALREADY_EXISTS":
                    raise

        self.call("write", scope, write)

    def add_turns(self, messages: list[dict[str, Any]], scope: ProviderScope) -> None:
        def add(c: SyncHTTPClient) -> None:
            c.get_session(scope.session_id, auto_create=True)
            c.batch_add_messages(scope.session_id, messages)

        self.call("add messages", scope, add)

    def commit(self, scope: ProviderScope) -> None:
        """Close the session's pending messages: the server extracts memories from them."""

        def commit(c: SyncHTTPClient) -> None:
            c.get_session(scope.session_id, auto_create=True)
            c.commit_session(scope.session_id)

        self.call("commit", scope, commit)

    def forget(self, scope: ProviderScope) -> None:
        """Delete the user's memories and sessions."""

        def forget(c: SyncHTTPClient) -> None:
            try:
                c.rm(MEMORIES, recursive=True, wait=True)
            except OpenVikingError as e:
                if e.code != "NOT_FOUND":
                    raise
            sessions = c.list_sessions() or []
            if not isinstance(sessions, list):
                raise ProviderError(f"openviking list sessions: unexpected body: {str(sessions)[:200]}")
            for item in sessions:
                sid = item.get("session_id") if isinstance(item, Mapping) else item
                if isinstance(sid, str) and sid:
                    c.delete_session(sid)

        self.call("forget", scope, forget)


def memory_texts(result: Any, scope: ProviderScope) -> list[str]:
    """The texts of a find result's memories; anything but a result is an error. A
    memory whose URI lies outside the scope's user space (``viking://user/memories…``
    or its canonical ``viking://user/<user>/…``) is dropped, whatever a server adds."""
    if not isinstance(result, Mapping) or not isinstance(result.get("memories"), list):
        raise ProviderError(f"openviking answered an unexpected body: {str(result)[:200]}")
    own = (MEMORIES, f"viking://user/{tenant_user(scope)}/")
    out: list[str] = []
    for item in result["memories"]:
        if not isinstance(item, Mapping):
            continue
        uri = item.get("uri")
        if not isinstance(uri, str) or not uri.startswith(own):
            continue
        text = item.get("content") or item.get("abstract") or item.get("overview")
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return out
