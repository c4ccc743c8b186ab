"""HonchoProvider: Honcho's v3 API (hosted or self-hosted) through the official ``honcho-ai`` SDK.

Mapping (``memory.provider_scope``): one Honcho *workspace* per mnemo profile (setting
``workspace_id``, default ``mnemo-<profile folder name>``), one *peer* per user
(``telegram:42``) and one for the bot (setting ``agent_id``), one Honcho *session* per
mnemo session. Every call names the workspace, the speaker's peer and the session
explicitly; recall and tools read the speaker's peer only.

Transport: the SDK's ``HonchoHTTPClient`` and its route table (``honcho.http``) —
``POST /v3/workspaces``, ``/peers``, ``/sessions`` (get-or-create),
``POST /v3/workspaces/{w}/sessions/{s}/messages``, ``GET …/peers/{p}/context``,
``POST …/peers/{p}/search``, ``GET …/peers/{p}/card``, ``POST …/conclusions``,
``POST …/schedule_dream``. The SDK's own retries are off (``max_retries=0``): the
durable write path (``memory.durable``, the job queue) retries with backoff, and a 429
becomes ``RetryLater`` with the server's ``Retry-After``. ``Authorization: Bearer
<HONCHO_API_KEY>`` when a key is set; a self-hosted server (``HONCHO_BASE_URL``) may run
without one. Nothing is sent at start-up: the client is built on first use.

Writes: each finished turn → the user's and the bot's message in the session (durable,
``metadata.mnemo_key``); a mirrored memory entry → a conclusion of the bot about the
user; session end / pre-compress → a dream (consolidation) of the user's peer scoped
to the session (the messages themselves were already synced per turn).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from mnemo.memory.durable import (
    FORGET_USER,
    DurableWrites,
    ProviderHealth,
    RetryLater,
    forget_scope,
    write_key,
)
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import (
    Availability,
    MemoryProvider,
    ProviderContext,
    Recall,
    ToolSchema,
)
from mnemo.memory.provider_config import ConfigField, ConfigKind, provider_dir
from mnemo.memory.provider_scope import (
    DEFAULT_AGENT_ID,
    ProviderScope,
    _safe,
    scope_for,
)
from mnemo.memory.provider_tools import conclude_tool, profile_tool, search_tool, setting

log = structlog.get_logger(__name__)

HOSTED_URL = "https://api.honcho.dev"
MAX_TEXT = 8000

PROFILE = profile_tool(
    "honcho", "Honcho's peer card of the user you are talking to (the key facts it holds about them)."
)
SEARCH = search_tool(
    "honcho", "Honcho", description="Search the messages Honcho holds from the user you are talking to."
)
CONTEXT = ToolSchema(
    name="honcho_context",
    description="Honcho's representation of the user you are talking to, optionally focused on a query.",
    input_schema={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "optional focus"}},
    },
)
CONCLUDE = conclude_tool("honcho", "Honcho")


def _default_workspace(home: Path) -> str:
    return _safe(f"mnemo-{home.name or 'default'}")


class HonchoProvider(DurableWrites, MemoryProvider):
    name = "honcho"
    label = "Honcho"
    description = "Honcho peer memory (hosted or self-hosted): workspace per profile, a peer per user"

    def __init__(self) -> None:
        self._config: Mapping[str, Any] = {}
        self._http: Any = None
        self._lock = threading.Lock()
        self._known: set[tuple[str, ...]] = set()  # workspace/peers/sessions already created
        self._workspace = ""
        self.health = ProviderHealth()

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            ConfigField(
                "api_key",
                "Honcho API key (or HONCHO_API_KEY); a self-hosted server may need none",
                secret=True,
            ),
            ConfigField("base_url", "API base URL (or HONCHO_BASE_URL); empty: the hosted api.honcho.dev"),
            ConfigField("workspace_id", "Honcho workspace of this profile (empty: mnemo-<profile folder>)"),
            ConfigField("agent_id", "the bot's peer id in Honcho", default=DEFAULT_AGENT_ID),
            ConfigField(
                "search_top_k",
                "conclusions recalled per turn",
                ConfigKind.INTEGER,
                10,
                minimum=1,
                maximum=100,
            ),
            ConfigField(
                "timeout_s",
                "HTTP timeout per request (seconds)",
                ConfigKind.NUMBER,
                10.0,
                minimum=0.1,
                maximum=300,
            ),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        try:
            import honcho.http  # noqa: F401
        except ImportError:
            return Availability(False, "the honcho-ai package is missing: pip install 'mnemo[honcho]'")
        if not setting(config, "api_key", "HONCHO_API_KEY") and not setting(
            config, "base_url", "HONCHO_BASE_URL"
        ):
            return Availability(
                False,
                "set api_key (or HONCHO_API_KEY) for the hosted Honcho, or base_url"
                " (HONCHO_BASE_URL) for a self-hosted server",
            )
        return Availability(True)

    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._workspace = _safe(str(config.get("workspace_id") or _default_workspace(home)))
        self.health = ProviderHealth(provider_dir(home, self.name))

    def shutdown(self) -> None:
        try:
            if self._http is not None:
                self._http.close()
        except Exception:
            pass

    def backup_paths(self, home: Path) -> Sequence[Path]:
        return ()  # peers, sessions and conclusions live on the Honcho server

    # --- transport --------------------------------------------------------------------
    def _client(self) -> Any:
        with self._lock:
            if self._http is None:
                from honcho.http.client import HonchoHTTPClient

                self._http = HonchoHTTPClient(
                    base_url=setting(self._config, "base_url", "HONCHO_BASE_URL", HOSTED_URL).rstrip("/"),
                    api_key=setting(self._config, "api_key", "HONCHO_API_KEY") or None,
                    timeout=float(self._config.get("timeout_s", 10.0)),
                    max_retries=0,  # the job queue retries, with backoff
                )
            return self._http

    def _call(self, what: str, method: str, path: str, **kw: Any) -> Any:
        """One API call with health bookkeeping; rate limits become ``RetryLater``."""
        try:
            result = self._client().request(method, path, **kw)
        except Exception as e:
            self.health.failed(e)
            if type(e).__name__ == "RateLimitError":
                raise RetryLater(f"honcho {what}: rate limited", getattr(e, "retry_after", None)) from e
            raise
        self.health.ok()
        return result

    def _ensure(self, scope: ProviderScope) -> str:
        """Get-or-create the workspace, both peers and the session; returns the workspace id."""
        from honcho.http import routes

        ws = self._workspace
        if (ws,) not in self._known:
            self._call("workspace", "POST", routes.workspaces(), body={"id": ws})
            self._known.add((ws,))
        for peer in (scope.user_id, scope.agent_id):
            if (ws, "peer", peer) not in self._known:
                self._call("peer", "POST", routes.peers(ws), body={"id": peer})
                self._known.add((ws, "peer", peer))
        if (ws, "session", scope.session_id, scope.user_id) not in self._known:
            peers = {
                scope.user_id: {"observe_me": True, "observe_others": False},
                scope.agent_id: {"observe_me": False, "observe_others": True},
            }
            self._call("session", "POST", routes.sessions(ws), body={"id": scope.session_id, "peers": peers})
            self._known.add((ws, "session", scope.session_id, scope.user_id))
        return ws

    # --- the API, always with an explicit scope ----------------------------------------
    def add_messages(self, scope: ProviderScope, messages: list[dict[str, Any]]) -> Any:
        from honcho.http import routes

        ws = self._ensure(scope)
        return self._call(
            "messages", "POST", routes.messages(ws, scope.session_id), body={"messages": messages}
        )

    def context(self, scope: ProviderScope, query: str | None) -> tuple[str, list[str]]:
        from honcho.http import routes

        ws = self._ensure(scope)
        q: dict[str, Any] = {"search_top_k": int(self._config.get("search_top_k", 10))}
        if query:
            q["search_query"] = query[:MAX_TEXT]
        body = self._call("context", "GET", routes.peer_context(ws, scope.user_id), query=q)
        if not isinstance(body, Mapping) or body.get("peer_id") != scope.user_id:
            raise ProviderError(f"honcho answered an unexpected context: {str(body)[:200]}")
        card = body.get("peer_card") or []
        return str(body.get("representation") or ""), [str(c) for c in card] if isinstance(card, list) else []

    def card(self, scope: ProviderScope) -> list[str]:
        from honcho.http import routes

        ws = self._ensure(scope)
        body = self._call("card", "GET", routes.peer_card(ws, scope.user_id))
        if not isinstance(body, Mapping):
            raise ProviderError(f"honcho answered an unexpected card: {str(body)[:200]}")
        return [str(c) for c in body.get("peer_card") or []]

    def search(self, scope: ProviderScope, query: str, limit: int) -> list[str]:
        from honcho.http import routes

        ws = self._ensure(scope)
        body = self._call(
            "search",
            "POST",
            routes.peer_search(ws, scope.user_id),
            body={"query": query[:MAX_TEXT], "filters": None, "limit": limit},
        )
        if not isinstance(body, list):
            raise ProviderError(f"honcho answered an unexpected search body: {str(body)[:200]}")
        return [
            str(m["content"])
            for m in body
            if isinstance(m, Mapping)
            and m.get("peer_id") == scope.user_id
            and isinstance(m.get("content"), str)
        ]

    def conclude(self, scope: ProviderScope, text: str) -> Any:
        from honcho.http import routes

        ws = self._ensure(scope)
        item = {
            "observer_id": scope.agent_id,
            "observed_id": scope.user_id,
            "content": text[:MAX_TEXT],
            "session_id": scope.session_id,
        }
        return self._call("conclude", "POST", routes.conclusions(ws), body={"conclusions": [item]})

    def _pages(self, what: str, method: str, path: str, body: Any = None) -> list[Mapping[str, Any]]:
        """Every item of a paginated list (``{"items": […], "pages": n}``)."""
        items: list[Mapping[str, Any]] = []
        page = 1
        while True:
            data = self._call(what, method, path, body=body, query={"page": page, "size": 100})
            if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
                raise ProviderError(f"honcho answered an unexpected {what} page: {str(data)[:200]}")
            items += [i for i in data["items"] if isinstance(i, Mapping)]
            if page >= int(data.get("pages") or 1):
                return items
            page += 1

    def forget(self, scope: ProviderScope) -> None:
        """Delete what the workspace holds of the user: the sessions only they (and the
        bot) take part in, with their messages; every conclusion about them; their peer
        card. A peer the workspace never saw is already forgotten."""
        from honcho.http import routes
        from honcho.http.exceptions import NotFoundError

        ws, peer = self._workspace, scope.user_id
        bot = str(self._config.get("agent_id") or DEFAULT_AGENT_ID)
        try:
            sessions = self._pages("sessions", "POST", routes.peer_sessions_list(ws, peer))
        except NotFoundError:
            self.health.ok()
            return
        for session in sessions:
            sid = str(session.get("id"))
            members = {
                str(p.get("id")) for p in self._pages("session peers", "GET", routes.session_peers(ws, sid))
            }
            if members <= {peer, bot}:
                self._call("delete session", "DELETE", routes.session(ws, sid))
        about = self._pages(
            "conclusions", "POST", routes.conclusions_list(ws), body={"filters": {"observed_id": peer}}
        )
        for conclusion in about:
            self._call("delete conclusion", "DELETE", routes.conclusion(ws, str(conclusion.get("id"))))
        self._call("card", "PUT", routes.peer_card(ws, peer), body={"peer_card": []})
        self._known = {k for k in self._known if peer not in k}

    def dream(self, scope: ProviderScope) -> Any:
        from honcho.http import routes

        ws = self._ensure(scope)
        body = {
            "observer": scope.user_id,
            "observed": scope.user_id,
            "session_id": scope.session_id,
            "dream_type": "omni",
        }
        return self._call("dream", "POST", routes.workspace_schedule_dream(ws), body=body)

    # --- per turn ---------------------------------------------------------------------
    def _scope(self, ctx: ProviderContext) -> ProviderScope | None:
        return scope_for(ctx, str(self._config.get("agent_id") or DEFAULT_AGENT_ID))

    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self._scope(ctx)
        if scope is None:
            return Recall("")
        representation, card = self.context(scope, query)
        parts = [f"- {c}" for c in card]
        if representation.strip():
            parts.append(representation.strip())
        if not parts:
            return Recall("")
        return Recall(
            "Honcho knows about this user:\n" + "\n".join(parts),
            len(card) + (1 if representation.strip() else 0),
        )

    def prepare_write(self, op: str, data: Mapping[str, Any], ctx: ProviderContext) -> dict[str, Any] | None:
        scope = self._scope(ctx)
        if scope is None:
            return None
        if op == "turn":
            user, assistant = str(data["user"])[:MAX_TEXT], str(data["assistant"])[:MAX_TEXT]
            key = write_key(op, ctx, user, assistant)
            meta = {"mnemo_key": key, "mnemo_op": op}
            messages = [
                {"peer_id": scope.user_id, "content": user, "metadata": meta},
                {"peer_id": scope.agent_id, "content": assistant, "metadata": meta},
            ]
            return {
                "op": op,
                "key": key,
                "scope": scope.as_dict(),
                "messages": [m for m in messages if m["content"].strip()],
            }
        if op == "memory":
            write = data["write"]
            if write.content is None or (write.owner is not None and str(write.owner) != str(ctx.user)):
                return None  # removals stay with the built-in files; never another user's entry
            text = write.content[:MAX_TEXT]
            return {"op": op, "key": write_key(op, ctx, text), "scope": scope.as_dict(), "conclusion": text}
        if op in ("session_end", "pre_compress"):
            if not any(m.get("role") == "user" for m in data.get("messages") or ()):
                return None
            return {"op": op, "key": write_key(op, ctx, str(len(data["messages"]))), "scope": scope.as_dict()}
        return None

    def apply_write(self, payload: Mapping[str, Any]) -> None:
        if payload["op"] == FORGET_USER:  # erasure: the user's sessions, conclusions and card
            self.forget(forget_scope(payload))
            return
        scope = ProviderScope.from_dict(payload["scope"])
        op = payload["op"]
        if op == "turn":
            if payload["messages"]:
                self.add_messages(scope, list(payload["messages"]))
        elif op == "memory":
            self.conclude(scope, str(payload["conclusion"]))
        elif op in ("session_end", "pre_compress"):
            self.dream(scope)

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        return (PROFILE, SEARCH, CONTEXT, CONCLUDE)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self._scope(ctx)
        if scope is None:
            return json.dumps({"ok": False, "error": "no user in this conversation"})
        if name == "honcho_profile":
            return json.dumps({"ok": True, "card": self.card(scope)}, ensure_ascii=False)
        if name == "honcho_context":
            query = args.get("query")
            representation, card = self.context(
                scope, query if isinstance(query, str) and query.strip() else None
            )
            return json.dumps(
                {"ok": True, "representation": representation, "card": card}, ensure_ascii=False
            )
        if name == "honcho_search":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return json.dumps({"ok": False, "error": "query is required"})
            limit = args.get("limit", 10)
            limit = limit if isinstance(limit, int) and 1 <= limit <= 50 else 10
            return json.dumps({"ok": True, "results": self.search(scope, query, limit)}, ensure_ascii=False)
        if name == "honcho_conclude":
            if not ctx.may_write:
                return json.dumps({"ok": False, "error": "memory is read-only in this context"})
            text = args.get("conclusion")
            if not isinstance(text, str) or not text.strip():
                return json.dumps({"ok": False, "error": "conclusion is required"})
            self.conclude(scope, text)
            return json.dumps({"ok": True})
        return json.dumps({"ok": False, "error": f"unknown tool {name}"})
