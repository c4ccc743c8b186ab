"""``mnemo users``: list, show, usage sorted by spend, per-person caps the running
pipeline obeys, and erase refusing without confirmation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.emulator import Reply
from tests.support.loopback import LoopbackAdapter

QUIET = {"access.rate_limit_per_minute": 0}


async def users(home: Path, *argv: str) -> int:
    return await asyncio.to_thread(main, ["--home", str(home), "users", *argv])


async def say(app, adapter: LoopbackAdapter, text: str, **kw) -> None:
    await adapter.say(text, **kw)
    await app.gateway.lanes.drain(30)
    await app.gateway.delivery.deliver_due()


async def test_budget_override_is_obeyed_and_usage_lists_everyone_by_spend(
    app_factory, emulator, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.default = lambda req: Reply(text="fine")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET) as app:
        for text in ("one", "two", "three"):
            await say(app, adapter, text, user="big")
        await say(app, adapter, "hello", user="small")
    capsys.readouterr()
    assert await users(home, "usage", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["user"] for r in rows] == ["loop:big", "loop:small"]
    assert rows[0]["month_usd"] > rows[1]["month_usd"] > 0

    assert await users(home, "budget", "loop:big", "--daily-usd", "0.000001", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["limits"]["daily_usd"] == 0.000001 and shown["own_limits"]["monthly_usd"] is None
    async with app_factory(adapter, **QUIET) as app:
        before = len(emulator.requests)
        await say(app, adapter, "four", user="big")
        await say(app, adapter, "again", user="small")
        assert len(emulator.requests) == before + 1, "big is capped, small is not"
        assert "daily budget" in adapter.texts()[-2]
    assert await users(home, "budget", "loop:big", "--clear") == 0
    caps = capsys.readouterr().out.splitlines()[-2]
    assert "(default)" in caps
    assert caps.startswith("caps: daily none, monthly none"), caps  # never "$none"

    assert await users(home, "list") == 0
    assert capsys.readouterr().out.split() == ["loop:big", "loop:small"]
    assert await users(home, "show", "loop:small") == 0
    assert "sessions: 1, messages written: 2" in capsys.readouterr().out
    assert await users(home, "show", "loop:nobody") == 1
    assert await users(home, "budget", "nocolon") == 2
    capsys.readouterr()


async def test_erase_without_yes_is_refused_when_not_interactive(home: Path, capsys) -> None:
    (home / "memories" / "users" / "loop" / "x").mkdir(parents=True)
    (home / "memories" / "users" / "loop" / "x" / "USER.md").write_text("x")
    assert await users(home, "erase", "loop:x") == 1
    assert (home / "memories" / "users" / "loop" / "x" / "USER.md").exists()
