"""What a person sees of erasure and linking on Telegram (issue 26 item 8), through the
real ``TelegramAdapter`` against the fake Bot API, on SQLite and PostgreSQL.

* After ``/forget me CODE`` no row keeps the person's id or name — not even the
  confirming message's inbox row or the receipt's outbox row, which the erasure used to
  leave behind. The receipt still reaches them.
* When a ``/link`` code is redeemed, the person's other accounts are told, and
  ``/link undo`` within 24 hours takes the link back without leaving the other account
  a copy of the profile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.gateway.emulator import Emulator, Reply
from mnemo.memory.scope import UserRef
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig
from tests.conftest import BackendUnderTest
from tests.gateway.test_erasure_backends import everywhere

ALICE, ALICE_NAME = 770012345, "Quokkabelle"
BOB, BOB_NAME = 770067890, "Plumbertina"
MALLORY = 770099999


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username="mnemo_test_bot") as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


async def say(rig: TelegramRig, user: int, text: str, name: str = "") -> str:
    """``text`` from ``user`` in their private chat; the bot's next message there."""
    before = len([s for s in rig.fake.sent if s.chat_id == user])
    rig.fake.push_text(user, user, text, first_name=name or f"user{user}")
    async with asyncio.timeout(15):
        while len(mine := [s for s in rig.fake.sent if s.chat_id == user]) <= before:
            await asyncio.sleep(0.02)
    return mine[before].plain_text


async def test_after_forget_me_no_row_keeps_their_id_or_name(
    rig: TelegramRig, home: Path, backend: BackendUnderTest
) -> None:
    rig.emulator.default = lambda req: Reply(text="noted")
    words = (str(ALICE), ALICE_NAME)
    async with rig.app() as (app, _):
        assert await say(rig, ALICE, "hello, remember me", ALICE_NAME) == "noted"
        assert await say(rig, BOB, "hello from bob", BOB_NAME) == "noted"
        ask = await say(rig, ALICE, "/forget me", ALICE_NAME)
        code = ask.split("/forget me ", 1)[1].split()[0]
        receipt = await say(rig, ALICE, f"/forget me {code}", ALICE_NAME)
        assert receipt.startswith("Erased everything I had of you:") and "sessions: 1" in receipt
        await app.gateway.delivery.deliver_due()
        assert everywhere(home, backend, words) == [], "not even the confirmation's own rows"
    assert everywhere(home, backend, words) == [], "nor after the bot stopped"
    assert {w.split(": ")[-1] for w in everywhere(home, backend, (str(BOB), BOB_NAME))} == {
        str(BOB),
        BOB_NAME,
    }


async def test_a_redeemed_code_is_announced_to_the_person_and_can_be_undone(
    rig: TelegramRig, backend: BackendUnderTest
) -> None:
    rig.emulator.default = lambda req: Reply(text="ok")
    alice, mallory = UserRef("telegram", str(ALICE)), UserRef("telegram", str(MALLORY))
    async with rig.app() as (app, _):
        assert (await asyncio.to_thread(app.files.user(alice).add, "Alice keeps bees.")).success
        offer = await say(rig, ALICE, "/link", ALICE_NAME)
        code = offer.split("/link ", 1)[1].split()[0]
        # The code leaked: someone else redeems it.
        linked = await say(rig, MALLORY, f"/link {code}", "Mallory")
        assert linked.startswith(f"Linked: this account and {alice}")
        notice = await _next_in(rig, ALICE, after=offer)
        assert notice.startswith(f"{mallory} was linked to your profile; /link undo within 24 h")
        assert await app.links.members(mallory) == (alice, mallory)

        undone = await say(rig, ALICE, "/link undo", ALICE_NAME)
        assert undone.startswith(f"Undone: {mallory} no longer shares your profile")
        assert await app.links.members(alice) == (alice,)
        assert await app.links.members(mallory) == (mallory,)
        assert app.files.user(mallory).load().entries == (), "no copy of Alice's profile"
        assert app.files.user(alice).load().entries == ("Alice keeps bees.",)
        again = await say(rig, ALICE, "/link undo", ALICE_NAME)
        assert again.startswith("There is no link to undo")


async def _next_in(rig: TelegramRig, chat: int, *, after: str) -> str:
    async with asyncio.timeout(15):
        while True:
            texts = [s.plain_text for s in rig.fake.sent if s.chat_id == chat]
            if after in texts and texts.index(after) + 1 < len(texts):
                return texts[texts.index(after) + 1]
            await asyncio.sleep(0.02)
