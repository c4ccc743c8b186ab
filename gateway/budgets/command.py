"""``/usage``: the person's spend today and this month against their caps."""

from __future__ import annotations

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.commands import Command, CommandCall


def usage_command(gate: BudgetGate) -> Command:
    async def usage(call: CommandCall) -> str:
        return await gate.report(call.msg.speaker, admin=call.admin)

    return Command("usage", "your spend today and this month against your budget", usage)
