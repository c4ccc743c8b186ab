"""The dashboard's memory proposals: what waits for a decision, for admins.

    GET  /admin/memory/proposals             every open proposal, newest first
    POST /admin/memory/proposals             accept or reject one (fields ``entry``, ``decision``)

Consolidation (``memory.consolidation``) and ``remember: ask`` propose; nothing changes
until someone accepts. An accepted proposal is written through the file's normal write
path (threat scan, character limit), journaled as the admin's; a rejected one is kept
as rejected, so consolidation does not propose it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from mnemo.adapters.admin.auth import AdminSession
from mnemo.adapters.admin.pages import esc, layout, post_button, table
from mnemo.adapters.admin.ports import AdminDeps
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import SHARED, Actor, Entry, Provenance, Trust, clip
from mnemo.memory.journal_undo import apply_proposal
from mnemo.memory.scope import UserRef

PATH = "/admin/memory/proposals"
Audit = Callable[..., None]


def _change(e: Entry) -> str:
    if e.op == "add":
        return f"add “{esc(clip(e.new))}”"
    if e.op == "remove":
        return f"forget <del>{esc(clip(e.old))}</del>"
    return f"<del>{esc(clip(e.old))}</del> → {esc(clip(e.new))}"


class ProposalPages:
    def __init__(self, deps: AdminDeps, audit: Audit, html: Callable[[str], web.Response]) -> None:
        self.deps = deps
        self.audit = audit
        self.html = html

    async def _open(self) -> list[Entry]:
        proposals = self.deps.proposals
        if proposals is None:
            return []
        whose = {SHARED}
        for person in await self.deps.reads.people():
            whose.add(person)
            try:  # a linked account's proposals are its person's
                whose.add(self.deps.files.user(UserRef.parse(person)).owner)
            except InvalidIdentifier:
                continue
        return await proposals.proposals(sorted(whose))

    async def page(self, request: web.Request, session: AdminSession) -> web.Response:
        rows = []
        for e in await self._open():
            buttons = "".join(
                post_button(session, PATH, label, {"entry": str(e.id), "decision": decision}, kind=kind)
                for label, decision, kind in (("Accept", "accept", ""), ("Reject", "reject", "danger"))
            )
            whose = "shared notes" if e.target == SHARED else esc(e.target)
            rows.append([f"#{e.id}", whose, _change(e), esc(e.note or ""), esc(e.actor), buttons])
        body = (
            table(["#", "Whose", "Change", "Why", "From", ""], rows)
            if rows
            else '<p class="muted">Nothing waits for a decision.</p>'
        )
        body += (
            '<p class="muted">Proposals come from the nightly consolidation (memory.consolidation) and '
            "from remember: ask. People decide their own with /memory proposals.</p>"
        )
        return self.html(layout("Memory proposals", body, active="memory", session=session))

    async def decide(
        self, request: web.Request, session: AdminSession, form: MultiDictProxy[Any]
    ) -> web.Response:
        text, decision = str(form.get("entry", "")), form.get("decision")
        if not text.isdigit() or decision not in ("accept", "reject") or self.deps.proposals is None:
            raise web.HTTPBadRequest(text="entry must be a proposal number, decision accept or reject\n")
        found = [e for e in await self._open() if e.id == int(text)]
        if not found:
            session.flash.append(("error", f"#{text} waits for no decision."))
            raise web.HTTPSeeOther(location=PATH)
        entry = found[0]
        if decision == "reject":
            await self.deps.proposals.decide(entry.id, False)
            ok, message = True, f"#{entry.id} rejected; it will not be proposed again."
        else:
            done = await asyncio.to_thread(
                apply_proposal, self.deps.files, entry, Provenance(Actor.ADMIN, Trust.ADMIN)
            )
            if done.ok:
                await self.deps.proposals.decide(entry.id, True)
            ok, message = done.ok, (f"#{entry.id} accepted: {done.message}" if done.ok else done.message)
        self.audit(session, f"memory.proposal.{decision}", entry=entry.id, success=ok)
        session.flash.append(("ok" if ok else "error", message))
        raise web.HTTPSeeOther(location=PATH)
