"""The dashboard's memory history: every memory write with its provenance, and revert.

    GET  /admin/memory/history[?user=PLATFORM:ID&layer=L]   the journal, newest first
    POST /admin/memory/revert                               undo one entry (field ``entry``)

Each entry shows when, which layer and whose memory, what changed, who or what wrote it
(actor, trust), and a link to the message it came from in its session's transcript.
Revert goes through the same write path as every write (``memory/journal_undo.py``) and
is journaled as the admin's. With ``user``, the person's memory policy is shown too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from mnemo.adapters.admin.auth import AdminSession
from mnemo.adapters.admin.pages import badge, esc, href, layout, post_button, seg, table
from mnemo.adapters.admin.ports import AdminDeps
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import SHARED, Actor, Entry, JournalQuery, Layer, Provenance, Trust, clip
from mnemo.memory.journal_undo import undo
from mnemo.memory.scope import UserRef

LIMIT = 200
Audit = Callable[..., None]


def _what(e: Entry) -> str:
    old, new = clip(e.old), clip(e.new)
    if e.op == "replace":
        return f"<del>{esc(old)}</del> → {esc(new)}"
    if e.op == "remove":
        return f"<del>{esc(old)}</del>"
    text = new if new is not None else old
    return esc(text or e.note or "")


def _source(e: Entry) -> str:
    if e.session is None:
        return esc(e.chat or "")
    anchor = f"#p-{e.message}" if e.message else ""
    label = f"message {e.message}" if e.message else "session"
    return f'<a href="{href("/admin/sessions/" + seg(e.session))}{esc(anchor)}">{esc(label)}</a>'


class JournalPages:
    def __init__(self, deps: AdminDeps, audit: Audit, html: Callable[[str], web.Response]) -> None:
        self.deps = deps
        self.audit = audit
        self.html = html

    async def history(self, request: web.Request, session: AdminSession) -> web.Response:
        journal = self.deps.journal
        if journal is None:
            return self.html(layout("Memory history", "<p>No journal.</p>", active="memory", session=session))
        user = request.query.get("user") or None
        layer = request.query.get("layer") or None
        if layer is not None and layer not in {str(v) for v in Layer}:
            raise web.HTTPBadRequest(text=f"layer must be one of {', '.join(Layer)}\n")
        people = None
        parts: list[str] = []
        if user is not None:
            try:
                ref = UserRef.parse(user)
            except InvalidIdentifier as bad:
                raise web.HTTPBadRequest(text=f"user: {bad}\n") from None
            people = (str(ref), self.deps.files.user(ref).owner)
            parts.append(await self._policy(ref))
        entries = await journal.history(JournalQuery(people=people, layer=layer, limit=LIMIT))
        undone = await journal.reverted([e.id for e in entries])
        rows = []
        for e in entries:
            state = badge("undone", "muted") if e.id in undone else ""
            revert = (
                post_button(
                    session,
                    "/admin/memory/revert",
                    "Revert",
                    {"entry": str(e.id), "back": request.path_qs},
                    confirm=f"Revert change #{e.id}?",
                )
                if e.undoable and e.id not in undone
                else ""
            )
            whose = "shared" if e.target == SHARED else esc(e.target)
            trust = badge(e.trust, "bad" if e.trust in (Trust.INFERRED, Trust.IMPORTED) else "ok")
            rows.append(
                [
                    f"#{e.id}",
                    esc(e.time.strftime("%Y-%m-%d %H:%M:%S")),
                    esc(e.layer),
                    whose,
                    esc(e.op) + (f" (undoes #{e.reverts})" if e.reverts is not None else ""),
                    _what(e) + state,
                    esc(e.actor) + (f"<br>{esc(e.speaker)}" if e.speaker else ""),
                    trust,
                    _source(e),
                    esc(e.until.strftime("%Y-%m-%d %H:%M") if e.until else ""),
                    revert,
                ]
            )
        head = ["#", "When (UTC)", "Layer", "Whose", "Op", "Change", "Actor", "Trust", "From", "Until", ""]
        parts.append(table(head, rows) if rows else '<p class="muted">No memory writes yet.</p>')
        title = f"Memory history of {user}" if user else "Memory history"
        return self.html(layout(title, "".join(parts), active="memory", session=session))

    async def _policy(self, ref: UserRef) -> str:
        policies = self.deps.policies
        if policies is None:
            return ""
        own = await policies.person(self.deps.files.user(ref).owner)
        defaults = self.deps.settings.memory.policy
        remember = own.remember or f"{defaults.remember} (default)"
        groups = own.groups or f"{defaults.groups} (default)"
        return (
            f'<p class="policy">Memory policy: remember <strong>{esc(remember)}</strong>, '
            f"profile in groups <strong>{esc(groups)}</strong> "
            '<span class="muted">(set with /memory policy or mnemo users policy)</span></p>'
        )

    async def revert(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        journal = self.deps.journal
        back = str(form.get("back") or "/admin/memory/history")
        if not back.startswith("/admin/"):
            back = "/admin/memory/history"
        text = str(form.get("entry", ""))
        if journal is None or not text.isdigit():
            raise web.HTTPBadRequest(text="entry must be a journal entry number\n")
        entry = await journal.get(int(text))
        if entry is None:
            session.flash.append(("error", f"No journal entry #{text}."))
            raise web.HTTPSeeOther(location=back)
        if await journal.reverted([entry.id]):
            session.flash.append(("error", f"#{entry.id} is undone already."))
            raise web.HTTPSeeOther(location=back)
        done = await asyncio.to_thread(undo, self.deps.files, entry, Provenance(Actor.ADMIN, Trust.ADMIN))
        self.audit(session, "memory.revert", entry=entry.id, success=done.ok)
        session.flash.append(("ok" if done.ok else "error", done.message))
        raise web.HTTPSeeOther(location=back)
