"""Memory people can see, trust and undo — end to end through the real Telegram adapter
(python-telegram-bot against the fake Bot API), the anthropic SDK against the emulator,
and ``mnemo`` as a real process for the CLI, on SQLite and PostgreSQL.

Two people, Alice (a bot admin) and Bob, talk to the bot in their DMs and in a group:

* a write from a message is in ``mnemo memory history --json`` with that message's id
  and trust ``stated``; a replace keeps the old value with ``until``; ``/memory undo``
  restores the previous value;
* with the default policies no request made for a group turn carries anyone's USER.md;
* ``remember: off`` in the group leaves every memory layer as it was after a "remember
  that …" there (curated files, facts, skills, the journal), while the DM still remembers;
* ``remember: ask`` stores nothing until the person confirms.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mnemo.app import App
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from mnemo.memory.scope import UserRef
from tests.adapters.telegram_harness import TelegramRig, last_user_text
from tests.conftest import BackendUnderTest
from tests.fakes.telegram_api import FakeTelegram

BOT = "mnemo_journal_bot"
ALICE, BOB = 5551, 7772
GROUP = -1004242
DM = {"chat_type": "private"}
IN_GROUP = {"chat_type": "supergroup"}
SKILL = "---\nname: boat-care\ndescription: How to look after a boat.\n---\nRinse the hull.\n"


async def mnemo(home: Path, *argv: str) -> tuple[int, str]:
    """``mnemo --home HOME …`` as a separate process (the CLI an operator runs)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mnemo",
        "--home",
        str(home),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


async def history(home: Path, *argv: str) -> list[dict[str, Any]]:
    code, out = await mnemo(home, "memory", "history", "--json", *argv)
    assert code == 0, out
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def model(request: RecordedRequest) -> Reply:
    """The scripted model: "remember that X" → the memory tool (and, when asked to keep
    everything, a fact and a skill too); "actually X instead of Y" → a replace; a tool
    result → "Noted."."""
    last = request.messages[-1]
    if isinstance(last["content"], list) and any(b.get("type") == "tool_result" for b in last["content"]):
        return Reply(text="Noted.")
    text = last_user_text(request)
    if m := re.search(r"actually (.+) instead of (.+?)\s*$", text):
        call = {"action": "replace", "target": "user", "old_text": m[2], "content": m[1], "stated": True}
        return Reply(tool_uses=[ToolUse("memory", call)])
    if m := re.search(r"remember that (.+?)\s*$", text):
        uses = [ToolUse("memory", {"action": "add", "target": "user", "content": m[1], "stated": True})]
        if "everywhere" in text:
            uses += [
                ToolUse("fact_store", {"action": "add", "content": m[1]}),
                ToolUse("skill_manage", {"action": "create", "name": "boat-care", "content": SKILL}),
            ]
        return Reply(tool_uses=uses)
    return Reply(text="Hello.")


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(telegram: FakeTelegram, emulator: Emulator, home: Path, backend: BackendUnderTest) -> TelegramRig:
    emulator.default = model
    return TelegramRig(telegram, emulator, home)


OPTIONS: dict[str, Any] = {
    "telegram.groups_enabled": True,
    "access.admins": (f"telegram:{ALICE}",),
    "memory.provider": "holographic",
}


class Chat:
    """Send one message and wait for the bot's answer to it."""

    def __init__(self, rig: TelegramRig) -> None:
        self.rig = rig
        self.sent = 0

    async def say(self, chat: int, user: int, text: str, **kind: Any) -> tuple[str, str]:
        """(the platform message id, the answer's text)."""
        update = self.rig.fake.push_text(
            chat, user, text, first_name="Alice" if user == ALICE else "Bob", **kind
        )
        self.sent += 1
        answers = await self.rig.fake.wait_for_sent(self.sent, timeout=30)
        return str(update["message"]["message_id"]), answers[-1].plain_text


async def profile(app: App, user: int) -> str:
    """A person's USER.md as the configured backend keeps it (a file, or a row)."""
    snap = await asyncio.to_thread(app.files.user(UserRef("telegram", str(user))).load)
    return "\n§\n".join(snap.entries)


async def shared(app: App) -> tuple[str, ...]:
    return (await asyncio.to_thread(app.files.shared().load)).entries


def skills(home: Path) -> list[Path]:
    root = home / "skills"
    return sorted(p.relative_to(home) for p in root.rglob("*") if p.is_file()) if root.exists() else []


async def test_a_write_from_a_message_is_in_the_history_with_its_message_and_undo_restores_it(
    rig: TelegramRig, home: Path
) -> None:
    chat = Chat(rig)
    async with rig.app(**OPTIONS) as (app, _):
        said, _ = await chat.say(ALICE, ALICE, "remember that I drink green tea", **DM)
        [entry] = await history(home, "--layer", "curated")
        assert {
            k: entry[k] for k in ("layer", "target", "op", "old", "new", "actor", "trust", "message")
        } == {
            "layer": "curated",
            "target": f"telegram:{ALICE}",
            "op": "add",
            "old": None,
            "new": "I drink green tea",
            "actor": "model",
            "trust": "stated",
            "message": said,
        }
        assert entry["session"] and entry["until"] is None and entry["time"]
        assert {
            "id",
            "time",
            "layer",
            "target",
            "op",
            "old",
            "new",
            "actor",
            "trust",
            "session",
            "message",
        } <= set(entry)

        replaced_by, _ = await chat.say(ALICE, ALICE, "actually I drink black tea instead of green tea", **DM)
        assert await profile(app, ALICE) == "I drink black tea"
        replace, add = await history(home, "--layer", "curated", "--user", f"telegram:{ALICE}")
        assert (replace["op"], replace["old"], replace["new"], replace["message"]) == (
            "replace",
            "I drink green tea",
            "I drink black tea",
            replaced_by,
        )
        assert add["until"] is not None and add["until"] == replace["time"], "the old value keeps its until"
        assert replace["since"] == add["time"]

        _, answer = await chat.say(ALICE, ALICE, "/memory undo", **DM)
        assert answer.startswith(f"Undone #{replace['id']}"), answer
        assert await profile(app, ALICE) == "I drink green tea"
        undo = (await history(home, "--layer", "curated"))[0]
        assert (undo["op"], undo["reverts"], undo["actor"], undo["trust"]) == (
            "replace",
            replace["id"],
            "person",
            "stated",
        )
        rows = await history(home)
        assert next(r for r in rows if r["id"] == replace["id"])["undone"] is True

        _, listed = await chat.say(ALICE, ALICE, "/memory history", **DM)
        assert f"#{replace['id']}" in listed and "[undone]" in listed
        _, public = await chat.say(GROUP, ALICE, f"/memory@{BOT} history", **IN_GROUP)
        assert public.startswith("Your profile is private"), public


async def test_group_turns_carry_nobodys_profile_and_an_ephemeral_group_changes_no_memory_layer(
    rig: TelegramRig, home: Path, emulator: Emulator
) -> None:
    chat = Chat(rig)
    async with rig.app(**OPTIONS) as (app, _):
        await chat.say(ALICE, ALICE, "remember that Alice-secret-7731 is my locker code", **DM)
        await chat.say(BOB, BOB, "remember that Bob-secret-2284 is my door code", **DM)
        assert "Alice-secret-7731" in await profile(app, ALICE) and "Bob-secret-2284" in await profile(
            app, BOB
        )

        asked = len(emulator.requests)
        await chat.say(GROUP, ALICE, f"@{BOT} what do you know about me?", **IN_GROUP)
        await chat.say(GROUP, BOB, f"@{BOT} and about me?", **IN_GROUP)
        group_requests = emulator.requests[asked:]
        assert len(group_requests) == 2
        for request in group_requests:
            seen = json.dumps([request.body.get("system"), request.body.get("messages")], ensure_ascii=False)
            assert "Alice-secret-7731" not in seen and "Bob-secret-2284" not in seen, seen

        _, answer = await chat.say(GROUP, ALICE, f"/memory@{BOT} policy chat remember off", **IN_GROUP)
        assert answer == "Saved: this chat's remember is off."
        before = {
            "alice": await profile(app, ALICE),
            "bob": await profile(app, BOB),
            "shared": await shared(app),
            "skills": skills(home),
            "journal": await history(home),
        }
        code, facts_before = await mnemo(
            home, "facts", "search", "boat", "--user", f"telegram:{BOB}", "--json"
        )
        assert code == 0, facts_before
        asked = len(emulator.requests)
        await chat.say(GROUP, BOB, f"@{BOT} remember that I own a boat everywhere", **IN_GROUP)
        results = [
            b["content"]
            for r in emulator.requests[asked:]
            for m in r.messages
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        assert len(results) == 3 and all(
            "remember" in str(c).lower() or "policy" in str(c).lower() for c in results
        ), results
        after = {
            "alice": await profile(app, ALICE),
            "bob": await profile(app, BOB),
            "shared": await shared(app),
            "skills": skills(home),
            "journal": await history(home),
        }
        assert after == before, "an ephemeral group changes no memory layer"
        code, facts_after = await mnemo(
            home, "facts", "search", "boat", "--user", f"telegram:{BOB}", "--json"
        )
        assert json.loads(facts_after)["results"] == json.loads(facts_before)["results"] == []

        await chat.say(BOB, BOB, "remember that I own a boat everywhere", **DM)
        assert "I own a boat everywhere" in await profile(app, BOB)
        code, found = await mnemo(home, "facts", "search", "boat", "--user", f"telegram:{BOB}", "--json")
        assert [f["content"] for f in json.loads(found)["results"]] == ["I own a boat everywhere"]
        layers = {r["layer"] for r in await history(home, "--user", f"telegram:{BOB}")}
        assert {"curated", "facts", "skills"} <= layers


async def test_remember_ask_stores_nothing_until_the_person_confirms(rig: TelegramRig, home: Path) -> None:
    chat = Chat(rig)
    async with rig.app(**OPTIONS) as (app, _):
        _, answer = await chat.say(BOB, BOB, "/memory policy remember ask", **DM)
        assert "remember: ask" in answer
        said, answer = await chat.say(BOB, BOB, "remember that I like jazz", **DM)
        [proposal] = re.findall(r"/memory confirm (\d+)", answer)
        assert "I like jazz" in answer
        assert await profile(app, BOB) == ""
        assert await history(home, "--layer", "curated") == []

        _, answer = await chat.say(BOB, BOB, f"/memory confirm {proposal}", **DM)
        assert answer == "Saved: “I like jazz”."
        assert await profile(app, BOB) == "I like jazz"
        [entry] = await history(home, "--layer", "curated")
        assert (entry["new"], entry["trust"], entry["actor"], entry["message"]) == (
            "I like jazz",
            "stated",
            "person",
            said,
        )
        _, again = await chat.say(BOB, BOB, f"/memory confirm {proposal}", **DM)
        assert again == f"#{proposal} waits for no confirmation."
