"""Skills isolation end to end on Discord and in the web chat, like
``test_skills_e2e.py`` does for Telegram: the real adapters (discord.py against the fake
Discord; the web chat's websocket through aiohttp), the real anthropic SDK against the
emulator, and the recorded requests as the evidence. Two users never see each other's
skills — not in the index of a later session's system prompt, not in ``skills_list``,
not in ``skill_view``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore
from tests.adapters.discord_harness import running_bot
from tests.support.webchat import ChatClient, open_web_app, web_settings


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


def last_user_text(request: RecordedRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            return content
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return ""


def responder(request: RecordedRequest) -> Reply:
    """ "save skill X" → skill_manage create; "peek X" → skill_view X and skills_list."""
    results = tool_results(request)
    if results:
        return Reply(text="RESULT " + " | ".join(results))
    text = last_user_text(request)
    if m := re.search(r"save skill ([a-z-]+)", text):
        return Reply(
            tool_uses=[ToolUse("skill_manage", {"action": "create", "name": m[1], "content": skill_md(m[1])})]
        )
    if m := re.search(r"peek ([a-z-]+)", text):
        return Reply(tool_uses=[ToolUse("skill_view", {"name": m[1]}), ToolUse("skills_list", {})])
    return Reply(text="ok")


def asked(requests: list[RecordedRequest], text: str) -> RecordedRequest:
    """The first request of the turn whose user message is ``text``."""
    return next(r for r in requests if not tool_results(r) and last_user_text(r).endswith(text))


def answered(requests: list[RecordedRequest], text: str) -> dict[str, dict]:
    """What ``skill_view`` and ``skills_list`` returned in the turn "peek …" = ``text``."""
    request = next(r for r in requests if tool_results(r) and last_user_text(r).endswith(text))
    view, listing = (json.loads(t) for t in tool_results(request))
    return {"view": view, "list": listing}


async def test_two_discord_users_in_a_server_channel_and_in_dms_never_see_each_others_skills(
    home: Path, emulator: Emulator
) -> None:
    emulator.default = responder
    async with running_bot(home, emulator) as bot:
        bob_dm = bot.fake.add_dm(bot.bob)
        await bot.say(bot.alice_dm, bot.alice, "save skill alice-recipe")
        await bot.say(bot.general, bot.bob, f"{bot.mention} save skill bob-trick")
        saved = await bot.sent(2)
        # First messages in the other chat: new sessions, whose index is built now.
        await bot.say(bot.general, bot.alice, f"{bot.mention} peek bob-trick")
        await bot.say(bob_dm, bot.bob, "peek alice-recipe")
        await bot.sent(4)
        await bot.settle()
        users = bot.app.settings.skills_dir / "users" / "discord"
        assert (users / str(bot.alice.id) / "alice-recipe" / "SKILL.md").is_file()
        assert (users / str(bot.bob.id) / "bob-trick" / "SKILL.md").is_file()
        store = SkillStore(bot.app.settings.skills_dir)
        assert store.shared() == []
        assert all(store.written_in_conversation(s) for s in store.own(UserRef("discord", str(bot.bob.id))))

    for message in saved:
        assert "usable now through skill_view" in message.content
    requests = list(emulator.requests)
    alice_later, bob_later = asked(requests, "peek bob-trick"), asked(requests, "peek alice-recipe")
    assert "- alice-recipe: The alice-recipe procedure." in alice_later.system_text
    assert "bob-trick:" not in alice_later.system_text
    assert "- bob-trick: The bob-trick procedure." in bob_later.system_text
    assert "alice-recipe:" not in bob_later.system_text
    for request in requests:
        assert "SECRET-BODY" not in request.system_text
    for peek, own in (("peek bob-trick", "alice-recipe"), ("peek alice-recipe", "bob-trick")):
        seen = answered(requests, peek)
        assert seen["view"]["success"] is False and "no skill named" in seen["view"]["error"]
        assert [s["name"] for s in seen["list"]["skills"]] == [own]


async def test_two_web_chat_users_never_see_each_others_own_skills(
    home: Path, emulator: Emulator, http
) -> None:
    """Every web chat user is the operator (web is a loopback platform), so what they
    write with ``skill_manage`` is shared; skills installed for one of them
    (``mnemo skills install --user web:ID``) stay theirs."""
    alice, bob = "alice-0123456789", "bob-0123456789ab"
    store = SkillStore(home / "skills")
    store.create(skill_md("alice-own"), UserRef("web", alice))
    store.create(skill_md("bob-own"), UserRef("web", bob))
    emulator.default = responder
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        a = await ChatClient.connect(http, app.web.url, alice)
        b = await ChatClient.connect(http, app.web.url, bob)
        await a.say("peek bob-own")
        assert (await a.next("reply"))["text"].startswith("RESULT")
        await b.say("peek alice-own")
        assert (await b.next("reply"))["text"].startswith("RESULT")
        await a.say("save skill team-notes")
        saved = (await a.next("reply"))["text"]
        await b.say("peek team-notes")
        await b.next("reply")
        await a.close()
        await b.close()

    assert "in the shared skills" in saved
    requests = list(emulator.requests)
    alice_first, bob_first = asked(requests, "peek bob-own"), asked(requests, "peek alice-own")
    assert "- alice-own: The alice-own procedure." in alice_first.system_text
    assert "bob-own:" not in alice_first.system_text
    assert "- bob-own: The bob-own procedure." in bob_first.system_text
    assert "alice-own:" not in bob_first.system_text
    for request in requests:
        assert "SECRET-BODY" not in request.system_text
    for peek, own in (("peek bob-own", "alice-own"), ("peek alice-own", "bob-own")):
        seen = answered(requests, peek)
        assert seen["view"]["success"] is False and "no skill named" in seen["view"]["error"]
        assert [s["name"] for s in seen["list"]["skills"]] == [own]
    shared = answered(requests, "peek team-notes")
    assert shared["view"]["success"] is True and shared["view"]["scope"] == "shared"
    assert [s["name"] for s in shared["list"]["skills"]] == ["bob-own", "team-notes"]
