"""OutboxRepository: queued → sending → sent | queued again | failed, idempotent per
inbox row, and enqueue inside another repository's transaction (through cron)."""

from __future__ import annotations

from mnemo.gateway.events import ChatRef, OutboundMessage
from tests.contract.conftest import Backend

CHAT = ChatRef("telegram", "100")


def msg(text: str, chat: ChatRef = CHAT) -> OutboundMessage:
    return OutboundMessage(chat=chat, text=text)


async def test_enqueue_then_claim_once_then_sent(backend: Backend) -> None:
    out = backend.outbox
    row_id = await out.enqueue(msg("hello"), session_id="s1")
    due = await out.due({"telegram"})
    assert [(r.id, r.text, r.state, r.session_id) for r in due] == [(row_id, "hello", "queued", "s1")]
    assert await out.due({"discord"}) == [] and await out.due(set()) == []
    assert await out.claim(row_id) is True
    assert await out.claim(row_id) is False  # a second sender loses
    assert await out.due({"telegram"}) == []
    await out.mark_sent(row_id, ["m1"])
    row = await out.get(row_id)
    assert row is not None and (row.state, row.attempts, row.error) == ("sent", 1, None)
    assert (await out.counts()).get("sent") == 1


async def test_a_second_reply_to_the_same_inbox_row_is_the_first(backend: Backend) -> None:
    first = await backend.outbox.enqueue(msg("a"), inbox_id=7)
    assert await backend.outbox.enqueue(msg("b"), inbox_id=7) == first
    assert [r.text for r in await backend.outbox.due({"telegram"})] == ["a"]


async def test_retry_waits_until_not_before_and_release_makes_it_due(backend: Backend) -> None:
    out, clock = backend.outbox, backend.clock
    row_id = await out.enqueue(msg("later"))
    assert await out.claim(row_id)
    await out.mark_retry(row_id, 60.0, "rate limited")
    assert await out.due({"telegram"}) == []
    clock.advance(61)
    (row,) = await out.due({"telegram"})
    assert (row.state, row.attempts, row.error) == ("queued", 1, "rate limited")
    assert await out.claim(row_id)
    await out.mark_retry(row_id, 300.0, "down")
    assert await out.release(ChatRef("telegram", "999")) == 0  # another chat
    assert await out.release(CHAT) == 1
    assert [r.id for r in await out.due({"telegram"})] == [row_id]


async def test_failed_is_terminal_and_in_flight_rows_come_back_labelled(backend: Backend) -> None:
    out = backend.outbox
    dead = await out.enqueue(msg("forbidden"))
    flying = await out.enqueue(msg("in flight"))
    assert await out.claim(dead) and await out.claim(flying)
    await out.mark_failed(dead, "forbidden: blocked")
    assert await out.recover_in_flight() == 1
    (row,) = await out.due({"telegram"})
    assert row.id == flying and row.possible_duplicate and row.to_message().possible_duplicate
    failed = await out.get(dead)
    assert failed is not None and (failed.state, failed.error) == ("failed", "forbidden: blocked")
    assert await out.counts() == {"failed": 1, "queued": 1}


async def test_due_is_in_order_and_limited(backend: Backend) -> None:
    ids = [await backend.outbox.enqueue(msg(str(n))) for n in range(5)]
    assert [r.id for r in await backend.outbox.due({"telegram"}, limit=3)] == ids[:3]
