"""Skills end to end: the real Telegram adapter against the fake Bot API, the real
anthropic SDK against the emulator. Two users, in a group and in DMs, each write a skill
through ``skill_manage``; neither ever sees the other's, in the index of a later
session's system prompt, in ``skills_list`` or in ``skill_view``."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig, last_user_text

BOT = "mnemo_test_bot"
ALICE, BOB, GROUP = 1001, 1002, -100555


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


def skill_md(name: str) -> str:
    return f"---\nname: {name}\ndescription: The {name} procedure.\n---\n\nSECRET-BODY-{name}\n"


def tool_results(request: RecordedRequest) -> list[str]:
    last = request.messages[-1]
    if not isinstance(last["content"], list):
        return []
    out = []
    for block in last["content"]:
        if block.get("type") == "tool_result":
            content = block["content"]
            out.append(content if isinstance(content, str) else "".join(b.get("text", "") for b in content))
    return out


def responder(request: RecordedRequest) -> Reply:
    results = tool_results(request)
    if results:
        return Reply(text="RESULT " + " | ".join(results))
    text = last_user_text(request)
    if m := re.search(r"save skill ([a-z-]+)", text):
        args = {"action": "create", "name": m[1], "content": skill_md(m[1])}
        return Reply(tool_uses=[ToolUse("skill_manage", args)])
    if m := re.search(r"peek ([a-z-]+)", text):
        return Reply(tool_uses=[ToolUse("skill_view", {"name": m[1]}), ToolUse("skills_list", {})])
    return Reply(text="ok")


async def test_two_users_in_a_group_and_in_dms_never_see_each_others_skills(rig: TelegramRig) -> None:
    rig.emulator.default = responder
    group: dict[str, Any] = {"chat_type": "supergroup"}
    async with rig.app(**{"telegram.groups_enabled": True}) as (app, _):
        rig.fake.push_text(ALICE, ALICE, "save skill alice-recipe")
        rig.fake.push_text(GROUP, BOB, f"@{BOT} save skill bob-trick", **group)
        saved = await rig.fake.wait_for_sent(2)
        # First messages in the other chat: new sessions, whose index is built now.
        rig.fake.push_text(GROUP, ALICE, f"@{BOT} peek bob-trick", **group)
        rig.fake.push_text(BOB, BOB, "peek alice-recipe")
        await rig.fake.wait_for_sent(4)
        users = app.settings.skills_dir / "users" / "telegram"
        assert (users / str(ALICE) / "alice-recipe" / "SKILL.md").is_file()
        assert (users / str(BOB) / "bob-trick" / "SKILL.md").is_file()

    for s in saved:
        assert "usable now through skill_view" in s.plain_text and "next session" in s.plain_text
    by_text = {last_user_text(r): r for r in rig.emulator.requests if not tool_results(r)}
    alice_later = by_text["peek bob-trick"]
    bob_later = by_text["peek alice-recipe"]
    assert "- alice-recipe: The alice-recipe procedure." in alice_later.system_text
    assert "bob-trick:" not in alice_later.system_text
    assert "- bob-trick: The bob-trick procedure." in bob_later.system_text
    assert "alice-recipe:" not in bob_later.system_text
    for request in rig.emulator.requests:
        assert "SECRET-BODY" not in request.system_text  # bodies never in the prompt
    peeks = [r for r in rig.emulator.requests if tool_results(r)][-2:]
    for request in peeks:
        view, _listing = tool_results(request)
        assert json.loads(view)["success"] is False and "no skill named" in json.loads(view)["error"]
    listed = {tuple(s["name"] for s in json.loads(tool_results(r)[1])["skills"]) for r in peeks}
    assert listed == {("alice-recipe",), ("bob-trick",)}


async def test_the_skills_command_lists_and_only_an_admin_promotes(rig: TelegramRig) -> None:
    rig.emulator.default = responder
    async with rig.app(**{"access.admins": (f"telegram:{ALICE}",)}) as (app, _):
        rig.fake.push_text(BOB, BOB, "save skill bob-trick")
        await rig.fake.wait_for_sent(1)
        rig.fake.push_text(BOB, BOB, f"/skills promote bob-trick telegram:{BOB}")
        rig.fake.push_text(ALICE, ALICE, f"/skills promote bob-trick telegram:{BOB}")
        sent = await rig.fake.wait_for_sent(3)
        rig.fake.push_text(ALICE, ALICE, "/skills")
        sent = await rig.fake.wait_for_sent(4)
        shared = [s.name for s in app_store(app).shared()]

    to_bob = [s.plain_text for s in sent if s.chat_id == BOB]
    to_alice = [s.plain_text for s in sent if s.chat_id == ALICE]
    assert "Only an admin" in to_bob[1]
    assert to_alice[0].startswith("Promoted bob-trick") and "bob-trick (shared)" in to_alice[1]
    assert shared == ["bob-trick"]


def app_store(app: Any) -> Any:
    from mnemo.memory.skills import SkillStore

    return SkillStore(app.settings.skills_dir)
