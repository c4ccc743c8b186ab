"""The admin dashboard: server-rendered pages under ``/admin`` on mnemo's local HTTP
server (the web chat's ``WebServer``), with a small stylesheet and script from
``static/`` — no build step, nothing from another site.

    GET  /admin/signin, POST /admin/signin, POST /admin/signout
    GET  /admin                      overview: adapters, queues, jobs, provider, cost, chart
    GET  /admin/users, /admin/users/{PLATFORM:ID}     people; one person + their USER.md
    GET  /admin/memory               the shared MEMORY.md
    POST /admin/memory               add / replace / remove an entry (either file)
    GET  /admin/memory/history;      POST /admin/memory/revert   the journal (``journal.py``)
    GET  /admin/sessions, /admin/sessions/{id}, /admin/search
    GET  /admin/skills, /admin/skills/view;  POST /admin/skills/promote|rollback
    GET  /admin/cron;                POST /admin/cron/{id}/pause|resume|run
    GET  /admin/jobs;                POST /admin/jobs/{id}/retry

Nothing but the sign-in form and the two static files answers without a session
(``auth.py``); every POST needs the session's CSRF token. Every write calls what the
CLI and the tools call — ``run_memory_tool``, ``SkillStore``, ``CronJobs``,
``JobQueue.retry`` — and is logged as ``admin_action`` with ``actor="admin"`` and the
session's public label.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from mnemo.adapters.admin import pages
from mnemo.adapters.admin.auth import (
    COOKIE,
    AdminSession,
    Clock,
    Sessions,
    SignInLimiter,
    check_host_and_origin,
    csrf_matches,
    token_matches,
)
from mnemo.adapters.admin.chart import activity_svg
from mnemo.adapters.admin.journal import JournalPages
from mnemo.adapters.admin.pages import badge, cards, esc, href, layout, post_button, seg, table, usd
from mnemo.adapters.admin.ports import AdminDeps
from mnemo.adapters.admin.proposals import ProposalPages
from mnemo.gateway.cron.service import Caller, job_summary
from mnemo.gateway.cron.store import JobSource
from mnemo.gateway.errors import CronError
from mnemo.gateway.jobs.store import JobState
from mnemo.gateway.logs import get_logger
from mnemo.gateway.search_display import Line, conversations
from mnemo.gateway.webserver import WebServer, is_loopback
from mnemo.memory.errors import InvalidIdentifier, InvalidSearchQuery
from mnemo.memory.journal import Actor
from mnemo.memory.memory_tool import MemoryCallContext, WriteAttempts, run_memory_tool
from mnemo.memory.ports import CuratedDocument
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.skills import SkillRefused

log = get_logger(__name__)

ACTOR = "admin"
CHART_DAYS = 14
_STATIC = {"admin.css": "text/css", "admin.js": "application/javascript"}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on a
    # form POST, which the origin check must refuse. No URL here carries a secret.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request, AdminSession], Awaitable[web.StreamResponse]]
WriteHandler = Callable[[web.Request, AdminSession, MultiDictProxy[Any]], Awaitable[web.StreamResponse]]


def _asset(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=_HEADERS)


def _back(location: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(location=location, headers=_HEADERS)


class AdminDashboard:
    def __init__(
        self, server: WebServer, deps: AdminDeps, *, token: str | None, clock: Clock = time.monotonic
    ) -> None:
        self.deps = deps
        self._token = token
        self._loopback_bind = is_loopback(server.settings.host)
        self.sessions = Sessions(clock)
        self.limiter = SignInLimiter(clock)
        self._assets = {name: _asset(name) for name in _STATIC}
        get, post = server.add_get, server.add_post
        get("/admin/static/{name}", self._static)
        get("/admin/signin", self._signin_form)
        post("/admin/signin", self._signin)
        post("/admin/signout", self._write(self._signout))
        get("/admin", self._page(self._overview))
        get("/admin/users", self._page(self._users))
        get("/admin/users/{user}", self._page(self._user))
        get("/admin/memory", self._page(self._memory))
        post("/admin/memory", self._write(self._memory_write))
        journal = JournalPages(deps, self._audit, _html)
        get("/admin/memory/history", self._page(journal.history))
        post("/admin/memory/revert", self._write(journal.revert))
        proposals = ProposalPages(deps, self._audit, _html)
        get("/admin/memory/proposals", self._page(proposals.page))
        post("/admin/memory/proposals", self._write(proposals.decide))
        get("/admin/sessions", self._page(self._sessions))
        get("/admin/sessions/{session_id}", self._page(self._transcript))
        get("/admin/search", self._page(self._search))
        get("/admin/skills", self._page(self._skills))
        get("/admin/skills/view", self._page(self._skill_view))
        post("/admin/skills/{verb:promote|rollback}", self._write(self._skill_write))
        get("/admin/cron", self._page(self._cron))
        post("/admin/cron/{job_id}/{verb:pause|resume|run}", self._write(self._cron_write))
        get("/admin/jobs", self._page(self._jobs))
        post("/admin/jobs/{job_id:[0-9]+}/retry", self._write(self._job_retry))

    # --- access ------------------------------------------------------------------------
    def _session(self, request: web.Request) -> AdminSession | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def _page(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            check_host_and_origin(request, loopback_bind=self._loopback_bind)
            session = self._session(request)
            if session is None:
                raise _back("/admin/signin")
            return await handler(request, session)

        return serve

    def _write(self, handler: WriteHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            check_host_and_origin(request, loopback_bind=self._loopback_bind)
            session = self._session(request)
            if session is None:
                raise web.HTTPUnauthorized(text="sign in first: /admin/signin\n", headers=_HEADERS)
            form = await request.post()
            if not csrf_matches(session, form.get("csrf")):
                log.warning("admin_csrf_refused", actor=ACTOR, session=session.label, path=request.path)
                raise web.HTTPForbidden(
                    text="missing or wrong CSRF token: reload the page and try again\n", headers=_HEADERS
                )
            return await handler(request, session, form)

        return serve

    def _audit(self, session: AdminSession, action: str, **fields: Any) -> None:
        log.info("admin_action", actor=ACTOR, session=session.label, action=action, **fields)

    async def _static(self, request: web.Request) -> web.Response:
        check_host_and_origin(request, loopback_bind=self._loopback_bind)
        name = request.match_info["name"]
        if name not in self._assets:
            raise web.HTTPNotFound()
        return web.Response(text=self._assets[name], content_type=_STATIC[name], headers=_HEADERS)

    # --- sign-in -------------------------------------------------------------------------
    def _signin_page(self, message: str | None = None, status: int = 200) -> web.Response:
        note = f'<p class="flash error" role="alert">{esc(message)}</p>' if message else ""
        missing = (
            ""
            if self._token
            else (
                '<p class="flash error" role="alert">No admin token is set: set web.admin_token, or start '
                "<code>mnemo run</code>, which generates one in $MNEMO_HOME/admin_token.</p>"
            )
        )
        body = (
            f"{missing}{note}"
            '<form method="post" action="/admin/signin" class="signin">'
            '<label for="token">Admin token</label>'
            '<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>'
            '<button type="submit">Sign in</button></form>'
        )
        return _html(layout("Sign in", body), status)

    async def _signin_form(self, request: web.Request) -> web.Response:
        check_host_and_origin(request, loopback_bind=self._loopback_bind)
        if self._session(request) is not None:
            raise _back("/admin")
        return self._signin_page()

    async def _signin(self, request: web.Request) -> web.Response:
        check_host_and_origin(request, loopback_bind=self._loopback_bind)
        client = request.remote or "?"
        wait = self.limiter.retry_after(client)
        if wait is not None:
            log.warning("admin_signin_rate_limited", client=client, retry_after_s=wait)
            response = self._signin_page(f"Too many failed sign-ins: try again in {wait} s.", 429)
            response.headers["Retry-After"] = str(wait)
            return response
        form = await request.post()
        given = form.get("token")
        if self._token is None or not isinstance(given, str) or not token_matches(given, self._token):
            self.limiter.failed(client)
            log.warning("admin_signin_failed", client=client)
            return self._signin_page("Wrong admin token.", 401)
        sid, session = self.sessions.open()
        log.info("admin_signed_in", actor=ACTOR, session=session.label, client=client)
        response = web.HTTPSeeOther(location="/admin", headers=_HEADERS)
        response.set_cookie(
            COOKIE, sid, httponly=True, samesite="Strict", path="/admin", secure=request.secure
        )
        raise response

    async def _signout(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        self.sessions.close(request.cookies.get(COOKIE))
        self._audit(session, "signout")
        response = web.HTTPSeeOther(location="/admin/signin", headers=_HEADERS)
        response.del_cookie(COOKIE, path="/admin")
        raise response

    # --- overview ------------------------------------------------------------------------
    async def _overview(self, request: web.Request, session: AdminSession) -> web.Response:
        d = self.deps
        health, counts, days, backup = await asyncio.gather(
            d.health(), d.jobs.counts(), d.reads.daily(CHART_DAYS), d.reads.last_backup()
        )
        adapters = health.get("adapters", {})
        adapter_rows = [
            (esc(name), badge("connected", "ok") if up else badge("not connected", "bad"))
            for name, up in sorted(adapters.items())
        ]
        provider = d.settings.memory.provider
        state = str(health.get("provider", "unknown"))
        provider_html = (
            badge("built-in memory only")
            if not provider
            else f"{esc(provider)} {badge(state, 'ok' if state == 'ok' else 'bad')}"
        )
        today = days[-1] if days else None
        tiles = cards(
            [
                (
                    "Status",
                    badge(str(health.get("status", "?")), "ok" if health.get("status") == "ok" else "bad"),
                ),
                ("Queued messages", esc(health.get("queued_messages", 0))),
                ("Outbox pending", esc(health.get("outbox_pending", 0))),
                ("Outbox failed", esc(health.get("outbox_failed", 0))),
                ("Jobs queued / running", f"{counts.get('queued', 0)} / {counts.get('running', 0)}"),
                ("Jobs failed", f'<a href="/admin/jobs">{counts.get("failed", 0)}</a>'),
                ("Memory provider", provider_html),
                ("Today's cost", usd(today.cost_usd if today else 0.0)),
                ("Today's messages", esc(today.messages if today else 0)),
            ]
        )
        if backup is None:
            backup_html = '<p class="muted">No backup yet (see backup.schedule).</p>'
        else:
            state = badge("verified", "ok") if backup.verified else badge("verification failed", "bad")
            where = _shown_path(Path(backup.path), d.settings.home)
            backup_html = (
                f"<p>{esc(backup.created.strftime('%Y-%m-%d %H:%M UTC'))} · {esc(where)} · "
                f'{backup.size:,} bytes · {state} <span class="muted">{esc(backup.detail)}</span></p>'
            )
        body = (
            tiles
            + "<h2>Adapters</h2>"
            + table(("Adapter", "State"), adapter_rows, empty="No adapter.")
            + f"<h2>Last {CHART_DAYS} days</h2>"
            + activity_svg(days)
            + "<h2>Last backup</h2>"
            + backup_html
        )
        return _html(layout("Overview", body, active="overview", session=session))

    # --- users ---------------------------------------------------------------------------
    async def _users(self, request: web.Request, session: AdminSession) -> web.Response:
        d = self.deps
        await d.links.refresh()  # a link made by another process shows at once
        rows = []
        for person in await d.reads.people():
            try:
                ref = UserRef.parse(person)
            except InvalidIdentifier:
                continue
            spend = await d.budgets.ledger.spend(person)
            upkeep = await d.budgets.ledger.upkeep_spend(person)  # part of the spend, shown apart
            owner = d.links.identities.canonical(ref)
            profile = await d.reads.has_profile(owner)
            rows.append(
                (
                    f'<a href="{href("/admin/users/" + seg(person))}">{esc(person)}</a>'
                    + (" " + badge("admin", "") if d.is_admin(ref.platform, ref.user_id) else ""),
                    ("yes" if profile else "no") + (f" (kept under {esc(owner)})" if owner != ref else ""),
                    usd(spend.day_usd),
                    usd(upkeep.day_usd),
                    usd(spend.month_usd),
                )
            )
        body = table(
            ("Person", "USER.md", "Spend today", "of it upkeep", "Spend this month"),
            rows,
            empty="Nobody yet.",
        )
        return _html(layout("Users", body, active="users", session=session))

    async def _user(self, request: web.Request, session: AdminSession) -> web.Response:
        d = self.deps
        try:
            ref = UserRef.parse(request.match_info["user"])
        except InvalidIdentifier as e:
            raise web.HTTPNotFound(text=f"{e}\n") from None
        person = str(ref)
        admin = d.is_admin(ref.platform, ref.user_id)
        facts = await d.reads.person(ref)
        limits = await d.budgets.limits(ref, admin=admin)
        spend = await d.budgets.ledger.spend(person)
        upkeep = await d.budgets.ledger.upkeep_spend(person)
        own = await d.budgets.ledger.override(person)
        parts = [
            cards(
                [
                    ("Role", "admin" if admin else "user"),
                    ("Sessions", esc(facts.sessions)),
                    ("Messages written", esc(facts.messages)),
                    ("Today", f"{usd(spend.day_usd)} of {_cap(limits.daily_usd, limits.exempt)}"),
                    (
                        "Tokens today",
                        f"{spend.day_tokens:,} of {_cap(limits.daily_tokens, limits.exempt, money=False)}",
                    ),
                    ("This month", f"{usd(spend.month_usd)} of {_cap(limits.monthly_usd, limits.exempt)}"),
                    (
                        "Upkeep today",  # background memory work, part of the spend above
                        f"{usd(upkeep.day_usd)} · {upkeep.day_tokens:,} tokens · {upkeep.requests_today} requests",
                    ),
                    ("Caps", "own" if own else "default"),
                ]
            )
        ]
        await d.links.refresh()
        members = await d.links.members(ref)
        owner = d.links.identities.canonical(ref)
        try:
            profile = d.files.user(ref)  # the person's: the canonical account's when linked
        except InvalidIdentifier as e:  # a symlink in the tree pointing elsewhere
            raise web.HTTPNotFound(text=f"{e}\n", headers=_HEADERS) from None
        parts.append("<h2>USER.md</h2>")
        if owner != ref:
            parts.append(
                f'<p class="muted">{esc(person)} is linked: this is the shared profile of its person, kept under '
                f'<a href="{href("/admin/users/" + seg(str(owner)))}">{esc(owner)}</a>.</p>'
            )
        parts.append(await self._memory_editor(session, profile, target="user", user=person))
        parts.append(
            f'<p><a href="{href("/admin/memory/history", user=person)}">Memory history of {esc(person)}</a>'
            " — every change with where it came from, and revert.</p>"
        )
        others = [m for m in members if m != ref]
        parts.append("<h2>Linked identities</h2>")
        parts.append(
            "<ul>"
            + "".join(
                f'<li><a href="{href("/admin/users/" + seg(str(m)))}">{esc(m)}</a>'
                + (" (keeps the profile)" if m == owner else "")
                + "</li>"
                for m in others
            )
            + "</ul>"
            + '<p class="muted">Linked accounts share this USER.md and budget.</p>'
            if others
            else '<p class="muted">Not linked to another account (/link).</p>'
        )
        sessions = [
            s
            for s in await d.store.list_sessions(None, limit=500)
            if s.platform == ref.platform and s.user_id == ref.user_id
        ]
        parts.append("<h2>Sessions</h2>")
        parts.append(_session_table(sessions))
        return _html(layout(person, "".join(parts), active="users", session=session))

    # --- curated memory ------------------------------------------------------------------
    async def _memory(self, request: web.Request, session: AdminSession) -> web.Response:
        body = await self._memory_editor(session, self.deps.files.shared(), target="memory", user=None)
        body += (
            f'<p><a href="{href("/admin/memory/history")}">Memory history</a> — every memory write '
            "with its provenance (who, from which message, trust), and revert. "
            f'<a href="{href("/admin/memory/proposals")}">Proposals</a> — changes waiting for a decision.</p>'
        )
        return _html(layout("Shared memory (MEMORY.md)", body, active="memory", session=session))

    async def _memory_editor(
        self, session: AdminSession, file: CuratedDocument, *, target: str, user: str | None
    ) -> str:
        snap = await asyncio.to_thread(file.load)
        fields = {"target": target, **({"user": user} if user else {})}
        warn = "".join(f'<p class="flash error">{esc(w)}</p>' for w in snap.warnings)
        usage = (
            f"<p>{snap.chars:,} / {snap.limit:,} characters ({snap.pct}%) "
            f'<meter min="0" max="{snap.limit}" value="{min(snap.chars, snap.limit)}"></meter></p>'
        )
        items = []
        for i, (entry, threat) in enumerate(zip(snap.entries, snap.threats, strict=True)):
            flag = badge(f"blocked from prompts: {threat}", "bad") if threat is not None else ""
            edit = (
                f'<details><summary>Edit</summary><form method="post" action="/admin/memory">'
                f"{pages.csrf_field(session)}"
                + "".join(
                    f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items()
                )
                + '<input type="hidden" name="action" value="replace">'
                f'<input type="hidden" name="old_text" value="{esc(entry)}">'
                f'<label for="entry-{i}">Entry {i + 1}</label>'
                f'<textarea id="entry-{i}" name="content" rows="3">{esc(entry)}</textarea>'
                '<button type="submit">Save</button></form></details>'
            )
            remove = post_button(
                session,
                "/admin/memory",
                "Remove",
                {**fields, "action": "remove", "old_text": entry},
                confirm="Remove this entry?",
                kind="danger",
            )
            items.append(
                f'<li class="entry"><pre>{esc(entry)}</pre>{flag}<div class="actions">{edit}{remove}</div></li>'
            )
        entries = f'<ol class="entries">{"".join(items)}</ol>' if items else '<p class="muted">(empty)</p>'
        add = (
            f'<form method="post" action="/admin/memory" class="add">{pages.csrf_field(session)}'
            + "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items())
            + f'<input type="hidden" name="action" value="add"><label for="new-{esc(target)}">New entry</label>'
            f'<textarea id="new-{esc(target)}" name="content" rows="3" required></textarea>'
            '<button type="submit">Add entry</button></form>'
        )
        note = (
            '<p class="muted">Edits go through the memory tool: the same character limit, threat scan and '
            "results. A session sees a change from its next start.</p>"
        )
        where = _shown_path(file.location, self.deps.settings.home)
        return (
            f'<section class="memory" data-target="{esc(target)}"><p class="muted">{esc(where)}</p>'
            f"{warn}{usage}{entries}{add}{note}</section>"
        )

    async def _memory_write(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        target, action = form.get("target"), form.get("action")
        ref = None
        back = "/admin/memory"
        if target == "user":
            try:
                ref = UserRef.parse(str(form.get("user", "")))
            except InvalidIdentifier as e:
                raise web.HTTPBadRequest(text=f"user: {e}\n") from None
            back = f"/admin/users/{seg(str(ref))}"
        elif target != "memory":
            raise web.HTTPBadRequest(text="target must be 'memory' or 'user'\n")
        args: dict[str, Any] = {"action": action, "target": target}
        for name in ("content", "old_text"):
            value = form.get(name)
            if isinstance(value, str):
                args[name] = value.replace("\r\n", "\n")
        ctx = MemoryCallContext(
            speaker=ref,
            agent_context=AgentContext.PRIMARY,
            is_admin=True,
            shared_write=self.deps.settings.memory.shared_write,
            actor=Actor.ADMIN,
        )
        await self.deps.links.refresh()  # a linked account's edit goes to its person's USER.md
        result = await run_memory_tool(self.deps.files, args, ctx, WriteAttempts())
        self._audit(
            session,
            f"memory.{action}",
            target=target,
            user=str(ref) if ref else None,
            success=result["success"],
            threat=result.get("threat"),
        )
        session.flash.append(("ok" if result["success"] else "error", _write_notice(result)))
        raise _back(back)

    # --- sessions --------------------------------------------------------------------------
    async def _sessions(self, request: web.Request, session: AdminSession) -> web.Response:
        chat = request.query.get("chat") or None
        rows = await self.deps.store.list_sessions(chat, limit=100)
        body = _search_form(await self.deps.reads.chats(), "", chat) + _session_table(rows)
        title = f"Sessions in {chat}" if chat else "Sessions"
        return _html(layout(title, body, active="sessions", session=session))

    async def _transcript(self, request: web.Request, session: AdminSession) -> web.Response:
        store = self.deps.store
        row = await store.get_session(request.match_info["session_id"])
        if row is None:
            raise web.HTTPNotFound(text="no such session\n", headers=_HEADERS)
        messages = await store.load_messages(row.id)
        items = []
        for m in messages:
            when = esc(m.created_at.strftime("%Y-%m-%d %H:%M:%S"))
            if m.role == "tool":
                kind = " (error)" if m.is_error else ""
                items.append(
                    f'<li class="msg tool"><details><summary>tool result · {esc(m.tool_name)}{kind} '
                    f'<span class="muted">{when}</span></summary><pre>{esc(m.content)}</pre></details></li>'
                )
                continue
            calls = "".join(
                f'<details class="call"><summary>tool call · {esc(c.name)}</summary>'
                f"<pre>{esc(json.dumps(dict(c.input), ensure_ascii=False, indent=2))}</pre></details>"
                for c in m.tool_calls
            )
            who = esc(m.author_name or m.author_id or m.role)
            text = f"<pre>{esc(m.content)}</pre>" if m.content else ""
            # The memory history links a write to the platform message it came from.
            anchor = f' id="p-{esc(m.platform_message_id)}"' if m.platform_message_id else ""
            items.append(
                f'<li class="msg {esc(m.role)}"{anchor}><div class="who">{who} <span class="muted">{when} · #{m.id}'
                f"</span></div>{text}{calls}</li>"
            )
        up = row.parent_session_id
        parent = [("Parent", f'<a href="{href("/admin/sessions/" + seg(up))}">{esc(up)}</a>')] if up else []
        # Delegated sub-agents (gateway/turns/delegate.py) are sessions of the same chat.
        delegated = [
            s
            for s in await store.list_sessions(row.chat_key, limit=500)
            if s.parent_session_id == row.id and s.source == "delegate"
        ]
        head = cards(
            [
                ("Chat", f'<a href="{href("/admin/sessions", chat=row.chat_key)}">{esc(row.chat_key)}</a>'),
                *parent,
                ("Source", esc(row.source)),
                ("Started", esc(row.started_at.strftime("%Y-%m-%d %H:%M"))),
                ("State", esc(f"ended ({row.end_reason})" if row.is_ended else "active")),
                ("Messages", esc(row.message_count)),
                ("Cost", usd(row.estimated_cost_usd)),
            ]
        )
        body = head + f'<ol class="transcript">{"".join(items)}</ol>'
        if delegated:
            body += "<h2>Delegated to sub-agents</h2>" + _session_table(delegated)
        return _html(layout(row.title or f"Session {row.id}", body, active="sessions", session=session))

    async def _search(self, request: web.Request, session: AdminSession) -> web.Response:
        query = request.query.get("q", "")
        chat = request.query.get("chat") or None
        chats = await self.deps.reads.chats()
        keys = [chat] if chat else chats
        scope = f"chat {chat}" if chat else f"all chats ({len(chats)})"
        parts = [_search_form(chats, query, chat)]
        if query.strip():
            try:
                result = await self.deps.search.search(query, chat_keys=keys, limit=25)
            except InvalidSearchQuery as e:
                session.flash.append(("error", str(e)))
                result = None
            parts.append(
                f'<p class="scope">Scope: <strong>{esc(scope)}</strong> · '
                f"{len(result.hits) if result else 0} matches</p>"
            )
            # The same readable view as /search and `mnemo sessions search`: per
            # conversation, in time order, names not ids, no tool output.
            for c in conversations(result) if result else ():
                lines = "".join(_hit_line(line) for line in c.lines)
                title = c.title or f"Conversation of {c.started_at:%Y-%m-%d %H:%M}"
                parts.append(
                    f'<section class="hitgroup"><h3><a href="{href("/admin/sessions/" + seg(c.session_id))}">'
                    f"{esc(title)}</a> {badge(c.chat_key, 'scope')}</h3><ul>{lines}</ul></section>"
                )
        return _html(layout("Search", "".join(parts), active="sessions", session=session))

    # --- skills ----------------------------------------------------------------------------
    def _all_skills(self) -> list[tuple[Any, list[int]]]:
        store = self.deps.skills
        found = list(store.shared())
        users = store.root / "users"
        if users.is_dir():
            for folder in sorted(p for p in users.glob("*/*") if p.is_dir()):
                try:
                    found.extend(store.own(UserRef(folder.parent.name, folder.name)))
                except InvalidIdentifier:
                    continue
        return [(s, store.history(s.name, s.owner)) for s in found]

    async def _skills(self, request: web.Request, session: AdminSession) -> web.Response:
        rows = []
        for skill, versions in await asyncio.to_thread(self._all_skills):
            owner = "" if skill.owner is None else str(skill.owner)
            actions = []
            if skill.owner is not None:
                actions.append(
                    post_button(
                        session,
                        "/admin/skills/promote",
                        "Promote to shared",
                        {"name": skill.name, "owner": owner},
                        confirm=f"Promote {skill.name} to the shared skills?",
                    )
                )
            if versions:
                choices = "".join(
                    f'<option value="{n}"{" selected" if n == versions[-1] else ""}>v{n}</option>'
                    for n in reversed(versions)
                )
                actions.append(
                    f'<form method="post" action="/admin/skills/rollback" class="inline" '
                    f'data-confirm="{esc(f"Restore an earlier version of {skill.name}?")}">{pages.csrf_field(session)}'
                    f'<input type="hidden" name="name" value="{esc(skill.name)}">'
                    f'<input type="hidden" name="owner" value="{esc(owner)}">'
                    f'<label class="inline">Version <select name="to">{choices}</select></label>'
                    '<button type="submit">Roll back</button></form>'
                )
            rows.append(
                (
                    f'<a href="{href("/admin/skills/view", name=skill.name, owner=owner)}">{esc(skill.name)}</a>',
                    esc(skill.scope) + (f" · {esc(owner)}" if owner else ""),
                    esc(skill.meta.description),
                    esc(", ".join(map(str, versions)) or "—"),
                    "".join(actions),
                )
            )
        body = table(("Skill", "Scope", "Description", "Kept versions", ""), rows, empty="No skills yet.")
        return _html(layout("Skills", body, active="skills", session=session))

    def _owner(self, text: str | None) -> UserRef | None:
        if not text:
            return None
        try:
            return UserRef.parse(text)
        except InvalidIdentifier as e:
            raise web.HTTPBadRequest(text=f"owner: {e}\n") from None

    async def _skill_view(self, request: web.Request, session: AdminSession) -> web.Response:
        store = self.deps.skills
        owner = self._owner(request.query.get("owner"))
        name = request.query.get("name", "")

        def read() -> tuple[Any, str, list[str], list[int]] | None:
            skills = store.shared() if owner is None else store.own(owner)
            skill = next((s for s in skills if s.name == name), None)
            if skill is None:
                return None
            return skill, store.read(skill), store.files(skill), store.history(name, owner)

        try:
            found = await asyncio.to_thread(read)
        except SkillRefused as e:
            raise web.HTTPBadRequest(text=f"{e.reason}\n") from None
        if found is None:
            raise web.HTTPNotFound(text="no such skill\n", headers=_HEADERS)
        skill, text, files, versions = found
        body = (
            cards(
                [
                    ("Scope", esc(skill.scope) + (f" · {esc(owner)}" if owner else "")),
                    ("Files", esc(", ".join(files) or "SKILL.md only")),
                    ("Kept versions", esc(", ".join(map(str, versions)) or "—")),
                ]
            )
            + f'<h2>SKILL.md</h2><pre class="doc">{esc(text)}</pre>'
        )
        return _html(layout(f"Skill {skill.name}", body, active="skills", session=session))

    async def _skill_write(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        verb = request.match_info["verb"]
        name, owner = str(form.get("name", "")), self._owner(str(form.get("owner", "")) or None)
        store = self.deps.skills
        try:
            if verb == "promote":
                if owner is None:
                    raise SkillRefused("invalid: only a user's own skill can be promoted")
                await asyncio.to_thread(store.promote, name, owner)
                message = f"promoted {name} to the shared skills"
            else:
                to = str(form.get("to", "")).strip()
                if to and not to.isdigit():
                    raise SkillRefused(f"invalid: version {to!r} is not a number")
                n = await asyncio.to_thread(store.rollback, name, owner, int(to) if to else None)
                message = f"{name} restored to version {n}"
        except SkillRefused as e:
            self._audit(
                session, f"skills.{verb}", skill=name, owner=str(owner) if owner else None, success=False
            )
            session.flash.append(("error", e.reason))
        else:
            self._audit(
                session, f"skills.{verb}", skill=name, owner=str(owner) if owner else None, success=True
            )
            session.flash.append(("ok", message))
        raise _back("/admin/skills")

    # --- cron ------------------------------------------------------------------------------
    async def _cron(self, request: web.Request, session: AdminSession) -> web.Response:
        rows = []
        for job in await self.deps.cron.list(_OPERATOR):
            s = job_summary(job)
            actions = []
            if s["state"] == "active":
                actions.append(post_button(session, f"/admin/cron/{seg(job.id)}/pause", "Pause"))
            elif s["state"] == "paused":
                actions.append(post_button(session, f"/admin/cron/{seg(job.id)}/resume", "Resume"))
            actions.append(
                post_button(
                    session, f"/admin/cron/{seg(job.id)}/run", "Run now", confirm=f"Run {job.id} now?"
                )
            )
            rows.append(
                (
                    f"<code>{esc(s['id'])}</code>",
                    esc(s["chat"]),
                    esc(s["schedule"]),
                    esc(s["state"]),
                    esc(s["next_run"] or "—"),
                    esc(s["last_result"] or "—"),
                    f'<span class="prompt">{esc(s["prompt"])}</span>',
                    "".join(actions),
                )
            )
        body = table(
            ("Job", "Chat", "Schedule", "State", "Next run", "Last result", "Prompt", ""),
            rows,
            empty="No scheduled jobs.",
        )
        return _html(layout("Cron", body, active="cron", session=session))

    async def _cron_write(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        job_id, verb = request.match_info["job_id"], request.match_info["verb"]
        cron = self.deps.cron
        try:
            if verb == "run":
                run_id = await cron.request_run(_OPERATOR, job_id)
                message = f"run {run_id} of {job_id} requested: the scheduler takes it at its next poll"
            else:
                await (cron.pause if verb == "pause" else cron.resume)(_OPERATOR, job_id)
                message = f"{verb}d {job_id}"
        except CronError as e:
            self._audit(session, f"cron.{verb}", job=job_id, success=False)
            session.flash.append(("error", str(e)))
        else:
            self._audit(session, f"cron.{verb}", job=job_id, success=True)
            session.flash.append(("ok", message))
        raise _back("/admin/cron")

    # --- jobs ------------------------------------------------------------------------------
    async def _jobs(self, request: web.Request, session: AdminSession) -> web.Response:
        all_jobs = await self.deps.jobs.jobs()
        pending = [j for j in all_jobs if j.state in (JobState.QUEUED, JobState.RUNNING)]
        failed = [j for j in all_jobs if j.state is JobState.FAILED]
        done = sum(1 for j in all_jobs if j.state is JobState.DONE)
        when = _stamp
        pending_rows = [
            (
                esc(j.id),
                esc(j.kind),
                f"<code>{esc(j.session_id)}</code>",
                esc(j.state.value),
                esc(j.attempts),
                esc(when(j.not_before)),
            )
            for j in pending
        ]
        failed_rows = [
            (
                esc(j.id),
                esc(j.kind),
                f"<code>{esc(j.session_id)}</code>",
                esc(j.attempts),
                esc(when(j.finished_at or j.updated_at)),
                f'<pre class="error">{esc(j.error)}</pre>',
                post_button(session, f"/admin/jobs/{j.id}/retry", "Retry"),
            )
            for j in failed
        ]
        body = (
            cards(
                [
                    ("Pending", esc(len(pending))),
                    ("Failed", esc(len(failed))),
                    ("Done (kept 30 days)", esc(done)),
                ]
            )
            + "<h2>Pending</h2>"
            + table(
                ("Job", "Kind", "Session", "State", "Attempts", "Due"), pending_rows, empty="Nothing pending."
            )
            + "<h2>Failed</h2>"
            + table(
                ("Job", "Kind", "Session", "Attempts", "Failed at", "Error", ""),
                failed_rows,
                empty="No failed jobs.",
            )
        )
        return _html(layout("Jobs", body, active="jobs", session=session))

    async def _job_retry(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        job_id = int(request.match_info["job_id"])
        try:
            again = await self.deps.jobs.retry(job_id)
        except ValueError as e:
            self._audit(session, "jobs.retry", job=job_id, success=False)
            session.flash.append(("error", str(e)))
        else:
            self._audit(session, "jobs.retry", job=job_id, new_job=again.id, success=True)
            session.flash.append(("ok", f"job {job_id} queued again as job {again.id}"))
        raise _back("/admin/jobs")


_OPERATOR = Caller.operator(JobSource.ADMIN)


def _shown_path(where: str | Path, home: Path) -> str:
    """A file under the profile as ``$MNEMO_HOME/...``; anything else (a row on
    PostgreSQL, a folder elsewhere) as it is."""
    try:
        return f"$MNEMO_HOME/{Path(where).relative_to(home)}"
    except ValueError:
        return str(where)


def _stamp(epoch: float | None) -> str:
    return "—" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def _cap(value: float | int | None, exempt: bool, *, money: bool = True) -> str:
    if exempt:
        return "no cap (admin)"
    if value is None:
        return "no cap"
    return usd(float(value)) if money else f"{int(value):,}"


def _session_table(rows: Any) -> str:
    return table(
        ("Session", "Chat", "Source", "Started", "Messages", "State", "Cost"),
        [
            (
                f'<a href="{href("/admin/sessions/" + seg(s.id))}">{esc(s.title or s.id)}</a>',
                f'<a href="{href("/admin/sessions", chat=s.chat_key)}">{esc(s.chat_key)}</a>',
                esc(s.source),
                esc(s.started_at.strftime("%Y-%m-%d %H:%M")),
                esc(s.message_count),
                esc(f"ended ({s.end_reason})" if s.is_ended else "active"),
                usd(s.estimated_cost_usd),
            )
            for s in rows
        ],
        empty="No sessions.",
    )


def _write_notice(result: dict[str, Any]) -> str:
    """A memory write's outcome for the admin: the tool's ``message`` is written for the
    model ("do not repeat it", "Current entries are listed") and is shown only for a
    refusal, with the entries it refers to."""
    name = "MEMORY.md" if result["target"] == "memory" else "USER.md"
    usage = f"{name} holds {result['chars']:,}/{result['limit']:,} characters."
    if result["success"]:
        if not result.get("changed"):
            done = "Nothing changed (the entry is already there)."
        elif "replaced" in result:
            done = "Entry replaced."
        elif "removed" in result:
            done = "Entry removed."
        else:
            done = "Entry added."
        return f"{done} {usage}"
    listed = result.get("matches") or result.get("entries")
    if listed:
        return f"{result['message']} " + " · ".join(str(e) for e in listed)
    return str(result["message"])


def _hit_line(line: Line) -> str:
    """``date · speaker: text``; a match of the query is marked."""
    text = f"<mark>{esc(line.text)}</mark>" if line.hit else esc(line.text)
    return (
        f'<li class="{"hit" if line.hit else "context"}"><span class="muted">'
        f"{esc(line.at.strftime('%Y-%m-%d %H:%M'))} · {esc(line.speaker)}:</span> {text}</li>"
    )


def _search_form(chats: list[str], query: str, chat: str | None) -> str:
    options = '<option value="">all chats</option>' + "".join(
        f'<option value="{esc(c)}"{" selected" if c == chat else ""}>{esc(c)}</option>' for c in chats
    )
    return (
        '<form method="get" action="/admin/search" class="search" role="search">'
        f'<label for="q">Search messages</label><input id="q" name="q" type="search" value="{esc(query)}">'
        f'<label for="chat">in</label><select id="chat" name="chat">{options}</select>'
        '<button type="submit">Search</button></form>'
    )
