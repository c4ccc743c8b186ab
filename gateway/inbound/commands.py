"""The command registry and the built-in commands.

One registry feeds dispatch *and* every platform's menu (Telegram's ``setMyCommands``,
Discord's application commands, ``/help``), so a command that works is a command
people can find. What a command is and what its handler gets (``Command``,
``CommandCall``, ``ChatControl``) is the leaf module ``gateway/commands.py``, so the
sub-systems that add commands depend on it and not on this package.

Commands run immediately, outside the chat's lane, so ``/stop`` and ``/status`` answer
while a turn is running. The built-in ones read the stores bound once by the app
(``CommandDeps``). A ``/word`` that is no command gets "unknown command" (never the
model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import TYPE_CHECKING, Protocol

from mnemo.gateway.commands import ChatControl, Command, CommandCall, Handler, Unrecorded
from mnemo.gateway.events import InboundMessage
from mnemo.gateway.inbound.memory_command import MemoryCommand, MemoryStores
from mnemo.gateway.ports import CommandInfo
from mnemo.gateway.search_display import conversations, render_text
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import Actor, Provenance, Trust
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:
    from mnemo.gateway.inbound.access import PairingRepository
    from mnemo.memory.curated import WriteResult
    from mnemo.memory.ports import CuratedRepository, SearchRepository, SessionStorage


class JobStatus(Protocol):
    async def status_line(self) -> str: ...


@dataclass(frozen=True, slots=True)
class CommandDeps:
    """The stores the built-in commands read and write, bound once by the app."""

    store: SessionStorage
    files: CuratedRepository
    pairings: PairingRepository
    search: SearchRepository | None = None
    jobs: JobStatus | None = None
    search_limit: int = 5
    trial: bool = False  # scripted replies: no cost to show
    forget_me: Handler | None = None  # "/forget me": erase the person (gateway/people)
    # ``search.linked_dms``: the chat keys of a person's DMs on their linked accounts,
    # searched with /search from a DM (never from a group) — as the session_search tool.
    linked_dms: Callable[[UserRef], Awaitable[Sequence[str]]] | None = None
    # /memory history, undo, confirm, policy: the journal, proposals and policies
    # (``memory_command.py``); None: /memory only shows the profile.
    memory: MemoryStores | None = None
    timezone: tzinfo | None = None  # gateway.timezone: dates shown in the bot's local time


class CommandRegistry:
    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._names: dict[str, str] = {}

    def add(self, command: Command) -> None:
        for name in (command.name, *command.aliases):
            if name in self._names:
                raise ValueError(f"command /{name} is already defined")
            self._names[name] = command.name
        self._commands[command.name] = command

    def knows(self, name: str) -> bool:
        return name in self._names

    def commands(self) -> list[Command]:
        return list(self._commands.values())

    def infos(self) -> list[CommandInfo]:
        """Every command for platform menus (admin commands included: a menu cannot
        differ per user everywhere; the handler refuses non-admins)."""
        return [c.info for c in self._commands.values()]

    async def run(self, chats: ChatControl, msg: InboundMessage, name: str, args: str) -> str | Unrecorded:
        if name not in self._names:
            return f"Unknown command /{name}. See /help for the commands I know."
        command = self._commands[self._names[name]]
        call = CommandCall(msg, args, chats)
        if command.admin_only and not call.admin:
            return f"/{command.name} is for the bot's admins only."
        return await command.handler(call)


FORGET_ME_SUMMARY = "erase everything I have of you (asks for a confirmation code first)"


def _not_forgotten(target: str, result: WriteResult) -> str:
    """A refused /forget, in words for the person (the result's message is the memory
    tool's, written for the model)."""
    if result.previews:
        return f"“{target}” is in several entries; quote more of the one to remove:\n" + "\n".join(
            f"• {p}" for p in result.previews
        )
    if result.entries is not None and not any(target in e for e in result.entries):
        if not result.entries:
            return f"Nothing to forget: your profile is empty, so nothing contains “{target}”."
        return f"No entry of your profile contains “{target}”. Your entries:\n" + "\n".join(
            f"• {e}" for e in result.entries
        )
    return result.message


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


class BuiltinCommands:
    """The handlers of the built-in commands, bound to the stores they read and to the
    registry (for ``/help``)."""

    def __init__(self, deps: CommandDeps, registry: CommandRegistry) -> None:
        self.deps = deps
        self.registry = registry

    async def help(self, call: CommandCall) -> str:
        lines = ["Commands:"]
        for c in self.registry.commands():
            if c.admin_only and not call.admin:
                continue
            lines.append(f"/{c.name} — {c.summary}")
            if c.name == "forget" and self.deps.forget_me is not None:
                lines.append(f"/forget me — {FORGET_ME_SUMMARY}")
        return "\n".join(lines)

    async def reset(self, call: CommandCall) -> str:
        ended = await call.chats.reset(call.msg)
        if ended is None:
            return "Starting fresh — there was no conversation to close."
        return "Started a new conversation. I still remember what is in my memory."

    async def stop(self, call: CommandCall) -> str:
        if call.chats.stop_turn(call.key):
            return "Stopped."
        return "Nothing to stop."

    async def status(self, call: CommandCall) -> str:
        key = call.key
        session = await self.deps.store.active_session(key)
        lines = []
        if session is None:
            lines.append("No conversation yet in this chat.")
        else:
            prompt = session.input_tokens + session.cache_read_tokens + session.cache_write_tokens
            cost = (
                "Cost: none: scripted replies cost nothing (local trial mode, no Claude requests)"
                if self.deps.trial
                else f"Estimated cost: ${session.estimated_cost_usd:.4f}"
            )
            lines += [
                f"Session {session.id} (since {session.started_at:%Y-%m-%d %H:%M} UTC)",
                f"Messages: {session.message_count}, tool calls: {session.tool_call_count}",
                f"Tokens: {prompt:,} in ({session.cache_read_tokens:,} from cache, "
                f"{_pct(session.cache_read_tokens, prompt)} cache hits), {session.output_tokens:,} out",
                cost,
            ]
        queued, busy = call.chats.queue_state(key)
        lines.append(f"Queued in this chat: {queued}" + (" (a reply is in progress)" if busy else ""))
        if self.deps.jobs is not None:
            lines.append(await self.deps.jobs.status_line())
        return "\n".join(lines)

    async def forget(self, call: CommandCall) -> str | Unrecorded:
        target = call.args.strip()
        if not target:
            return "Usage: /forget TEXT (removes the entry of your profile containing TEXT) or /forget all"
        if target.split()[0].lower() == "me":
            if self.deps.forget_me is None:  # never read as "remove the entry containing 'me'"
                return (
                    "Erasing everything about you is not available on this bot yet (its PostgreSQL "
                    "database is not supported by erasure). Nothing was removed; ask the bot's admin."
                )
            return await self.deps.forget_me(call)
        user_file = self.deps.files.user(call.msg.speaker)
        msg = call.msg
        by = Provenance(
            Actor.PERSON, Trust.STATED, speaker=str(msg.speaker), message=msg.message_id, chat=call.key
        )
        if target.lower() == "all":

            def clear() -> int:
                removed = 0
                for entry in user_file.load().entries:
                    if user_file.remove(entry, by).success:
                        removed += 1
                return removed

            n = await asyncio.to_thread(clear)
            return f"Forgot {n} entr{'y' if n == 1 else 'ies'} of your profile."
        result = await asyncio.to_thread(user_file.remove, target, by)
        if result.success:
            return "Forgotten."
        return _not_forgotten(target, result)

    async def search(self, call: CommandCall) -> str:
        query = call.args.strip()
        if not query:
            return "Usage: /search WORDS"
        search = self.deps.search
        if search is None:
            return "Search is not available."
        keys = [call.key]
        if self.deps.linked_dms is not None and call.msg.is_dm and call.msg.speaker is not None:
            keys += [k for k in await self.deps.linked_dms(call.msg.speaker) if k != call.key]
        result = await search.search(query, chat_keys=keys, limit=self.deps.search_limit)
        # People read a transcript: per conversation, in time order, names not ids, no
        # tool output (gateway/search_display.py; the model's tool renders its own).
        found = conversations(result, me=call.msg.user_id)
        if not found:
            return f"Nothing found for “{query}” in this chat."
        return render_text(found, tz=self.deps.timezone)

    async def pair(self, call: CommandCall) -> str:
        words = call.args.split()
        pairings = self.deps.pairings
        if not words or words[0] == "list":
            pending = await pairings.pending()
            if not pending:
                return "No pending pairing requests."
            return "\n".join(f"{p.code} — {p.user} {p.user_name}".rstrip() for p in pending)
        if words[0] in ("approve", "deny") and len(words) == 2:
            p = await pairings.decide(words[1], words[0] == "approve", by=str(call.msg.speaker))
            if p is None:
                return f"No pending request with code {words[1]} (codes expire after an hour)."
            return (
                f"{'Approved' if p.state == 'approved' else 'Denied'} {p.user} {p.user_name}".rstrip() + "."
            )
        if words[0] == "revoke" and len(words) == 2:
            try:
                user = UserRef.parse(words[1])
            except InvalidIdentifier as e:
                return f"Not a user: {e}. Usage: /pair revoke PLATFORM:ID"
            n = await pairings.revoke(user)
            return "Revoked." if n else f"{words[1]} was not paired."
        return "Usage: /pair list | /pair approve CODE | /pair deny CODE | /pair revoke PLATFORM:ID"


def default_commands(deps: CommandDeps, *, extra: Sequence[Command] = ()) -> CommandRegistry:
    """The built-in commands, then ``extra`` ones the app adds (``/cron`` when it has a
    job store): the same registry serves dispatch, ``/help`` and the platform menus."""
    registry = CommandRegistry()
    builtin = BuiltinCommands(deps, registry)
    registry.add(Command("help", "list the commands", builtin.help, aliases=("start",)))
    registry.add(Command("reset", "start a new conversation", builtin.reset, aliases=("new",)))
    registry.add(Command("stop", "stop the reply in progress", builtin.stop))
    registry.add(Command("status", "session, tokens, cache hits and cost", builtin.status))
    stores = deps.memory or MemoryStores(deps.files)
    registry.add(
        Command(
            "memory",
            "what I remember about you: history, undo, policy",
            MemoryCommand(stores),
            takes_args=True,
        )
    )
    registry.add(
        Command(
            "forget",
            "remove an entry of your profile (/forget all clears it)",
            builtin.forget,
            takes_args=True,
        )
    )
    registry.add(Command("search", "search this chat's past conversations", builtin.search, takes_args=True))
    registry.add(
        Command("pair", "approve or deny pairing requests", builtin.pair, admin_only=True, takes_args=True)
    )
    for command in extra:
        registry.add(command)
    return registry
