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

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mnemo.memory.durable import RetryLater
from mnemo.memory.errors import ProviderError
from mnemo.memory.external import ExternalProvider, answer, missing_package
from mnemo.memory.provider import Availability, ProviderContext, Recall, ToolSchema
from mnemo.memory.provider_config import ConfigField, ConfigKind
from mnemo.memory.provider_scope import DEFAULT_AGENT_ID, ProviderScope, safe_id
from mnemo.memory.provider_tools import SharedTools, api_key_field, setting, timeout_field
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

HOSTED_URL = "https://api.honcho.dev"
MAX_TEXT = 8000

CONTEXT = ToolSchema(
    name="honcho_context",
    description="Honcho's representation of the user you are talking to, optionally focused on a query.",
    input_schema={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "optional focus"}},
    },
)


def _default_workspace(home: Path) -> str:
    return safe_id(f"mnemo-{home.name or 'default'}")


class HonchoProvider(ExternalProvider[Any]):
    name = "honcho"
    label = "Honcho"
    description = "Honcho peer memory (hosted or self-hosted): workspace per profile, a peer per user"
    max_text = MAX_TEXT
    shared_tools = SharedTools.standard(
        "honcho",
        "Honcho",
        "Honcho's peer card of the user you are talking to (the key facts it holds about them).",
        conclude=True,
        search="Search the messages Honcho holds from the user you are talking to.",
    )

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._known: set[tuple[str, ...]] = set()  # workspace/peers/sessions already created
        self._workspace = ""

    # --- settings --------------------------------------------------------------------
    def get_config_schema(self) -> Sequence[ConfigField]:
        return (
            api_key_field("Honcho API key (or HONCHO_API_KEY); a self-hosted server may need none"),
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
            timeout_field(),
        )

    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        missing = missing_package("honcho.http", "honcho-ai", "honcho")
        if missing is not None:
            return missing
        if not setting(config, "api_key", "HONCHO_API_KEY") and not setting(
            config, "base_url", "HONCHO_BASE_URL"
        ):
            return Availability(
                False,
                "set api_key (or HONCHO_API_KEY) for the hosted Honcho, or base_url"
                " (HONCHO_BASE_URL) for a self-hosted server",
            )
        return Availability(True)

    def connect(self, home: Path, config: Mapping[str, Any]) -> None:
        self._workspace = safe_id(str(config.get("workspace_id") or _default_workspace(home)))

    def shutdown(self) -> None:
        try:
            if self._client is not None:
                self._client.close()
        except Exception:
            pass

    # --- transport --------------------------------------------------------------------
    def _transport(self) -> Any:
        with self._lock:
            if self._client is None:
                from honcho.http.client import HonchoHTTPClient

                self._client = HonchoHTTPClient(
                    base_url=setting(self._config, "base_url", "HONCHO_BASE_URL", HOSTED_URL).rstrip("/"),
                    api_key=setting(self._config, "api_key", "HONCHO_API_KEY") or None,
                    timeout=self.timeout_s,
                    max_retries=0,  # the job queue retries, with backoff
                )
            return self._client

    def _request(self, what: str, method: str, path: str, **kw: Any) -> Any:
        return self.call(what, lambda: self._transport().request(method, path, **kw))

    def retry_later(self, what: str, error: Exception) -> RetryLater | None:
        if type(error).__name__ == "RateLimitError":
            return RetryLater(f"honcho {what}: rate limited", getattr(error, "retry_after", None))
        return None

    def _ensure(self, scope: ProviderScope) -> str:
        """Get-or-create the workspace, both peers and the session; returns the workspace id."""
        from honcho.http import routes

        ws = self._workspace
        if (ws,) not in self._known:
            self._request("workspace", "POST", routes.workspaces(), body={"id": ws})
            self._known.add((ws,))
        for peer in (scope.user_id, scope.agent_id):
            if (ws, "peer", peer) not in self._known:
                self._request("peer", "POST", routes.peers(ws), body={"id": peer})
                self._known.add((ws, "peer", peer))
        if (ws, "session", scope.session_id, scope.user_id) not in self._known:
            peers = {
                scope.user_id: {"observe_me": True, "observe_others": False},
                scope.agent_id: {"observe_me": False, "observe_others": True},
            }
            self._request(
                "session", "POST", routes.sessions(ws), body={"id": scope.session_id, "peers": peers}
            )
            self._known.add((ws, "session", scope.session_id, scope.user_id))
        return ws

    # --- the API, always with an explicit scope ----------------------------------------
    def add_messages(self, scope: ProviderScope, messages: list[dict[str, Any]]) -> Any:
        from honcho.http import routes

        ws = self._ensure(scope)
        return self._request(
            "messages", "POST", routes.messages(ws, scope.session_id), body={"messages": messages}
        )

    def context(self, scope: ProviderScope, query: str | None) -> tuple[str, list[str]]:
        from honcho.http import routes

        ws = self._ensure(scope)
        q: dict[str, Any] = {"search_top_k": int(self._config.get("search_top_k", 10))}
        if query:
            q["search_query"] = query[:MAX_TEXT]
        body = self._request("context", "GET", routes.peer_context(ws, scope.user_id), query=q)
        if not isinstance(body, Mapping) or body.get("peer_id") != scope.user_id:
            raise ProviderError(f"honcho answered an unexpected context: {str(body)[:200]}")
        card = body.get("peer_card") or []
        return str(body.get("representation") or ""), [str(c) for c in card] if isinstance(card, list) else []

    def card(self, scope: ProviderScope) -> list[str]:
        from honcho.http import routes

        ws = self._ensure(scope)
        body = self._request("card", "GET", routes.peer_card(ws, scope.user_id))
        if not isinstance(body, Mapping):
            raise ProviderError(f"honcho answered an unexpected card: {str(body)[:200]}")
        return [str(c) for c in body.get("peer_card") or []]

    def search(self, query: str, scope: ProviderScope, limit: int) -> list[str]:
        from honcho.http import routes

        ws = self._ensure(scope)
        body = self._request(
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
        return self._request("conclude", "POST", routes.conclusions(ws), body={"conclusions": [item]})

    def _pages(self, what: str, method: str, path: str, body: Any = None) -> list[Mapping[str, Any]]:
        """Every item of a paginated list (``{"items": […], "pages": n}``)."""
        items: list[Mapping[str, Any]] = []
        page = 1
        while True:
            data = self._request(what, method, path, body=body, query={"page": page, "size": 100})
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
                self._request("delete session", "DELETE", routes.session(ws, sid))
        about = self._pages(
            "conclusions", "POST", routes.conclusions_list(ws), body={"filters": {"observed_id": peer}}
        )
        for conclusion in about:
            self._request("delete conclusion", "DELETE", routes.conclusion(ws, str(conclusion.get("id"))))
        self._request("card", "PUT", routes.peer_card(ws, peer), body={"peer_card": []})
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
        return self._request("dream", "POST", routes.workspace_schedule_dream(ws), body=body)

    # --- per turn ---------------------------------------------------------------------
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        scope = self.scope(ctx)
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

    def profile(self, scope: ProviderScope) -> Mapping[str, Any]:
        return {"card": self.card(scope)}

    # --- writes -----------------------------------------------------------------------
    def send(self, write: ProviderWrite) -> None:
        scope = write.scope
        match write.operation:
            case SyncTurn(user=user, assistant=assistant):
                meta = {"mnemo_key": write.key, "mnemo_op": label(write.operation)}
                messages: list[dict[str, Any]] = [
                    {"peer_id": peer, "content": text[:MAX_TEXT], "metadata": meta}
                    for peer, text in ((scope.user_id, user), (scope.agent_id, assistant))
                    if text[:MAX_TEXT].strip()
                ]
                if messages:
                    self.add_messages(scope, messages)
            case MirrorWrite(content=content) | Remember(content=content):
                self.conclude(scope, content)
            case SessionEnd(messages=said) | PreCompress(messages=said):
                # the messages were synced per turn: consolidate what the user said
                if any(m.role == "user" for m in said):
                    self.dream(scope)
            case _:
                raise ProviderError(f"honcho: cannot send {label(write.operation)}")

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        if operation.kind is WriteOp.TURN:
            if operation.body["messages"]:
                self.add_messages(write.scope, list(operation.body["messages"]))
        elif operation.kind is WriteOp.MEMORY:
            self.conclude(write.scope, str(operation.body["conclusion"]))
        else:
            self.dream(write.scope)

    # --- tools ------------------------------------------------------------------------
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        tools = self.shared_tools
        assert tools is not None
        return (tools.profile, tools.search, CONTEXT, tools.write)

    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        scope = self.scope(ctx)
        if scope is not None and name == CONTEXT.name:
            query = args.get("query")
            representation, card = self.context(
                scope, query if isinstance(query, str) and query.strip() else None
            )
            return answer(representation=representation, card=card)
        return super().handle_tool_call(name, args, ctx)
