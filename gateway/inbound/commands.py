"""Slash commands, in one place. Every adapter exposes the same set (Telegram's command
menu, Discord's application commands, typed text in the web chat and the console).

Commands run immediately, outside the chat's lane, so ``/stop`` and ``/status`` answer
while a turn is running. Each handler returns the text of the reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mnemo.gateway.events import InboundMessage
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:
    from mnemo.gateway.inbound.pipeline import Gateway

Handler = Callable[["Gateway", InboundMessage, str], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    summary: str
    handler: Handler
    admin_only: bool = False
    aliases: tuple[str, ...] = ()
    takes_args: bool = False  # platforms with typed commands offer one text option


class CommandRouter:
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

    def menu(self) -> list[tuple[str, str]]:
        """(name, summary) for platform command menus; admin commands included."""
        return [(c.name, c.summary) for c in self._commands.values()]

    def commands(self) -> list[Command]:
        return list(self._commands.values())

    async def run(self, gateway: Gateway, msg: InboundMessage, name: str, args: str) -> str:
        command = self._commands[self._names[name]]
        if command.admin_only and not gateway.is_admin(msg):
            return f"/{command.name} is for the bot's admins only."
        return await command.handler(gateway, msg, args)


# --- handlers -----------------------------------------------------------------------


async def _help(gw: Gateway, msg: InboundMessage, args: str) -> str:
    assert isinstance(gw.commands, CommandRouter)
    lines = ["Commands:"]
    admin = gw.is_admin(msg)
    for c in gw.commands.commands():
        if c.admin_only and not admin:
            continue
        lines.append(f"/{c.name} — {c.summary}")
    return "\n".join(lines)


async def _reset(gw: Gateway, msg: InboundMessage, args: str) -> str:
    ended = await gw.reset(msg)
    if ended is None:
        return "Starting fresh — there was no conversation to close."
    return "Started a new conversation. I still remember what is in my memory."


async def _stop(gw: Gateway, msg: InboundMessage, args: str) -> str:
    if gw.lanes.cancel_current(gw.session_key(msg)):
        return "Stopping what I was doing."
    return "Nothing to stop."


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


async def _status(gw: Gateway, msg: InboundMessage, args: str) -> str:
    key = gw.session_key(msg)
    session = await gw.store.active_session(key)
    lines = []
    if session is None:
        lines.append("No conversation yet in this chat.")
    else:
        prompt = session.input_tokens + session.cache_read_tokens + session.cache_write_tokens
        lines += [
            f"Session {session.id} (since {session.started_at:%Y-%m-%d %H:%M} UTC)",
            f"Messages: {session.message_count}, tool calls: {session.tool_call_count}",
            f"Tokens: {prompt:,} in ({session.cache_read_tokens:,} from cache, "
            f"{_pct(session.cache_read_tokens, prompt)} cache hits), {session.output_tokens:,} out",
            f"Estimated cost: ${session.estimated_cost_usd:.4f}",
        ]
    lines.append(f"Queued in this chat: {gw.lanes.queued(key)}" + (" (a reply is in progress)" if gw.lanes.busy(key) else ""))
    if gw.jobs is not None:
        lines.append(await gw.jobs.status_line())
    return "\n".join(lines)


async def _memory(gw: Gateway, msg: InboundMessage, args: str) -> str:
    if not msg.is_dm and not msg.private:
        # A group channel is public: a profile is only ever shown privately.
        return "Your profile is private: use the /memory slash command (shown only to you) or send me a DM."

    def read() -> tuple[str, str]:
        mine = gw.files.user(msg.speaker).load()
        shared = gw.files.shared().load()
        return mine.render_block(), shared.render_block()

    mine, shared = await asyncio.to_thread(read)
    parts = [mine or "Your profile is empty — I haven't saved anything about you yet."]
    if gw.is_admin(msg):
        parts.append(shared or "The shared notes (MEMORY.md) are empty.")
    return "\n\n".join(parts)


async def _forget(gw: Gateway, msg: InboundMessage, args: str) -> str:
    target = args.strip()
    if not target:
        return "Usage: /forget TEXT (removes the entry of your profile containing TEXT) or /forget all"
    user_file = gw.files.user(msg.speaker)
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


async def _search(gw: Gateway, msg: InboundMessage, args: str) -> str:
    if not args.strip():
        return "Usage: /search WORDS"
    if gw.search is None:
        return "Search is not available."
    result = await gw.search.search(args, chat_keys=[gw.session_key(msg)], limit=gw.settings.search.default_limit)
    if not result.sessions:
        return f"Nothing found for “{args.strip()}” in this chat."
    lines = []
    for s in result.sessions:
        lines.append(f"• {s.started_at:%Y-%m-%d}:")
        for hit in s.hits[:3]:
            lines.append(f"   {hit.author or hit.role}: {hit.snippet}")
    return "\n".join(lines)


async def _pair(gw: Gateway, msg: InboundMessage, args: str) -> str:
    words = args.split()
    pairings = gw.access.pairings
    if not words or words[0] == "list":
        pending = await pairings.pending()
        if not pending:
            return "No pending pairing requests."
        return "\n".join(f"{p.code} — {p.user} {p.user_name}".rstrip() for p in pending)
    if words[0] in ("approve", "deny") and len(words) == 2:
        p = await pairings.decide(words[1], words[0] == "approve", by=str(msg.speaker))
        if p is None:
            return f"No pending request with code {words[1]} (codes expire after an hour)."
        return f"{'Approved' if p.state == 'approved' else 'Denied'} {p.user} {p.user_name}".rstrip() + "."
    if words[0] == "revoke" and len(words) == 2:
        n = await pairings.revoke(UserRef.parse(words[1]))
        return "Revoked." if n else f"{words[1]} was not paired."
    return "Usage: /pair list | /pair approve CODE | /pair deny CODE | /pair revoke PLATFORM:ID"


def default_commands(cron: Handler | None = None) -> CommandRouter:
    """The built-in commands; ``cron`` is the ``/cron`` handler (``gateway.cron_tool``),
    present when the app has a job store."""
    router = CommandRouter()
    router.add(Command("help", "list the commands", _help, aliases=("start",)))
    router.add(Command("reset", "start a new conversation", _reset, aliases=("new",)))
    router.add(Command("stop", "stop the reply in progress", _stop))
    router.add(Command("status", "session, tokens, cache hits and cost", _status))
    router.add(Command("memory", "show what I remember about you", _memory))
    router.add(Command("forget", "remove an entry of your profile (/forget all clears it)", _forget, takes_args=True))
    router.add(Command("search", "search this chat's past conversations", _search, takes_args=True))
    router.add(Command("pair", "approve or deny pairing requests", _pair, admin_only=True, takes_args=True))
    if cron is not None:
        router.add(Command("cron", "scheduled jobs: list, add, pause, resume, remove", cron, takes_args=True))
    return router
