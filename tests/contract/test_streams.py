"""StreamLedger on every backend: one streamed message per inbox row (a re-run's new
one replaces it), forgotten on demand, and purged once the outbox delivered (or gave
up on) the reply to that inbox row — never while the reply still waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.delivery.outbox import Outbox
from mnemo.gateway.delivery.streams import StreamRecords
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.storage import state_database
from tests.contract.conftest import BACKENDS

CHAT = ChatRef("telegram", "100")
TOPIC = ChatRef("telegram", "-200", "7")


@pytest.fixture(params=BACKENDS)
async def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield Outbox(db), StreamRecords(db)
        await db.close()
        return
    from mnemo.gateway.storage_pg.outbox import PgOutbox
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.gateway.storage_pg.streams import PgStreamRecords
    from mnemo.memory.pg.db import PgDatabase

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=4
    )
    await pg.open()
    yield PgOutbox(pg), PgStreamRecords(pg)
    await pg.close()


async def test_record_get_replace_and_forget(ledgers: tuple[Any, Any]) -> None:
    _, streams = ledgers
    assert await streams.get(1) is None
    await streams.record(1, CHAT, "501")
    await streams.record(2, TOPIC, "77")
    first = await streams.get(1)
    assert first is not None and (first.inbox_id, first.chat, first.message_id) == (1, CHAT, "501")
    topic = await streams.get(2)
    assert topic is not None and topic.chat == TOPIC, "the thread is kept"
    await streams.record(1, CHAT, "502")  # a re-run's message replaces the old one
    again = await streams.get(1)
    assert again is not None and again.message_id == "502"
    await streams.forget(1)
    assert await streams.get(1) is None and await streams.get(2) is not None


async def test_purge_drops_only_rows_whose_reply_was_delivered_or_given_up(ledgers: tuple[Any, Any]) -> None:
    outbox, streams = ledgers
    for inbox_id in (1, 2, 3, 4):
        await streams.record(inbox_id, CHAT, f"m{inbox_id}")
    sent = await outbox.enqueue(OutboundMessage(CHAT, "sent"), inbox_id=1)
    failed = await outbox.enqueue(OutboundMessage(CHAT, "failed"), inbox_id=2)
    await outbox.enqueue(OutboundMessage(CHAT, "waiting"), inbox_id=3)  # queued: keep its message
    for row in (sent, failed):
        assert await outbox.claim(row)
    await outbox.mark_sent(sent, ["m1"])
    await outbox.mark_failed(failed, "forbidden")
    assert await streams.purge_delivered() == 2
    assert [await streams.get(i) is not None for i in (1, 2, 3, 4)] == [False, False, True, True]
    assert await streams.purge_delivered() == 0
