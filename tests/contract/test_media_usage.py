"""MediaUsageRepository: per-person and global limits by local day and in total, linked
accounts as one person, the same content counted once, uploads expiring after a day,
release, and no limit passed by concurrent admits. Run on both backends
(``SqliteMediaUsage``, ``PgMediaUsage``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemo.gateway.config import MediaQuotaSettings
from mnemo.gateway.media_quota import Limit, MediaKind, MediaUsage, MediaUsageRepository
from mnemo.gateway.people.links import IdentityLinks
from mnemo.gateway.people.media_usage import SqliteMediaUsage
from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.identity import Identities
from mnemo.memory.scope import UserRef
from tests.contract.conftest import BACKENDS

MB = 2**20
STORED, UPLOAD = MediaKind.STORED, MediaKind.UPLOAD


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Ledger:
    usage: MediaUsageRepository
    links: IdentityLinks
    clock: Clock


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    clock = Clock(datetime(2026, 1, 31, 22, 30, tzinfo=UTC))  # 23:30 in Paris
    files = MemoryFiles(tmp_path / "memories", 2200, 1375)
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield Ledger(
            SqliteMediaUsage(db, timezone="Europe/Paris", clock=clock),
            IdentityLinks(db, files, Identities()),
            clock,
        )
        await db.close()
        return
    from mnemo.gateway.storage_pg.links import PgIdentityLinks
    from mnemo.gateway.storage_pg.media_usage import PgMediaUsage
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=8
    )
    await pg.open()
    yield Ledger(
        PgMediaUsage(pg, timezone="Europe/Paris", clock=clock),
        PgIdentityLinks(pg, files, Identities()),
        clock,
    )
    await pg.close()


def limits(**values: int | None) -> MediaQuotaSettings:
    base: dict[str, int | None] = {
        "per_person_daily_bytes": None,
        "per_person_total_bytes": None,
        "global_daily_bytes": None,
        "global_total_bytes": None,
    }
    return MediaQuotaSettings(**{**base, **values})


async def test_a_daily_limit_refuses_the_file_that_would_pass_it_until_local_midnight(ledger: Ledger) -> None:
    cap = limits(per_person_daily_bytes=10 * MB)
    assert await ledger.usage.admit("t:ann", STORED, "a.jpg", 6 * MB, cap) is None
    assert await ledger.usage.admit("t:ann", STORED, "b.jpg", 4 * MB, cap) is None  # exactly at the limit
    refused = await ledger.usage.admit("t:ann", STORED, "c.jpg", 1, cap)
    assert refused is not None and refused.limit is Limit.PER_PERSON_DAILY
    assert (refused.limit_bytes, refused.used_bytes) == (10 * MB, 10 * MB)
    assert refused.resets_at == datetime(2026, 2, 1, 0, 0, tzinfo=refused.resets_at.tzinfo)
    assert refused.retry_after_s == 30 * 60
    assert "today's limit for files (10 MB)" in refused.text and "2026-02-01 00:00 CET" in refused.text
    assert await ledger.usage.admit("t:bob", STORED, "c.jpg", 5 * MB, cap) is None, "another person"
    ledger.clock.now += timedelta(minutes=31)  # 00:01 in Paris: a new day
    assert await ledger.usage.admit("t:ann", STORED, "c.jpg", 5 * MB, cap) is None
    assert await ledger.usage.usage("t:ann") == MediaUsage(today=5 * MB, kept=15 * MB)


async def test_totals_count_what_is_kept_and_uploads_stop_counting_after_a_day(ledger: Ledger) -> None:
    cap = limits(per_person_total_bytes=10 * MB, global_total_bytes=15 * MB)
    assert await ledger.usage.admit("web:ann", UPLOAD, "ann/1", 8 * MB, cap) is None
    refused = await ledger.usage.admit("web:ann", STORED, "x.pdf", 3 * MB, cap)
    assert refused is not None and refused.limit is Limit.PER_PERSON_TOTAL and refused.resets_at is None
    assert "fill the space you have on this bot (10 MB)" in refused.text
    assert await ledger.usage.admit("t:bob", STORED, "y.pdf", 7 * MB, cap) is None
    everyone = await ledger.usage.admit("t:cy", STORED, "z.pdf", 1 * MB, cap)
    assert everyone is not None and everyone.limit is Limit.GLOBAL_TOTAL
    ledger.clock.now += timedelta(
        hours=24, seconds=1
    )  # the upload is a day old: removed or not, it no longer counts
    assert await ledger.usage.usage("web:ann") == MediaUsage(today=0, kept=0)
    assert await ledger.usage.admit("web:ann", STORED, "x.pdf", 3 * MB, cap) is None


async def test_the_global_daily_limit_holds_across_people(ledger: Ledger) -> None:
    cap = limits(per_person_daily_bytes=5 * MB, global_daily_bytes=12 * MB)
    for n, who in enumerate(("web:a", "web:b")):
        assert await ledger.usage.admit(who, UPLOAD, f"{who}/1", 5 * MB, cap) is None, n
    refused = await ledger.usage.admit("web:c", UPLOAD, "c/1", 5 * MB, cap)
    assert refused is not None and refused.limit is Limit.GLOBAL_DAILY
    assert refused.text.startswith("this bot has reached today's limit for files (12 MB)")
    assert await ledger.usage.usage("*") == MediaUsage(today=10 * MB, kept=10 * MB)


async def test_the_same_content_again_is_not_counted_again(ledger: Ledger) -> None:
    cap = limits(per_person_daily_bytes=5 * MB)
    for _ in range(3):
        assert await ledger.usage.admit("t:ann", STORED, "same.jpg", 4 * MB, cap) is None
    assert (await ledger.usage.usage("t:ann")).today == 4 * MB


async def test_linked_accounts_share_one_quota(ledger: Ledger) -> None:
    await ledger.links.link(UserRef("telegram", "1"), UserRef("web", "ann"))
    cap = limits(per_person_daily_bytes=10 * MB)
    assert await ledger.usage.admit("telegram:1", STORED, "a.jpg", 6 * MB, cap) is None
    refused = await ledger.usage.admit("web:ann", UPLOAD, "ann/1", 6 * MB, cap)
    assert refused is not None and refused.used_bytes == 6 * MB
    assert (await ledger.usage.usage("web:ann")).today == 6 * MB


async def test_release_gives_the_space_back(ledger: Ledger) -> None:
    cap = limits(per_person_total_bytes=10 * MB)
    assert await ledger.usage.admit("web:ann", UPLOAD, "ann/1", 8 * MB, cap) is None
    assert await ledger.usage.release(UPLOAD, ["ann/1", "ann/unknown"]) == 1
    assert await ledger.usage.release(UPLOAD, []) == 0
    assert (await ledger.usage.usage("web:ann")).kept == 0
    assert await ledger.usage.admit("web:ann", UPLOAD, "ann/2", 8 * MB, cap) is None


async def test_concurrent_admits_never_pass_a_limit_together(ledger: Ledger) -> None:
    cap = limits(per_person_daily_bytes=10 * MB, global_daily_bytes=25 * MB)
    verdicts = await asyncio.gather(
        *(ledger.usage.admit(f"web:u{n % 3}", UPLOAD, f"u{n % 3}/{n}", 3 * MB, cap) for n in range(30))
    )
    taken = sum(v is None for v in verdicts)
    assert taken == 8, "3 people × 3 files of 3 MB fit each one's 10 MB, 25 MB fits 8 in all"
    assert (await ledger.usage.usage("*")).today == 8 * 3 * MB
