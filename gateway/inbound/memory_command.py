"""``/memory``: what the bot remembers about you, its history, undo, and your policy.

    /memory                          your profile (admins: and the shared notes)
    /memory history [N]              your last N memory changes, newest first
    /memory undo [ID]                undo your last change (or the one numbered ID)
    /memory confirm [ID] | reject [ID]   decide what I asked to remember (remember: ask)
    /memory proposals                what waits for your decision (and, admins: for the
                                     shared notes), from remember: ask and consolidation
    /memory proposals accept|reject ID|all
    /memory policy                   what may be remembered about you, and in this chat
    /memory policy remember on|off|ask   for yourself
    /memory policy groups private|shared whether your profile may reach group prompts
    /memory policy chat remember on|off  this chat (the bot's admins)
    /memory policy chat history on|off

A profile and its history are private: in a group they are only shown in an answer
only the author sees (a Discord slash command), otherwise the person is sent to a DM.
"Your" entries are those about you (your profile, your facts, your skills) and those
made in your turns. Undo goes through the same write path as any write, journaled as
the person's own (trust ``stated``) with the entry it undoes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from mnemo.gateway.commands import CommandCall
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.memory.journal import (
    SHARED,
    Actor,
    Entry,
    JournalQuery,
    JournalRepository,
    Layer,
    ProposalRepository,
    Provenance,
    Trust,
    line,
)
from mnemo.memory.journal_undo import apply_proposal, undo
from mnemo.memory.policy import Groups, History, Remember, chat_ref
from mnemo.memory.ports import CuratedRepository
from mnemo.memory.scope import UserRef

DEFAULT_HISTORY = 10
MAX_HISTORY = 50
USAGE = (
    "Usage: /memory · /memory history [N] · /memory undo [ID] · /memory confirm [ID] · "
    "/memory reject [ID] · /memory proposals [accept|reject ID|all] · "
    "/memory policy [remember on|off|ask] [groups private|shared] · "
    "/memory policy chat remember on|off · /memory policy chat history on|off"
)
PRIVATE = "Your profile is private, so I only show it in a direct message: send me /memory there."


@dataclass(frozen=True, slots=True)
class MemoryStores:
    """What ``/memory`` reads and writes, bound once by the app."""

    files: CuratedRepository
    journal: JournalRepository | None = None
    proposals: ProposalRepository | None = None
    policies: MemoryPolicies | None = None
    shared_write: str = "admins"  # ``memory.shared_write``: who may undo shared entries


class MemoryCommand:
    def __init__(self, stores: MemoryStores) -> None:
        self.stores = stores

    async def __call__(self, call: CommandCall) -> str:
        words = call.args.split()
        verb = words[0].lower() if words else ""
        private = call.msg.is_dm or call.msg.private
        if verb == "policy":
            return await self.policy(call, words[1:])
        if verb in ("", "history", "undo", "confirm", "reject", "proposals") and not private:
            return PRIVATE  # a group channel is public
        if verb == "":
            return await self.show(call)
        if verb == "history":
            return await self.history(call, words[1:])
        if verb == "undo":
            return await self.undo(call, words[1:])
        if verb in ("confirm", "reject"):
            return await self.decide(call, words[1:], accept=verb == "confirm")
        if verb == "proposals":
            return await self.proposals(call, words[1:])
        return USAGE

    # --- your profile ---------------------------------------------------------------
    async def show(self, call: CommandCall) -> str:
        blocks = await asyncio.to_thread(self.stores.files.blocks, call.msg.speaker)
        parts = [blocks.user_text or "Your profile is empty — I haven't saved anything about you yet."]
        if call.admin:
            parts.append(blocks.memory_text or "The shared notes (MEMORY.md) are empty.")
        return "\n\n".join(parts)

    def _people(self, user: UserRef) -> tuple[str, ...]:
        """The accounts whose entries are this person's: the account and its profile's owner."""
        owner = self.stores.files.user(user).owner
        return tuple(dict.fromkeys((str(user), owner)))

    # --- history and undo -----------------------------------------------------------
    async def history(self, call: CommandCall, args: Sequence[str]) -> str:
        journal = self.stores.journal
        if journal is None:
            return "No memory history is kept on this bot."
        n = _number(args, DEFAULT_HISTORY)
        if n is None:
            return "Usage: /memory history [N] (N from 1 to 50)"
        entries = await journal.history(
            JournalQuery(people=self._people(call.msg.speaker), limit=min(n, MAX_HISTORY))
        )
        if not entries:
            return "No memory changes about you yet."
        undone = await journal.reverted([e.id for e in entries])
        return "\n".join(
            ["Your memory changes, newest first (/memory undo ID reverts one):"]
            + [line(e, reverted=e.id in undone) for e in entries]
        )

    def _may_undo(self, entry: Entry, call: CommandCall, people: tuple[str, ...]) -> bool:
        if entry.target in people:
            return True
        shared_ok = call.admin or self.stores.shared_write == "all"
        return entry.target == SHARED and entry.speaker in people and shared_ok

    async def undo(self, call: CommandCall, args: Sequence[str]) -> str:
        journal = self.stores.journal
        if journal is None:
            return "No memory history is kept on this bot, so nothing can be undone."
        people = self._people(call.msg.speaker)
        if args:
            entry_id = _number(args, 0)
            if not entry_id:
                return "Usage: /memory undo [ID] (the number from /memory history)"
            entry = await journal.get(entry_id)
            if entry is None or not self._may_undo(entry, call, people):
                return f"#{entry_id} is none of your memory changes (see /memory history)."
            if await journal.reverted([entry.id]):
                return f"#{entry.id} is undone already."
        else:
            found = await self._last_change(journal, call, people)
            if found is None:
                return "Nothing to undo: no memory change of yours is left to revert."
            entry = found
        by = Provenance(
            Actor.PERSON,
            Trust.STATED,
            speaker=str(call.msg.speaker),
            message=call.msg.message_id,
            chat=call.key,
        )
        done = await asyncio.to_thread(undo, self.stores.files, entry, by)
        return done.message if done.ok else f"Not undone: {done.message}"

    async def _last_change(
        self, journal: JournalRepository, call: CommandCall, people: tuple[str, ...]
    ) -> Entry | None:
        entries = await journal.history(JournalQuery(people=people, layer=Layer.CURATED, limit=MAX_HISTORY))
        undone = await journal.reverted([e.id for e in entries])
        for e in entries:
            if e.undoable and e.reverts is None and e.id not in undone and self._may_undo(e, call, people):
                return e
        return None

    # --- proposals (remember: ask, consolidation) ----------------------------------
    def _proposers(self, call: CommandCall) -> tuple[str, ...]:
        """Whose open proposals this person decides: their own, and an admin the shared
        notes' too (a consolidation of MEMORY.md proposes as ``shared``)."""
        people = self._people(call.msg.speaker)
        return (*people, SHARED) if call.admin else people

    async def decide(self, call: CommandCall, args: Sequence[str], *, accept: bool) -> str:
        proposals = self.stores.proposals
        if proposals is None:
            return "Nothing waits for your confirmation."
        open_ = await proposals.proposals(self._people(call.msg.speaker))
        if args:
            wanted = _number(args, 0)
            open_ = [p for p in open_ if p.id == wanted]
        if not open_:
            return (
                "Nothing waits for your confirmation."
                if not args
                else f"#{args[0]} waits for no confirmation."
            )
        return await self._settle(call, proposals, open_[0], accept=accept)

    async def proposals(self, call: CommandCall, args: Sequence[str]) -> str:
        """``/memory proposals [accept|reject ID|all]``: a proposal changes nothing until
        it is accepted; then it is written through the file's normal (scanned, bounded)
        write path. A rejected one is remembered, and consolidation does not make it again."""
        proposals = self.stores.proposals
        if proposals is None:
            return "Nothing waits for your decision."
        open_ = await proposals.proposals(self._proposers(call))
        if not args:
            if not open_:
                return "Nothing waits for your decision."
            return "\n".join(
                ["Waiting for your decision (/memory proposals accept|reject ID or all):"]
                + [proposal_line(p) for p in open_]
            )
        verb = args[0].lower()
        if verb not in ("accept", "reject") or len(args) != 2:
            return "Usage: /memory proposals · /memory proposals accept|reject ID|all"
        if args[1].lower() == "all":
            chosen = open_
        else:
            wanted = _number(args[1:], 0)
            chosen = [p for p in open_ if p.id == wanted]
            if not chosen:
                return f"#{args[1].lstrip('#')} waits for no decision of yours (see /memory proposals)."
        if not chosen:
            return "Nothing waits for your decision."
        answers = [await self._settle(call, proposals, p, accept=verb == "accept") for p in chosen]
        return "\n".join(answers)

    async def _settle(
        self, call: CommandCall, proposals: ProposalRepository, proposal: Entry, *, accept: bool
    ) -> str:
        asked = proposal.actor != Actor.job("consolidation")  # the memory tool's (remember: ask)
        if not accept:
            await proposals.decide(proposal.id, False)
            if asked:
                return f"Dropped: I won't remember “{proposal.new or proposal.old}”."
            return f"#{proposal.id} dropped: {_what(proposal)} will not be done."
        by = Provenance(
            Actor.PERSON,
            Trust.STATED,
            speaker=str(call.msg.speaker),
            session=proposal.session,
            message=proposal.message,
            chat=proposal.chat,
            tool_call=proposal.tool_call,
        )
        done = await asyncio.to_thread(apply_proposal, self.stores.files, proposal, by)
        if not done.ok:
            return f"Not saved: {done.message}" if asked else f"#{proposal.id} not done: {done.message}"
        await proposals.decide(proposal.id, True)
        if proposal.op == "add":
            return f"Saved: “{proposal.new}”."
        if proposal.op == "remove":
            return (
                "Forgotten, as you confirmed."
                if asked
                else f"#{proposal.id} done: forgotten “{proposal.old}”."
            )
        return f"#{proposal.id} done: “{proposal.old}” → “{proposal.new}”."

    # --- policy ---------------------------------------------------------------------
    async def policy(self, call: CommandCall, args: Sequence[str]) -> str:
        policies = self.stores.policies
        if policies is None:
            return "Memory policies are not available on this bot."
        msg = call.msg
        words = [w.lower() for w in args]
        if words[:1] == ["chat"]:
            return await self._chat_policy(call, policies, words[1:])
        remember: Remember | None = None
        groups: Groups | None = None
        for key, value in zip(words[::2], words[1::2], strict=False):
            if key == "remember" and value in ("on", "off", "ask"):
                remember = Remember(value)
            elif key == "groups" and value in ("private", "shared"):
                groups = Groups(value)
            else:
                return USAGE
        if len(words) % 2:
            return USAGE
        if remember is not None or groups is not None:
            await policies.repo.set_person(
                policies.person(msg.speaker), remember=remember, groups=groups, by=str(msg.speaker)
            )
        now = await policies.holding(
            platform=msg.platform, chat_id=msg.chat_id, user=msg.speaker, is_group=not msg.is_dm
        )
        head = "Saved. " if words else ""
        return head + "Memory policy:\n" + "\n".join(f"  {x}" for x in now.lines())

    async def _chat_policy(self, call: CommandCall, policies: MemoryPolicies, words: Sequence[str]) -> str:
        if not call.admin:
            return "Only the bot's admins can set a chat's memory policy."
        remember: Remember | None = None
        history: History | None = None
        if len(words) != 2:
            return USAGE
        key, value = words
        if key == "remember" and value in ("on", "off"):
            remember = Remember(value)
        elif key == "history" and value in ("on", "off"):
            history = History(value)
        else:
            return USAGE
        msg = call.msg
        chat = chat_ref(msg.platform, msg.chat_id)
        await policies.repo.set_chat(chat, remember=remember, history=history, by=str(msg.speaker))
        return f"Saved: this chat's {key} is {value}."


def _what(p: Entry) -> str:
    if p.op == "add":
        return f"saving “{p.new}”"
    if p.op == "remove":
        return f"forgetting “{p.old}”"
    return f"changing “{p.old}” to “{p.new}”"


def proposal_line(p: Entry) -> str:
    """``#12 [shared] forget “…” — duplicate of #3`` (``/memory proposals``, the CLI)."""
    where = " [shared notes]" if p.target == SHARED else ""
    why = f" — {p.note}" if p.note else ""
    return f"#{p.id}{where} {_what(p)}{why}"


def _number(args: Sequence[str], default: int) -> int | None:
    if not args:
        return default
    text = args[0].lstrip("#")
    if not text.isdigit() or not 1 <= int(text) <= 10**12:
        return None
    return int(text)
