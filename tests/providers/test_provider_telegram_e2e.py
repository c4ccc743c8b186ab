"""Every external provider end to end through the real Telegram adapter: two users talk
to the bot in their DMs and in a group — a shared room, and one session per user —
(python-telegram-bot against the fake
Bot API, the anthropic SDK against the emulator, the provider's SDK against its fake).

Every request the provider's fake receives names the speaker of the turn it was made for
and nobody else, no request made for one user carries the other's words, each turn is
written once in its speaker's scope and recalled from it, and what reaches the model for
one user never holds what the other told the bot elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.adapters.telegram_harness import TelegramRig, wait_until
from tests.fakes.telegram_api import FakeTelegram
from tests.providers.external import EXTERNAL, External, request_text, scopes_in

BOT = "mnemo_test_bot"
IDS = {"alice": 5551, "bob": 7772}
USERS = {name: f"telegram:{i}" for name, i in IDS.items()}
GROUP = -1004242
# (speaker, where, text): each text starts with a marker unique to it.
TURNS = [
    ("alice", "dm", "alice-dm-1 my locker code is 4471"),
    ("bob", "dm", "bob-dm-1 my dog is called Biscuit"),
    ("alice", "group", f"@{BOT} alice-group-1 I am allergic to peanuts"),
    ("bob", "group", f"@{BOT} bob-group-1 what do you know about me?"),
    ("bob", "dm", "bob-dm-2 remind me what you know about me"),
    ("alice", "dm", "alice-dm-2 and what do you know about me?"),
]


def marker(text: str) -> str:
    return next(word for word in text.split() if "-" in word and not word.startswith("@"))


def markers_of(name: str) -> set[str]:
    return {marker(text) for who, _, text in TURNS if who == name}


def other(name: str) -> str:
    return "bob" if name == "alice" else "alice"


def prompt_text(request: RecordedRequest) -> str:
    body = request.body or {}
    return json.dumps([body.get("system"), body.get("messages")], ensure_ascii=False)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(bot_username=BOT) as server:
        yield server


@pytest.mark.parametrize("shared_room", [True, False], ids=["shared-group", "per-user-group"])
@pytest.mark.parametrize("external", EXTERNAL, ids=str)
async def test_two_users_in_dms_and_a_group_each_in_their_own_scope(
    external: External, shared_room: bool, home: Path, telegram: FakeTelegram, emulator: Emulator
) -> None:
    emulator.default = lambda _: Reply(text="Noted.")
    fake = external.fake()
    await fake.start()
    rig = TelegramRig(telegram, emulator, home)
    turn_requests: list[tuple[str, list[Any]]] = []  # speaker, the fake's requests during the turn
    turn_prompts: list[tuple[str, str, list[RecordedRequest]]] = []
    try:
        external.configure(home, fake)
        options: dict[str, Any] = {
            "memory.provider": external.name,
            "telegram.groups_enabled": True,
            "sessions.group_sessions_per_user": not shared_room,  # shared: one session for the whole group
        }
        async with rig.app(**options):
            for n, (name, where, text) in enumerate(TURNS, 1):
                before, asked = len(fake.requests), len(emulator.requests)
                chat = IDS[name] if where == "dm" else GROUP
                kind = {"chat_type": "private"} if where == "dm" else {"chat_type": "supergroup"}
                telegram.push_text(chat, IDS[name], text, first_name=name.title(), **kind)
                await telegram.wait_for_sent(n, timeout=30)

                def written(m: str = marker(text)) -> bool:
                    return any(m in request_text(r) for r in external.writes(fake))

                await wait_until(written, 30, f"the write of {marker(text)}")
                turn_requests.append((name, fake.requests[before:]))
                turn_prompts.append((name, where, emulator.requests[asked:]))
        answers = [s.plain_text for s in telegram.sent]
        assert len(answers) == len(TURNS) and all(a.startswith("Noted.") for a in answers), answers
    finally:
        await fake.stop()

    writes = {id(r) for r in external.writes(fake)}
    for (name, requests), (_, where, _) in zip(turn_requests, turn_prompts, strict=True):
        named = [r for r in requests if scopes_in(r, USERS)]
        assert named, f"{name}'s {where} turn reached the provider"
        for r in named:
            assert scopes_in(r, USERS) == {name}, (
                f"{name}'s turn made a request for someone else: {request_text(r)}"
            )
        recalls = [r for r in named if id(r) not in writes]
        assert recalls, f"{name}'s {where} turn recalled from {name}'s scope"
        for r in requests:
            leaked = {m for m in markers_of(other(name)) if m in request_text(r)}
            assert not leaked, f"a request for {name} carries {other(name)}'s words: {request_text(r)}"

    for name, text in ((who, t) for who, _, t in TURNS):
        carrying = [r for r in fake.requests if id(r) in writes and marker(text) in request_text(r)]
        assert len(carrying) == 1, f"{marker(text)} written {len(carrying)} times"
        assert scopes_in(carrying[0], USERS) == {name}
    for r in fake.requests:  # requests naming nobody (workspace, the bot's peer) carry no one's words
        if not scopes_in(r, USERS):
            assert not any(m in request_text(r) for who in USERS for m in markers_of(who)), request_text(r)

    # What reached the model: in a DM, nothing the other user said anywhere; in the group
    # (whose history a shared room shares), nothing from the other's DMs.
    for name, where, prompts in turn_prompts:
        assert prompts, f"{name}'s {where} turn asked the model"
        forbidden = {marker(t) for who, w, t in TURNS if who == other(name) and (where == "dm" or w == "dm")}
        for p in prompts:
            leaked = {m for m in forbidden if m in prompt_text(p)}
            assert not leaked, f"{name}'s {where} prompt holds {other(name)}'s {leaked}"
