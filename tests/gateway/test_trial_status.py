"""``/status`` in local trial mode: the replies are scripted by the in-process emulator,
so no dollar cost is shown — a cost there would read as if Claude had been paid for."""

from __future__ import annotations

from pathlib import Path

from mnemo.app import open_app
from tests.gateway.conftest import make_settings
from tests.support.loopback import LoopbackAdapter


async def test_status_in_trial_mode_says_scripted_replies_cost_nothing(home: Path) -> None:
    adapter = LoopbackAdapter()
    async with open_app(make_settings(home), adapters=[adapter], trial=True) as app:
        assert app.trial
        await adapter.say("hello")
        await adapter.wait_sent(1)
        await adapter.say("/status")
        status = (await adapter.wait_sent(2))[1].text
    assert status.startswith("Session "), status
    assert "scripted replies cost nothing" in status
    assert "$" not in status


async def test_usage_in_trial_mode_agrees_with_status_scripted_replies_cost_nothing(home: Path) -> None:
    adapter = LoopbackAdapter()
    async with open_app(make_settings(home), adapters=[adapter], trial=True) as app:
        await adapter.say("hello")
        await adapter.wait_sent(1)
        await adapter.say("/usage")
        usage = (await adapter.wait_sent(2))[1].text
        session = await app.store.active_session("loop:dm:u1")
    assert "Today: $0.0000" in usage and "This month: $0.0000" in usage, usage
    assert "Scripted replies cost nothing" in usage
    assert session is not None and session.estimated_cost_usd == 0.0
