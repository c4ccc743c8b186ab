"""``mnemo users link|unlink|show``: an admin links two accounts from the CLI while the
gateway runs, the gateway's next session has the merged profile, ``show`` lists the
links, ``unlink`` splits them, and mistakes exit with one clear line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mnemo.app import open_app
from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.scope import UserRef
from tests.support.loopback import LoopbackAdapter


async def users(home: Path, *argv: str) -> int:
    return await asyncio.to_thread(main, ["--home", str(home), "users", *argv])


async def say(adapter: LoopbackAdapter, text: str, user: str) -> str:
    n = len(adapter.sent)
    await adapter.say(text, user=user)
    return (await adapter.wait_sent(n + 1))[n].text


async def test_a_cli_link_reaches_the_running_gateway_and_unlink_splits_it(
    home: Path, emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    files = MemoryFiles(home / "memories")
    files.own(UserRef("loop", "ann")).add("Works night shifts.")
    files.own(UserRef("loop", "ann2")).add("Allergic to peanuts.")
    emulator.default = lambda req: Reply(text="ok")
    settings = load_settings(
        home,
        environ={},
        overrides={
            "access.allowed": ("loop:*",),
            "access.rate_limit_per_minute": 0,
            "llm.max_retries": 1,
        },
    )
    adapter = LoopbackAdapter()
    async with open_app(
        settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="k", trial=False
    ) as app:
        await say(adapter, "hello", "ann2")
        assert "Works night shifts" not in emulator.requests[-1].system_text
        capsys.readouterr()
        assert await users(home, "link", "loop:ann", "loop:ann2", "--json") == 0
        linked = json.loads(capsys.readouterr().out)
        assert linked == {
            "user": "loop:ann",
            "other": "loop:ann2",
            "linked": True,
            "already": False,
            "canonical": "loop:ann",
            "members": ["loop:ann", "loop:ann2"],
            "merged": 1,
            "left_out": 0,
        }
        await say(adapter, "/reset", "ann2")
        await say(adapter, "hi again", "ann2")
        prompt = emulator.requests[-1].system_text
        assert "Works night shifts" in prompt and "Allergic to peanuts" in prompt
        assert app.links is not None and app.links.identities.canonical(UserRef("loop", "ann2")) == UserRef(
            "loop", "ann"
        )

    assert await users(home, "link", "loop:ann2", "loop:ann") == 0
    assert "already linked" in capsys.readouterr().out
    assert await users(home, "show", "loop:ann2", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(r["user"], r["canonical"], r["linked_by"]) for r in shown["linked"]] == [
        ("loop:ann", True, "admin"),
        ("loop:ann2", False, "admin"),
    ]
    assert await users(home, "show", "loop:ann") == 0
    assert "linked: loop:ann (profile), loop:ann2" in capsys.readouterr().out

    assert await users(home, "unlink", "loop:ann2", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "user": "loop:ann2",
        "unlinked": True,
        "remaining": ["loop:ann"],
    }
    copy = files.own(UserRef("loop", "ann2")).load().entries
    assert "Works night shifts." in copy and "Allergic to peanuts." in copy
    assert copy == files.own(UserRef("loop", "ann")).load().entries, "each side keeps a copy"
    assert await users(home, "show", "loop:ann", "--json") == 0
    assert json.loads(capsys.readouterr().out)["linked"] == []


async def test_link_mistakes_exit_with_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await users(home, "link", "loop:a", "loop:a") == 2
    assert "cannot be linked with itself" in capsys.readouterr().err
    assert await users(home, "link", "nocolon", "loop:b") == 2
    err = capsys.readouterr().err.strip()
    assert "PLATFORM:ID" in err and len(err.splitlines()) == 1
    assert await users(home, "unlink", "loop:nobody") == 1
    assert "not linked" in capsys.readouterr().out
