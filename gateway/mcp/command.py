"""``/mcp``: the MCP servers from a chat. ``/mcp`` (or ``/mcp list``) shows the
servers the speaker may use and their state (admins see every server); ``/mcp reload``
(admins) reads ``mcp.servers`` again and lists every server's tools, for the
conversations that start after it."""

from __future__ import annotations

from mnemo.gateway.commands import Command, CommandCall
from mnemo.gateway.mcp.hub import McpHub
from mnemo.gateway.turns.audience import may_use

USAGE = "Usage: /mcp [list] — the MCP servers you may use; /mcp reload — admins: fetch their tools again."


class McpCommand:
    def __init__(self, hub: McpHub) -> None:
        self.hub = hub

    async def __call__(self, call: CommandCall) -> str:
        word = call.args.strip().lower()
        if word in ("", "list"):
            return self.list(call)
        if word == "reload":
            if not call.admin:
                return "/mcp reload is for the bot's admins only."
            report = await self.hub.request_reload()
            head = "Reloaded the MCP servers; new conversations (/new) get their tools:"
            return "\n".join([head, *report.lines()])
        return USAGE

    def list(self, call: CommandCall) -> str:
        speaker = call.msg.speaker
        servers = self.hub.report().servers
        if not call.admin:
            allowed = {
                n for n, s in self.hub.settings.servers.items() if may_use(s.allowed, speaker, is_admin=False)
            }
            servers = tuple(s for s in servers if s.name in allowed)
        if not servers:
            return "No MCP servers are set up for you."
        return "\n".join(["MCP servers:", *(f"• {s.line()}" for s in servers)])


def mcp_command(hub: McpHub) -> Command:
    return Command("mcp", "MCP tool servers: list; admins: reload", McpCommand(hub), takes_args=True)
