"""Slash commands, in one place: one registry feeds dispatch *and* every platform's
menu (Telegram's ``setMyCommands``, Discord's application commands, ``/help``), so a
command that works is a command people can find.

Commands run immediately, outside the chat's lane, so ``/stop`` and ``/status`` answer
while a turn is running. A handler gets one ``CommandCall``: the message, its
arguments, the chat it was typed in (``ChatControl``, a narrow port the pipeline
implements) and the stores commands may read (``CommandDeps``). It returns the text of
the reply. A ``/word`` that is no command gets "unknown command" (never the model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mnemo.gateway.events import InboundMessage
from mnemo.gateway.ports import CommandInfo
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:
    from mnemo.gateway.inbound.access import PairingStore
    from mnemo.memory.search import SessionSearch
    from mnemo.memory.sessions import SessionRow, SessionStore


class ChatControl(Protocol):
    """What a command may do to the chat it was typed in. The pipeline (``Gateway``)
    implements it and passes itself with every call."""

    def session_key(self, msg: InboundMessage) -> str: ...

    def is_admin(self, msg: InboundMessage) -> bool: ...

    async def reset(self, msg: InboundMessage) -> SessionRow | None: ...

    def stop_turn(self, key: str) -> bool: ...

    def queue_state(self, key: str) -> tuple[int, bool]:
        """(messages queued, a turn is running) for one session key."""
        ...


class JobStatus(Protocol):
    async def status_line(self) -> str: ...


@dataclass(frozen=True, slots=True)
class CommandDeps:
    """The stores the built-in commands read and write, bound once by the app."""

    store: SessionStore
    files: MemoryFiles
    pairings: PairingStore
    search: SessionSearch | None = None
    jobs: JobStatus | None = None
    search_limit: int = 5
    trial: bool = False  # scripted replies: no cost to show
    forget_me: Handler | None = None  # "/forget me": erase the person (gateway/people)
    # ``search.linked_dms``: the chat keys of a person's DMs on their linked accounts,
    # searched with /search from a DM (never from a group) — as the session_search tool.
    linked_dms: Callable[[UserRef], Awaitable[Sequence[str]]] | None = None


@dataclass(frozen=True, slots=True)
class CommandCall:
    msg: InboundMessage
    args: str
    chats: ChatControl
    deps: CommandDeps
    registry: CommandRegistry

    @property
    def key(self) -> str:
        return self.chats.session_key(self.msg)

    @property
    def admin(self) -> bool:
        return self.chats.is_admin(self.msg)


Handler = Callable[[CommandCall], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    summary: str
    handler: Handler
    admin_only: bool = False
    aliases: tuple[str, ...] = ()
    takes_args: bool = False  # platforms with typed commands offer one text option

    @property
    def info(self) -> CommandInfo:
        return CommandInfo(self.name, self.summary, takes_args=self.takes_args, admin_only=self.admin_only)


def parse_command(text: str) -> tuple[str, str] | None:
    """``/name@bot args`` → ("name", "args"); None if the text is not a slash command
    (``/usr/bin`` and a lone ``/`` are text)."""
    stripped = text.strip()
    if not stripped.startswith("/") or len(stripped) < 2:
        return None
    head, _, rest = stripped[1:].partition(" ")
    head, _, rest2 = head.partition("\n")
    name = head.split("@", 1)[0].lower()
    if not name or not name.replace("_", "").isalnum() or not name.isascii():
        return None
    return name, " ".join(p for p in (rest2.strip(), rest.strip()) if p)


class CommandRegistry:
    def __init__(self, deps: CommandDeps) -> None:
        self.deps = deps
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

    async def run(self, chats: ChatControl, msg: InboundMessage, name: str, args: str) -> str:
        if name not in self._names:
            return f"Unknown command /{name}. See /help for the commands I know."
        command = self._commands[self._names[name]]
        call = CommandCall(msg, args, chats, self.deps, self)
        if command.admin_only and not call.admin:
            return f"/{command.name} is for the bot's admins only."
        return await command.handler(call)


# --- handlers -----------------------------------------------------------------------


async def _help(call: CommandCall) -> str:
    lines = ["Commands:"]
    for c in call.registry.commands():
        if c.admin_only and not call.admin:
            continue
        lines.append(f"/{c.name} — {c.summary}")
    return "\n".join(lines)


async def _reset(call: CommandCall) -> str:
    ended = await call.chats.reset(call.msg)
    if ended is None:
        return "Starting fresh — there was no conversation to close."
    return "Started a new conversation. I still remember what is in my memory."


async def _stop(call: CommandCall) -> str:
    if call.chats.stop_turn(call.key):
        return "Stopping what I was doing."
    return "Nothing to stop."


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


async def _status(call: CommandCall) -> str:
    key = call.key
    session = await call.deps.store.active_session(key)
    lines = []
    if session is None:
        lines.append("No conversation yet in this chat.")
    else:
        prompt = session.input_tokens + session.cache_read_tokens + session.cache_write_tokens
        cost = (
            "Cost: none: scripted replies cost nothing (local trial mode, no Claude requests)"
            if call.deps.trial
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
    if call.deps.jobs is not None:
        lines.append(await call.deps.jobs.status_line())
    return "\n".join(lines)


async def _memory(call: CommandCall) -> str:
    msg = call.msg
    if not msg.is_dm and not msg.private:
        # A group channel is public: a profile is only ever shown privately.
        return "Your profile is private: use the /memory slash command (shown only to you) or send me a DM."
    files = call.deps.files
    blocks = await asyncio.to_thread(files.blocks, msg.speaker)
    parts = [blocks.user_text or "Your profile is empty — I haven't saved anything about you yet."]
    if call.admin:
        parts.append(blocks.memory_text or "The shared notes (MEMORY.md) are empty.")
    return "\n\n".join(parts)


async def _forget(call: CommandCall) -> str:
    target = call.args.strip()
    if not target:
        return "Usage: /forget TEXT (removes the entry of your profile containing TEXT) or /forget all"
    if target.split()[0].lower() == "me":
        if call.deps.forget_me is None:  # never read as "remove the entry containing 'me'"
            return (
                "Erasing everything about you is not available on this bot yet (its PostgreSQL "
                "database is not supported by erasure). Nothing was removed; ask the bot's admin."
            )
        return await call.deps.forget_me(call)
    user_file = call.deps.files.user(call.msg.speaker)
    if target.lower() == "all":

        def clear() -> int:
            removed = 0
            for entry in user_file.load().entries:
                if user_file.remove(entry).success:
                    removed += 1
            return removed

        n = await asyncio.to_thread(clear)
        return f"Forgot {n} entr{'y' if n == 1 else 'ies'} of your profile."
    result = await asyncio.to_thread(user_file.remove, target)
    return "Forgotten." if result.success else result.message


async def _search(call: CommandCall) -> str:
    query = call.args.strip()
    if not query:
        return "Usage: /search WORDS"
    search = call.deps.search
    if search is None:
        return "Search is not available."
    keys = [call.key]
    if call.deps.linked_dms is not None and call.msg.is_dm and call.msg.speaker is not None:
        keys += [k for k in await call.deps.linked_dms(call.msg.speaker) if k != call.key]
    result = await search.search(query, chat_keys=keys, limit=call.deps.search_limit)
    if not result.sessions:
        return f"Nothing found for “{query}” in this chat."
    lines = []
    for s in result.sessions:
        # People read what was said; tool output (JSON) is for the model's own search.
        said = [hit for hit in s.hits if hit.role in ("user", "assistant")][:3]
        if said:
            lines.append(f"• {s.started_at:%Y-%m-%d}:")
            lines += [f"   {hit.speaker}: {hit.snippet}" for hit in said]
    return "\n".join(lines) if lines else f"Nothing found for “{query}” in this chat."


async def _pair(call: CommandCall) -> str:
    words = call.args.split()
    pairings = call.deps.pairings
    if not words or words[0] == "list":
        pending = await pairings.pending()
        if not pending:
            return "No pending pairing requests."
        return "\n".join(f"{p.code} — {p.user} {p.user_name}".rstrip() for p in pending)
    if words[0] in ("approve", "deny") and len(words) == 2:
        p = await pairings.decide(words[1], words[0] == "approve", by=str(call.msg.speaker))
        if p is None:
            return f"No pending request with code {words[1]} (codes expire after an hour)."
        return f"{'Approved' if p.state == 'approved' else 'Denied'} {p.user} {p.user_name}".rstrip() + "."
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
    registry = CommandRegistry(deps)
    registry.add(Command("help", "list the commands", _help, aliases=("start",)))
    registry.add(Command("reset", "start a new conversation", _reset, aliases=("new",)))
    registry.add(Command("stop", "stop the reply in progress", _stop))
    registry.add(Command("status", "session, tokens, cache hits and cost", _status))
    registry.add(Command("memory", "show what I remember about you", _memory))
    registry.add(
        Command("forget", "remove an entry of your profile (/forget all clears it)", _forget, takes_args=True)
    )
    registry.add(Command("search", "search this chat's past conversations", _search, takes_args=True))
    registry.add(Command("pair", "approve or deny pairing requests", _pair, admin_only=True, takes_args=True))
    for command in extra:
        registry.add(command)
    return registry
