"""Erasure: forget one person in every layer, with a receipt, on either backend.

What goes (``Receipt.counts`` names each layer, the same on SQLite and PostgreSQL):

* ``profile`` — their USER.md (the folder ``memories/users/P/ID`` with its ``.lock`` and
  any temp file on SQLite; the ``curated_memory`` row on PostgreSQL);
* ``sessions`` / ``messages`` — their own sessions (the DM, their per-member group
  sessions, cron runs in them) with every message (and so its search index entries);
* ``shared_messages`` — what they wrote in shared-room sessions (the others' stay);
* ``inbox`` / ``outbox`` — their inbound messages and what was sent to them or for them;
* ``jobs`` — the background jobs of their sessions and the queued or finished provider
  writes that carry their words (``provider_write`` payloads in their scope);
* ``pairing``, ``cron_jobs`` (jobs that speak for them), ``usage`` (counters, caps);
* ``rate_limits`` — their rate-limit window (rows on PostgreSQL; in the process on SQLite,
  where nothing is stored and the count is 0);
* ``facts`` — holographic facts owned by them (``facts.db``, or the ``holographic``
  schema on PostgreSQL);
* ``links`` — their identity links and pending ``/link`` codes;
* ``journal`` — their memory journal (every entry about them; their name leaves the
  entries made in their turns on shared memory) and their memory policy, in the same
  transaction; one content-free receipt stays (``memory/journal_sqlite.erase_within``);
* ``skills`` — their own skills (``skills/users/P/ID``) and those skills' history;
* ``media`` — files they sent (``media/``, named in their messages' ``meta``) that no
  remaining message still refers to;
* ``copies`` — copies of their profile or skill folders anywhere else under the home
  (``.replaced-*/`` left by ``mnemo import``, an unpacked archive): every
  ``…/users/P/ID/`` and ``…/.history/users/P:ID/`` folder;
* ``backups`` — the backup archives (``backup.dir``), whichever backend each was taken
  from: each restored into a scratch SQLite home, erased there the same way and written
  again (``scrub`` from the app: ``mnemo/backups.py``; the gateway cannot import it);
* ``provider`` — for an external provider (``memory.provider``), one durable
  ``forget_user`` write (``memory/durable.py``) per account, queued in the same
  transaction as the deletions: the worker sends the provider's delete call, retried
  while it is down, also when ``mnemo users erase`` ran in another process.

A person whose accounts are linked (``links.py``) is erased whole: every linked
account goes, since they share one profile, budget and provider scope.

The rows and the backend's own files are the backend's (``PersonalData``: ``StateData``
in ``erasure_state.py`` for state.db, ``PgPersonalData`` in ``storage_pg/erasure.py``),
which deletes them in one transaction and then compacts what it touched (SQLite:
``VACUUM`` and a truncated WAL; PostgreSQL: ``VACUUM`` of each touched table). Skills,
media and copies are files under the home on either backend and go here.
"""

from __future__ import annotations

import asyncio
import glob
import json
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mnemo.gateway.config import Settings
from mnemo.gateway.logs import get_logger
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

LAYERS = (
    "profile",
    "sessions",
    "messages",
    "shared_messages",
    "inbox",
    "outbox",
    "jobs",
    "pairing",
    "cron_jobs",
    "usage",
    "rate_limits",
    "facts",
    "links",
    "journal",
    "mcp_tokens",
    "skills",
    "media",
    "media_usage",
    "copies",
    "backups",
    "provider",
)
# (accounts, delete) → archives (to be) rewritten; ``mnemo/backups.py`` ``scrub_backups``.
Scrub = Callable[[tuple[UserRef, ...], bool], Awaitable[int]]
PROVIDER_WRITE = "provider_write"  # the job kind of durable provider writes (gateway/jobs/provider_writes.py)


@dataclass(frozen=True, slots=True)
class Receipt:
    counts: dict[str, int] = field(default_factory=dict)
    # Layers this backend could not erase, with the reason (shown, never a silent 0).
    not_erased: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [
            f"  {layer}: not erased — {self.not_erased[layer]}"
            if layer in self.not_erased
            else f"  {layer}: {self.counts.get(layer, 0)}"
            for layer in LAYERS
        ]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Found:
    """One account's data in a backend: a count per layer, the media files only its
    messages name (removed with the rows), and the folders the backend erases itself
    (the SQLite profile folder), which are therefore no ``copies``."""

    counts: dict[str, int]
    media: list[str] = field(default_factory=list)
    folders: tuple[Path, ...] = ()


class PersonalData(Protocol):
    """One person's rows and backend-kept files, as a storage backend holds them
    (``StorageBackend.personal_data``). Called by ``Erasure`` only; raises ``StoreError``."""

    async def accounts(self, user: UserRef) -> tuple[UserRef, ...]:
        """``user`` and every account linked with it (they are erased together)."""
        ...

    async def count(self, account: UserRef) -> Found:
        """What ``delete`` would remove of ``account``, removing nothing."""
        ...

    async def delete(self, accounts: Sequence[UserRef]) -> list[Found]:
        """Remove every account's rows in one transaction (and queue the provider's
        ``forget_user``), then the backend's own files of them (profile, facts), then
        compact what was touched. The inbox row of a ``/forget me CODE`` being answered
        goes too: its receipt is sent without a row (``command.py``)."""
        ...

    async def forget_session(self, session_id: str) -> int:
        """Delete the messages of one ended session (and their search index entries):
        a chat whose memory policy is ``history: off`` keeps none. How many went."""
        ...


class Erasure:
    def __init__(self, data: PersonalData, settings: Settings, *, scrub: Scrub | None = None) -> None:
        self.data = data
        self.settings = settings
        self.scrub = scrub

    async def accounts(self, user: UserRef) -> tuple[UserRef, ...]:
        """Who an erasure of ``user`` removes: ``user`` and every account linked with it."""
        return await self.data.accounts(user)

    async def count(self, user: UserRef) -> Receipt:
        """The receipt of ``erase`` without deleting anything (``--dry-run``)."""
        total: dict[str, int] = {}
        accounts = await self.accounts(user)
        for account in accounts:
            found = await self.data.count(account)
            _add(total, await self._files(account, found, delete=False))
        return await self._backups(accounts, total, delete=False)

    async def erase(self, user: UserRef) -> Receipt:
        accounts = await self.accounts(user)
        total: dict[str, int] = {}
        for account, found in zip(accounts, await self.data.delete(accounts), strict=True):
            _add(total, await self._files(account, found, delete=True))
        receipt = await self._backups(accounts, total, delete=True)
        log.info("user_erased", user=str(user), accounts=len(accounts), **total)
        return receipt

    async def _backups(
        self, accounts: tuple[UserRef, ...], total: dict[str, int], *, delete: bool
    ) -> Receipt:
        if self.scrub is not None:
            total["backups"] = await self.scrub(accounts, delete)
        return Receipt(total)

    def _skill_dirs(self, user: UserRef) -> list[Path]:
        """Their own skills and those skills' history (``memory/skills/store.py``)."""
        root = self.settings.skills_dir
        return [root / "users" / user.platform / user.user_id, root / ".history" / "users" / str(user)]

    async def _files(self, user: UserRef, found: Found, *, delete: bool) -> dict[str, int]:
        counts = dict(found.counts)
        own, history = self._skill_dirs(user)
        skills = [d for d in (own, history) if d.is_dir()]
        counts["skills"] = sum(1 for _ in own.glob("*/SKILL.md")) if own.is_dir() else 0
        sent = [self.settings.home / "media" / name for name in found.media]
        counts["media"] = sum(1 for p in sent if p.is_file())
        live = {*found.folders, own, history}
        copies = [d for d in await asyncio.to_thread(_copies, self.settings.home, user) if d not in live]
        counts["copies"] = len(copies)
        if delete:

            def remove() -> None:
                for d in [*skills, *copies]:
                    if d.is_dir():
                        shutil.rmtree(d)
                for p in sent:
                    p.unlink(missing_ok=True)

            await asyncio.to_thread(remove)
        return counts


def _copies(home: Path, user: UserRef) -> list[Path]:
    """Every folder under ``home`` that holds a copy of ``user``'s profile or skills:
    ``…/users/<platform>/<id>/`` and ``…/.history/users/<platform>:<id>/``."""
    found: list[Path] = []
    for d in home.rglob(glob.escape(user.user_id)):
        if (
            d.is_dir()
            and not d.is_symlink()
            and d.parent.name == user.platform
            and d.parent.parent.name == "users"
        ):
            found.append(d)
    for d in home.rglob(glob.escape(str(user))):
        if (
            d.is_dir()
            and not d.is_symlink()
            and d.parent.name == "users"
            and d.parent.parent.name == ".history"
        ):
            found.append(d)
    return sorted(set(found))


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for layer, n in counts.items():
        total[layer] = total.get(layer, 0) + n


def media_names(metas: Sequence[str | None]) -> set[str]:
    """The media file names the messages' ``meta`` JSON refers to (plain names only: a
    name with a path separator or a leading dot is not one mnemo wrote)."""
    names: set[str] = set()
    for meta in metas:
        try:
            refs = json.loads(meta or "{}").get("media") or []
        except (ValueError, AttributeError):
            continue
        for ref in refs if isinstance(refs, list) else ():
            name = ref.get("file") if isinstance(ref, dict) else None
            if (
                isinstance(name, str)
                and name
                and "/" not in name
                and "\\" not in name
                and not name.startswith(".")
            ):
                names.add(name)
    return names
