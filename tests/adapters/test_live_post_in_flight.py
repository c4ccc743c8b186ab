"""Exactly once under load: a live reply whose first post Telegram has accepted but not
yet answered when the turn's close wait runs out. The post is not given up: ``close``
waits for the message id and records it in the stream ledger (SQLite and PostgreSQL),
so delivery edits that message into the answer instead of sending a second copy.

The real ``TelegramAdapter`` (python-telegram-bot) against the fake Bot API, which
stores the message at once and holds its answer back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.delivery.live import LiveReply
from mnemo.gateway.delivery.streams import StreamRecords
from mnemo.gateway.events import ChatRef, InboundMessage
from mnemo.gateway.storage import state_database
from tests.adapters.telegram_harness import TelegramRig
from tests.contract.conftest import BACKENDS
from tests.fakes.telegram_api import FakeTelegram

CHAT = 4711


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield StreamRecords(db)
        await db.close()
        return
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.gateway.storage_pg.streams import PgStreamRecords
    from mnemo.memory.pg.db import PgDatabase

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=2
    )
    await pg.open()
    yield PgStreamRecords(pg)
    await pg.close()


async def _nowhere(msg: InboundMessage) -> None:
    raise AssertionError(f"unexpected inbound message {msg}")


async def test_a_post_accepted_after_the_close_wait_is_recorded_not_sent_again(
    fake: FakeTelegram, emulator: Any, home: Path, ledger: Any
) -> None:
    rig = TelegramRig(fake, emulator, home)
    adapter = rig.adapter(rig.settings(), stream_interval_s=0.05)
    fake.add_chat(CHAT)
    await adapter.start(_nowhere)
    try:
        chat = ChatRef("telegram", str(CHAT))
        live = LiveReply(
            adapter, ledger, chat, 1, reply_to=None, interval_s=0.05, max_len=4096, close_wait_s=0.2
        )
        release = fake.hold_next("sendMessage")
        live.start()
        live.delta("The answer is being written")
        await fake.wait_for_sent(1)  # Telegram has the message; its answer is held
        closing = asyncio.create_task(live.close())
        await asyncio.sleep(0.5)  # the close wait has run out meanwhile
        assert not closing.done(), "close waits for the post Telegram accepted"
        release.set()
        await asyncio.wait_for(closing, 10)
        [posted] = fake.sent
        record = await ledger.get(1)
        assert record is not None and record.message_id == str(posted.message_id), (
            "delivery finds the live message and edits it instead of sending the answer again"
        )
    finally:
        await adapter.stop()


async def test_a_stream_closed_before_its_post_sends_nothing(
    fake: FakeTelegram, emulator: Any, home: Path, ledger: Any
) -> None:
    rig = TelegramRig(fake, emulator, home)
    adapter = rig.adapter(rig.settings(), stream_interval_s=0.05)
    fake.add_chat(CHAT)
    await adapter.start(_nowhere)
    try:
        chat = ChatRef("telegram", str(CHAT))
        live = LiveReply(
            adapter, ledger, chat, 1, reply_to=None, interval_s=5.0, max_len=4096, close_wait_s=0.2
        )
        live.start()
        live.delta("Quick")
        await live.close()  # before the first interval: nothing was posted
        assert fake.sent == [] and await ledger.get(1) is None
    finally:
        await adapter.stop()
