"""``/usage``: the person's spend today and this month against their caps."""

from __future__ import annotations

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.commands import Command, CommandCall

# Local trial mode prices scripted replies at zero; say why the figures are $0.
TRIAL_NOTE = "Scripted replies cost nothing (local trial mode, no Claude requests)."


def usage_command(gate: BudgetGate, *, trial: bool = False) -> Command:
    async def usage(call: CommandCall) -> str:
        report = await gate.report(call.msg.speaker, admin=call.admin)
        return f"{report}\n{TRIAL_NOTE}" if trial else report

    return Command("usage", "your spend today and this month against your budget", usage)
