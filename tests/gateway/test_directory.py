"""Directory (``gateway/people/directory.py``) and the ledger's daily totals on every
backend: who mnemo knows (a session of their own, spend or a USER.md; cron runs aside),
what one account wrote, the chats, and messages and cost per local day — a message at
23:30 UTC belongs to the next day in Paris on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from mnemo.gateway.budgets.ledger import EVERYONE
from mnemo.gateway.config import load_settings
from mnemo.gateway.storage import StorageBackend, open_backend
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage
from mnemo.memory.usage import Usage
from tests.conftest import BackendUnderTest

PARIS = "Europe/Paris"
LATE = datetime(2026, 3, 9, 23, 30, tzinfo=UTC)  # 00:30 on the 10th in Paris


@pytest.fixture
async def storage(home: Path, backend: BackendUnderTest) -> AsyncIterator[StorageBackend]:
    settings = load_settings(home, environ={}, overrides={"gateway.timezone": PARIS})
    opened = await open_backend(settings, clock=lambda: LATE)
    yield opened
    await opened.close()


async def session(
    storage: StorageBackend, user: UserRef, *, source: str = "chat", at: datetime = LATE
) -> str:
    row = await storage.sessions.create_session(
        chat_key=f"{user.platform}:dm:{user.user_id}",
        platform=user.platform,
        chat_id=user.user_id,
        thread_id=None,
        user_id=user.user_id,
        agent_context="cron" if source == "cron" else "primary",
        source=source,
        model="m",
        system_prompt="s",
        started_at=at,
    )
    return row.id


async def test_everyone_is_whoever_has_a_session_spend_or_a_profile(storage: StorageBackend) -> None:
    ann, bea, cy, dee = (UserRef("t", n) for n in ("ann", "bea", "cy", "dee"))
    sid = await session(storage, ann)
    await storage.sessions.append_messages(sid, [NewMessage("user", "hi", author_id="ann", created_at=LATE)])
    await storage.sessions.add_usage(sid, Usage(input_tokens=5, cost_usd=0.1), payer=str(bea))
    assert storage.files.own(cy).add("Cy likes tea.").success
    await session(storage, dee, source="cron")  # a cron run alone makes nobody a person
    assert await storage.directory.everyone() == ["t:ann", "t:bea", "t:cy"]
    facts = await storage.directory.facts(ann)
    assert (facts.sessions, facts.messages) == (1, 1)
    assert await storage.directory.has_profile(cy) and not await storage.directory.has_profile(ann)
    assert await storage.directory.chats() == ["t:dm:ann", "t:dm:dee"]


async def test_messages_and_cost_per_local_day(storage: StorageBackend) -> None:
    ann = UserRef("t", "ann")
    sid = await session(storage, ann)
    early = datetime(2026, 3, 9, 12, 0, tzinfo=UTC)
    await storage.sessions.append_messages(
        sid,
        [
            NewMessage("user", "noon", author_id="ann", created_at=early),
            NewMessage("user", "late", author_id="ann", created_at=LATE),
            NewMessage("assistant", "late too", created_at=LATE),
        ],
    )
    await storage.sessions.add_usage(sid, Usage(input_tokens=5, cost_usd=0.25), payer=str(ann))
    per_day = await storage.directory.messages_per_day(date(2026, 3, 1), PARIS)
    assert per_day == {date(2026, 3, 9): 1, date(2026, 3, 10): 2}
    assert await storage.directory.messages_per_day(date(2026, 3, 10), PARIS) == {date(2026, 3, 10): 2}
    assert await storage.budgets.days(EVERYONE, date(2026, 3, 1)) == {date(2026, 3, 10): 0.25}
    assert await storage.budgets.days(str(ann), date(2026, 3, 1)) == {date(2026, 3, 10): 0.25}
    assert await storage.budgets.days(str(ann), date(2026, 3, 11)) == {}
