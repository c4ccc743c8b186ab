"""Erasure: forget one person in every layer, and out of the database files.

What goes (``Receipt.counts`` names each layer):

* ``profile`` — their USER.md folder (``memories/users/P/ID``: the file, its ``.lock``
  and any temp file of an interrupted write);
* ``sessions`` / ``messages`` — their own sessions (the DM, their per-member group
  sessions, cron runs in them) with every message, job and queued reply of those
  sessions, and the chats' search scope rows;
* ``shared_messages`` — what they wrote in shared-room sessions (the others' stay);
* ``inbox`` / ``outbox`` — their inbound messages and what was sent to them or for them;
* ``pairing``, ``cron_jobs`` (jobs that speak for them), ``usage`` (counters, caps);
* ``facts`` — holographic facts owned by them (``facts.db``);
* ``links`` — their identity links and pending ``/link`` codes;
* ``skills`` — their own skills (``skills/users/P/ID``) and those skills' history;
* ``media`` — files they sent (``media/``, named in their messages' ``meta``) that no
  remaining message still refers to;
* ``copies`` — copies of their profile or skill folders anywhere else under the home
  (``.replaced-*/`` left by ``mnemo import``, an unpacked archive): every
  ``…/users/P/ID/`` and ``…/.history/users/P:ID/`` folder;
* ``backups`` — the backup archives (``backup.dir``), each restored into a scratch
  folder, erased there the same way and written again (``scrub`` from the app:
  ``mnemo/backups.py``; the gateway cannot import it);
* ``provider`` — for an external provider (``memory.provider``), one durable
  ``forget_user`` write (``memory/durable.py``) per account, queued in the same
  transaction as the deletions: the worker sends the provider's delete call, retried
  while it is down, also when ``mnemo users erase`` ran in another process.

A person whose accounts are linked (``links.py``) is erased whole: every linked
account goes, since they share one profile, budget and provider scope.

All state.db rows go in one transaction with ``secure_delete`` on; deleting through SQL
fires the FTS triggers, but an FTS5 delete only records a tombstone, so each index is
merged (``optimize``) for their words to leave it. Then ``VACUUM`` rebuilds the file and
``wal_checkpoint(TRUNCATE)`` empties the WAL, so no page of the file still holds their
text. External providers are never called from here: their delete waits in the job
queue (``provider`` above) and the worker sends it.
"""

from __future__ import annotations

import asyncio
import glob
import json
import shutil
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mnemo.gateway.config import Settings
from mnemo.gateway.logs import get_logger
from mnemo.gateway.people.links import members_within
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.db import Database
from mnemo.memory.migrations import context_sql
from mnemo.memory.provider_config import provider_dir
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

LAYERS = (
    "profile",
    "sessions",
    "messages",
    "shared_messages",
    "inbox",
    "outbox",
    "pairing",
    "cron_jobs",
    "usage",
    "facts",
    "links",
    "skills",
    "media",
    "copies",
    "backups",
    "provider",
)
# (accounts, delete) → archives (to be) rewritten; ``mnemo/backups.py`` ``scrub_backups``.
Scrub = Callable[[tuple[UserRef, ...], bool], Awaitable[int]]
PROVIDER_WRITE = "provider_write"  # the job kind of durable provider writes (gateway/jobs/provider_writes.py)
_FTS_INDEXES = ("messages_fts", "messages_cjk", "messages_ctx")


@dataclass(frozen=True, slots=True)
class Receipt:
    counts: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"  {layer}: {self.counts.get(layer, 0)}" for layer in LAYERS]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# Their own sessions: their DMs (P:dm:CHAT — on Discord the chat is a DM channel, not
# their id) and per-member group sessions (…:ID as the last part of a group key that
# has more parts than P:group:CHAT).
_OWN_SESSIONS = """
SELECT id FROM sessions WHERE platform = :p AND user_id = :u AND (
    substr(chat_key, 1, length(:p) + 4) = :p || ':dm:'
    OR (chat_key LIKE :p || ':group:%' AND substr(chat_key, -length(:u) - 1) = ':' || :u
        AND length(chat_key) - length(replace(chat_key, ':', '')) >= 3)
)"""


class BudgetRows(Protocol):
    """A person's spend and caps (``SqliteBudgets``), deleted inside the erasure's
    transaction. A port, so that people/ does not import budgets/ (which imports
    people/ for the linked accounts a budget is shared by)."""

    def erase_within(self, conn: sqlite3.Connection, payer: str) -> int: ...


class Erasure:
    def __init__(
        self, db: Database, settings: Settings, budgets: BudgetRows, *, scrub: Scrub | None = None
    ) -> None:
        self.db = db
        self.settings = settings
        self.budgets = budgets
        self.scrub = scrub

    def _profile_dir(self, user: UserRef) -> Path:
        return MemoryFiles(self.settings.memories_dir).user(user).path.parent

    def _facts_db(self) -> Path:
        return provider_dir(self.settings.home, "holographic") / "facts.db"

    async def accounts(self, user: UserRef) -> tuple[UserRef, ...]:
        """Who an erasure of ``user`` removes: ``user`` and every account linked with it."""
        rows = await self.db.read(lambda conn: members_within(conn, str(user)))
        return tuple(UserRef.parse(m) for m in rows)

    async def count(self, user: UserRef) -> Receipt:
        """The receipt of ``erase`` without deleting anything (``--dry-run``)."""
        total: dict[str, int] = {}
        for account in await self.accounts(user):
            media: list[str] = []
            counts = await self.db.read(
                lambda conn, a=account, m=media: self._rows(conn, a, delete=False, media=m)
            )
            _add(total, await self._files(account, counts, media, delete=False))
        if self.scrub is not None:
            total["backups"] = await self.scrub(await self.accounts(user), False)
        return Receipt(total)

    async def erase(self, user: UserRef, *, keep: tuple[str, str] | None = None) -> Receipt:
        """``keep``: (chat id, message id) of the ``/forget me CODE`` being answered, whose
        inbox row the pipeline still marks done (it holds only the command)."""
        accounts = await self.accounts(user)

        media: list[list[str]] = [[] for _ in accounts]

        def tx(conn: sqlite3.Connection) -> list[dict[str, int]]:
            return [
                self._rows(conn, a, delete=True, keep=keep, media=m)
                for a, m in zip(accounts, media, strict=True)
            ]

        total: dict[str, int] = {}
        for account, counts, files in zip(accounts, await self.db.write(tx), media, strict=True):
            _add(total, await self._files(account, counts, files, delete=True))
        await asyncio.to_thread(_compact, self.db.path)
        if self.scrub is not None:
            total["backups"] = await self.scrub(accounts, True)
        log.info("user_erased", user=str(user), accounts=len(accounts), **total)
        return Receipt(total)

    def _skill_dirs(self, user: UserRef) -> list[Path]:
        """Their own skills and those skills' history (``memory/skills/store.py``)."""
        root = self.settings.skills_dir
        return [root / "users" / user.platform / user.user_id, root / ".history" / "users" / str(user)]

    async def _files(
        self, user: UserRef, counts: dict[str, int], media: list[str], *, delete: bool
    ) -> dict[str, int]:
        from mnemo.providers.holographic.erasure import count_owner, erase_owner

        folder = self._profile_dir(user)
        counts["profile"] = sum(1 for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0
        facts = self._facts_db()
        counts["facts"] = await asyncio.to_thread(erase_owner if delete else count_owner, facts, str(user))
        skills = [d for d in self._skill_dirs(user) if d.is_dir()]
        own = self._skill_dirs(user)[0]  # their skills now; their history goes with them
        counts["skills"] = sum(1 for _ in own.glob("*/SKILL.md")) if own.is_dir() else 0
        sent = [self.settings.home / "media" / name for name in media]
        counts["media"] = sum(1 for p in sent if p.is_file())
        live = {folder, *self._skill_dirs(user)}
        copies = [d for d in await asyncio.to_thread(_copies, self.settings.home, user) if d not in live]
        counts["copies"] = len(copies)
        if delete:

            def remove() -> None:
                for d in [folder, *skills, *copies]:
                    if d.is_dir():
                        shutil.rmtree(d)
                for p in sent:
                    p.unlink(missing_ok=True)

            await asyncio.to_thread(remove)
        return counts

    def _forget_at_provider(self, conn: sqlite3.Connection, user: UserRef, *, delete: bool) -> int:
        """Queue the external provider's delete for ``user`` (``forget_user``); 1 if queued."""
        name = self.settings.memory.provider
        if not name or name == "holographic":  # the built-in facts are erased above
            return 0
        if not delete:
            return 1
        from mnemo.memory.durable import forget_user

        # A row as gateway/jobs/provider_writes.py queues it: no session, the write's
        # dedupe key, single flight on that key (a later erasure is sent again).
        payload = forget_user(str(user))
        key, now = f"{name}:{payload['key']}", time.time()
        busy = conn.execute(
            "SELECT 1 FROM jobs WHERE dedupe_key = ? AND state IN ('queued', 'running')", (key,)
        ).fetchone()
        if busy is None:
            conn.execute(
                "INSERT INTO jobs(kind, session_id, dedupe_key, payload, not_before, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?)",
                (PROVIDER_WRITE, "", key, json.dumps({"provider": name, "payload": payload}), now, now, now),
            )
        return 1

    def _rows(
        self,
        conn: sqlite3.Connection,
        user: UserRef,
        *,
        delete: bool,
        keep: tuple[str, str] | None = None,
        media: list[str] | None = None,
    ) -> dict[str, int]:
        """Count (and with ``delete`` remove) their rows; the media files only their
        messages refer to are appended to ``media`` for ``_files``."""
        p, u = user.platform, user.user_id
        kc, km = keep or (None, None)
        who = {"p": p, "u": u, "kc": kc, "km": km}
        own = [r[0] for r in conn.execute(_OWN_SESSIONS, who)]
        own_msgs = f"SELECT id FROM messages WHERE session_id IN ({_OWN_SESSIONS})"
        shared_msgs = (
            "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.platform = :p"
            f" AND m.author_id = :u AND m.role = 'user' AND m.session_id NOT IN ({_OWN_SESSIONS})"
        )
        inbox = (
            "SELECT id FROM inbox WHERE platform = :p AND (json_extract(payload, '$.user_id') = :u"
            " OR (chat_id = :u AND json_extract(payload, '$.chat_type') = 'dm'))"
            " AND NOT (chat_id IS :kc AND message_id IS :km)"
        )
        outbox = (
            f"SELECT id FROM outbox WHERE session_id IN ({_OWN_SESSIONS})"
            " OR (platform = :p AND (mention_user_id = :u OR chat_id = :u))"
        )
        cron = "SELECT id FROM cron_jobs WHERE platform = :p AND user_id = :u"
        pairing = "SELECT code FROM pairings WHERE platform = :p AND user_id = :u"

        def n(sql: str) -> int:
            return int(conn.execute(f"SELECT COUNT(*) FROM ({sql})", who).fetchone()[0])

        counts = {
            "sessions": len(own),
            "messages": n(own_msgs),
            "shared_messages": n(shared_msgs),
            "inbox": n(inbox),
            "outbox": n(outbox),
            "pairing": n(pairing),
            "cron_jobs": n(cron),
            "usage": n("SELECT day FROM usage_days WHERE payer = :p || ':' || :u"),
            "links": n("SELECT member FROM identity_links WHERE member = :p || ':' || :u")
            + n("SELECT code_hash FROM link_codes WHERE user = :p || ':' || :u"),
            "provider": self._forget_at_provider(conn, user, delete=delete),
        }
        if media is not None:
            media += _their_media(conn, [r[0] for r in conn.execute(f"{own_msgs} UNION {shared_msgs}", who)])
        if not delete:
            return counts
        conn.execute("PRAGMA secure_delete=ON")
        try:
            chats = [
                r[0]
                for r in conn.execute(
                    f"SELECT DISTINCT chat_no FROM sessions WHERE id IN ({_OWN_SESSIONS})", who
                )
            ]
            names = [
                r[0]
                for r in conn.execute(
                    f"SELECT DISTINCT author_name FROM messages WHERE id IN ({shared_msgs}) AND"
                    " author_name IS NOT NULL",
                    who,
                )
            ]
            conn.execute(
                f"DELETE FROM message_vectors WHERE id IN ({own_msgs}) OR id IN ({shared_msgs})", who
            )
            _delete_messages(conn, [r[0] for r in conn.execute(f"{own_msgs} UNION {shared_msgs}", who)])
            conn.execute(f"DELETE FROM outbox WHERE id IN ({outbox})", who)
            conn.execute(f"DELETE FROM inbox WHERE id IN ({inbox})", who)
            conn.execute(f"DELETE FROM jobs WHERE session_id IN ({_OWN_SESSIONS})", who)
            conn.execute(f"UPDATE cron_runs SET session_id = NULL WHERE session_id IN ({_OWN_SESSIONS})", who)
            conn.execute(f"DELETE FROM cron_jobs WHERE id IN ({cron})", who)
            conn.execute(f"DELETE FROM sessions WHERE id IN ({_OWN_SESSIONS})", who)
            # A shared room they happened to open stays the room's; it no longer names them.
            conn.execute("UPDATE sessions SET user_id = NULL WHERE platform = :p AND user_id = :u", who)
            for chat_no in chats:
                if (
                    conn.execute("SELECT 1 FROM sessions WHERE chat_no = ? LIMIT 1", (chat_no,)).fetchone()
                    is None
                ):
                    conn.execute("DELETE FROM chat_speakers WHERE chat_no = ?", (chat_no,))
                    conn.execute("DELETE FROM chats WHERE id = ?", (chat_no,))
            for name in names:  # their name as a speaker of shared rooms where nobody else bears it
                conn.execute(
                    "DELETE FROM chat_speakers WHERE name = ? AND NOT EXISTS (SELECT 1 FROM messages m"
                    " WHERE m.chat_no = chat_speakers.chat_no AND m.author_name = ?)",
                    (name, name),
                )
            conn.execute(f"DELETE FROM pairings WHERE code IN ({pairing})", who)
            self.budgets.erase_within(conn, str(user))
            conn.execute("DELETE FROM identity_links WHERE member = ?", (str(user),))
            conn.execute("DELETE FROM link_codes WHERE user = ?", (str(user),))
            conn.execute("UPDATE identity_generation SET n = n + 1 WHERE id = 1")
            present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for index in (
                i for i in _FTS_INDEXES if i in present
            ):  # merge the segments: the tombstoned terms leave the index
                conn.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
        finally:
            conn.execute("PRAGMA secure_delete=OFF")
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


def _their_media(conn: sqlite3.Connection, ids: list[int]) -> list[str]:
    """The media files named by messages ``ids`` that no other message names (a file
    is named by its content's hash, so two people may share one)."""
    gone = json.dumps(ids)
    names: set[str] = set()
    for (meta,) in conn.execute(
        "SELECT meta FROM messages WHERE id IN (SELECT value FROM json_each(?))", (gone,)
    ):
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
    return sorted(
        name
        for name in names
        if conn.execute(
            "SELECT 1 FROM messages WHERE instr(meta, ?) > 0 AND id NOT IN (SELECT value FROM json_each(?)) LIMIT 1",
            (json.dumps(name), gone),
        ).fetchone()
        is None
    )


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for layer, n in counts.items():
        total[layer] = total.get(layer, 0) + n


def _delete_messages(conn: sqlite3.Connection, ids: list[int]) -> None:
    """Delete messages so that the contextual index forgets them too.

    ``messages_ctx`` is contentless: a row is removed by repeating the values it was
    indexed with, and its context holds the previous turn of the session. So rows go
    newest first (each one's previous turn still there when its delete recomputes the
    context), and a message that stays but follows a deleted one (the next speaker in a
    shared room) is re-indexed, since its context quoted the erased text."""
    gone = set(ids)
    ctx = context_sql("m")
    follow = [
        r[0]
        for r in conn.execute(
            "SELECT m.id FROM messages m WHERE (SELECT p.id FROM messages p WHERE p.session_id = m.session_id"
            " AND p.id < m.id ORDER BY p.id DESC LIMIT 1) IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted(gone)),),
        )
        if r[0] not in gone
    ]
    reindex = (
        f"INSERT INTO messages_ctx(messages_ctx, rowid, content, context, scope) SELECT 'delete', m.id,"
        f" m.content, {ctx}, 'c' || m.chat_no FROM messages m WHERE m.id = ?"
    )
    for mid in follow:
        conn.execute(reindex, (mid,))
    for mid in sorted(gone, reverse=True):
        conn.execute("DELETE FROM messages WHERE id = ?", (mid,))
    for mid in follow:
        conn.execute(
            f"INSERT INTO messages_ctx(rowid, content, context, scope) SELECT m.id, m.content, {ctx},"
            " 'c' || m.chat_no FROM messages m WHERE m.id = ?",
            (mid,),
        )


def _compact(path: Path) -> None:
    """VACUUM, then checkpoint and truncate the WAL; readers of the running gateway may
    briefly hold it, so the checkpoint is retried until it completes."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("VACUUM")
        for _ in range(100):
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            time.sleep(0.05)
        log.warning("erase_checkpoint_incomplete", path=str(path))
    finally:
        conn.close()
