"""How much people may store: limits on the files mnemo keeps on disk for them.

What counts is every file kept for someone: an image or PDF stored for a conversation
(``media/``, after scaling; ``kind`` ``stored``) and a web upload while it waits for the
message that names it (``media/uploads/``; ``kind`` ``upload``, removed after a day by
``gateway.jobs.housekeeping.UploadSweep``). Each is one row of ``media_usage`` under the
account that sent it; the same content sent again by the same account is not counted
again. A person's usage is the sum over their linked accounts (``gateway/people/links``).

The limits, ``media.quota`` in config.yaml (``None``: no limit):

* ``per_person_daily_bytes`` and ``global_daily_bytes``: what was stored on this local
  day (``gateway.timezone``), whatever has been removed since;
* ``per_person_total_bytes`` and ``global_total_bytes``: what is kept now (stored files,
  and uploads younger than a day).

``admit`` decides and records in one transaction, serialized with every other admit
(SQLite: the single writer's ``BEGIN IMMEDIATE``; PostgreSQL: a transaction-scoped
advisory lock), so uploads arriving together — on several replicas too — cannot pass a
limit together. It returns None (go on) or a ``QuotaExceeded`` whose ``text`` is the one
line the person is shown. ``release`` forgets removed uploads.

The repositories: ``SqliteMediaUsage`` (``gateway/people/media_usage.py``, beside the
links it reads) and ``PgMediaUsage`` (``gateway/storage_pg/media_usage.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol, runtime_checkable

from mnemo.gateway.config import MediaQuotaSettings

UPLOAD_KEEP_S = 24 * 3600  # a web upload not sent within a day is removed

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class MediaKind(StrEnum):
    STORED = "stored"
    UPLOAD = "upload"


class Limit(StrEnum):
    PER_PERSON_DAILY = "per_person_daily_bytes"
    PER_PERSON_TOTAL = "per_person_total_bytes"
    GLOBAL_DAILY = "global_daily_bytes"
    GLOBAL_TOTAL = "global_total_bytes"

    @property
    def daily(self) -> bool:
        return self in (Limit.PER_PERSON_DAILY, Limit.GLOBAL_DAILY)


def size_text(n: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


@dataclass(frozen=True, slots=True)
class QuotaExceeded:
    """A file refused because it would pass ``limit``."""

    limit: Limit
    limit_bytes: int
    used_bytes: int  # before this file
    resets_at: datetime | None  # the next local midnight, for a daily limit
    checked_at: datetime

    @property
    def retry_after_s(self) -> int | None:
        if self.resets_at is None:
            return None
        return max(1, int((self.resets_at - self.checked_at).total_seconds()))

    @property
    def text(self) -> str:
        """One line for the person (a web upload's error, an attachment's note)."""
        size = size_text(self.limit_bytes)
        if self.limit is Limit.PER_PERSON_TOTAL:
            return f"your files fill the space you have on this bot ({size}); ask its operator for more"
        if self.limit is Limit.GLOBAL_TOTAL:
            return f"this bot's space for files is full ({size}); ask its operator to make room"
        assert self.resets_at is not None
        who = "you've" if self.limit is Limit.PER_PERSON_DAILY else "this bot has"
        return (
            f"{who} reached today's limit for files ({size}); more can be sent after "
            f"{self.resets_at:%Y-%m-%d %H:%M} {self.resets_at.tzname()}"
        )


@dataclass(frozen=True, slots=True)
class MediaUsage:
    """Bytes counted today and kept now, for one person or (``*``) everyone."""

    today: int
    kept: int


class MediaUsageRepository(Protocol):
    """The ``media_usage`` rows. ``MediaQuota`` calls ``admit`` before a file is written
    and ``release`` after uploads are removed; ``usage`` is read for reports and tests.
    Raises ``StoreError`` on a database failure."""

    async def admit(
        self, owner: str, kind: MediaKind, file: str, size: int, limits: MediaQuotaSettings
    ) -> QuotaExceeded | None: ...

    async def release(self, kind: MediaKind, files: Sequence[str]) -> int: ...

    async def usage(self, owner: str) -> MediaUsage: ...


def next_midnight(now: datetime) -> datetime:
    return datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), tzinfo=now.tzinfo)


def first_exceeded(
    limits: MediaQuotaSettings, size: int, person: MediaUsage, everyone: MediaUsage, now: datetime
) -> QuotaExceeded | None:
    """The limit ``size`` more bytes would pass, the person's before the bot's."""
    for limit, used in (
        (Limit.PER_PERSON_DAILY, person.today),
        (Limit.PER_PERSON_TOTAL, person.kept),
        (Limit.GLOBAL_DAILY, everyone.today),
        (Limit.GLOBAL_TOTAL, everyone.kept),
    ):
        cap: int | None = getattr(limits, limit.value)
        if cap is not None and used + size > cap:
            return QuotaExceeded(limit, cap, used, next_midnight(now) if limit.daily else None, now)
    return None


class MediaQuota:
    """The limits of ``media.quota`` over a ``MediaUsageRepository``: what
    ``MediaStore.take``, the web upload route and the upload sweep call."""

    def __init__(self, usage: MediaUsageRepository, limits: MediaQuotaSettings) -> None:
        self.usage = usage
        self.limits = limits

    async def admit(self, owner: str, kind: MediaKind, file: str, size: int) -> QuotaExceeded | None:
        return await self.usage.admit(owner, kind, file, size, self.limits)

    async def release(self, kind: MediaKind, files: Sequence[str]) -> int:
        return await self.usage.release(kind, files)


@runtime_checkable
class KeepsUploads(Protocol):
    """An adapter that keeps files uploaded ahead of the message naming them (the web
    chat). ``open_app`` hands it the quota before ``start``; the upload sweep calls
    ``prune_uploads`` (blocking: in a thread) with a cut-off time and gets back the
    uploads it removed, as ``USER/UPLOAD_ID``."""

    def use_media_quota(self, quota: MediaQuota) -> None: ...

    def prune_uploads(self, older_than: float) -> list[str]: ...
