"""Skills that can act: a skill's front matter names the MCP tools it needs, and the
skills index of a session marks it unavailable when they are not configured for the
person (the server's allowlist, who may use it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo.gateway.emulator import Emulator, Reply
from mnemo.memory.skills import SkillRefused, parse_skill
from tests.mcp.conftest import server_config, telegram_app
from tests.support.loopback import LoopbackAdapter

SKILL = """---
name: file-echo
description: Echo a note back through the test server.
mcp_tools: [tt__echo, tt__add]
---

# file-echo

Call tt__echo with the note, then tt__add to count it.
"""
PLAIN = "---\nname: plain\ndescription: Needs nothing.\n---\n\nbody\n"


def test_front_matter_names_mcp_tools_as_server_and_tool() -> None:
    assert parse_skill(SKILL).mcp_tools == ("tt__echo", "tt__add")
    assert parse_skill(PLAIN).mcp_tools == ()
    for bad in ("[echo]", "[tt_echo]", "['tt__']", "['__echo']", "[tt__a b]", "{tt__a: 1}"):
        with pytest.raises(SkillRefused, match="mcp_tools"):
            parse_skill(SKILL.replace("[tt__echo, tt__add]", bad))


async def test_the_index_marks_a_skill_unavailable_where_its_tools_are_not_set_up(
    home: Path, emulator: Emulator
) -> None:
    for name, text in (("file-echo", SKILL), ("plain", PLAIN)):
        (home / "skills" / name).mkdir(parents=True)
        (home / "skills" / name / "SKILL.md").write_text(text)
    emulator.script(*(Reply(text="ok") for _ in range(3)))
    servers = {
        "tt": server_config(tools=["echo", "add"], allowed=["telegram:10"]),
        "half": server_config(tools=["echo"], allowed="users"),
    }
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **{"mcp.servers": servers}):
        for n, user in enumerate(("10", "20"), 1):
            await adapter.say("hello", user=user)
            await adapter.wait_sent(n)
    allowed, other = (r.system_text for r in emulator.requests[:2])
    assert "- file-echo: Echo a note back through the test server.\n" in allowed
    assert (
        "- file-echo: Echo a note back through the test server. (unavailable: needs tt__echo, tt__add, "
        "not set up for this person)" in other
    )
    assert "- plain: Needs nothing.\n" in allowed and "- plain: Needs nothing.\n" in other
