"""A person's data on SQLite (``PersonalData`` of ``erasure.py``): their rows in
``state.db``, their USER.md folder under ``memories/`` and their holographic facts in
``facts.db``.

All state.db rows go in one transaction with ``secure_delete`` on; deleting through SQL
fires the FTS triggers, but an FTS5 delete only records a tombstone, so each index is
merged (``optimize``) for their words to leave it. Then ``VACUUM`` rebuilds the file and
``wal_checkpoint(TRUNCATE)`` empties the WAL, so no page of the file still holds their
text. External providers are never called from here: their delete waits in the job
queue (``provider`` layer) and the worker sends it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from mnemo.gateway.config import Settings
from mnemo.gateway.logs import get_logger
from mnemo.gateway.people.erasure import PROVIDER_WRITE, Found, media_names
from mnemo.gateway.people.links import members_within
from mnemo.gateway.people.media_usage import erase_usage_within
from mnemo.memory import journal_sqlite, policy
from mnemo.memory.db import Database
from mnemo.memory.durable import forget_user
from mnemo.memory.migrations import context_sql
from mnemo.memory.provider_config import provider_dir
from mnemo.memory.provider_scope import safe_id
from mnemo.memory.scope import UserRef
from mnemo.memory.writes import WriteOp

log = get_logger(__name__)

_FTS_INDEXES = ("messages_fts", "messages_cjk", "messages_ctx")

# Their own sessions: their DMs (P:dm:CHAT — on Discord the chat is a DM channel, not
# their id) and per-member group sessions (…:ID as the last part of a group key that
# has more parts than P:group:CHAT).
_OWN_SESSIONS = """
SELECT id FROM sessions WHERE platform = :p AND user_id = :u AND (
    substr(chat_key, 1, length(:p) + 4) = :p || ':dm:'
    OR (chat_key LIKE :p || ':group:%' AND substr(chat_key, -length(:u) - 1) = ':' || :u
        AND length(chat_key) - length(replace(chat_key, ':', '')) >= 3)
)"""
# Provider writes that carry their words: every payload names the speaker's scope.
_PROVIDER_JOBS = (
    "SELECT id FROM jobs WHERE kind = :kind AND json_valid(payload)"
    " AND json_extract(payload, '$.payload.scope.user_id') = :scope"
    " AND coalesce(json_extract(payload, '$.payload.op'), '') != :forget"
)


class BudgetRows(Protocol):
    """A person's spend and caps (``SqliteBudgets``), deleted inside the erasure's
    transaction. A port, so that people/ does not import budgets/ (which imports
    people/ for the linked accounts a budget is shared by)."""

    def erase_within(self, conn: sqlite3.Connection, payer: str) -> int: ...


class LocalWindow(Protocol):
    """This process's rate-limit window (``RateLimiter``, ``gateway/inbound/access.py``)."""

    def forget(self, key: str) -> None: ...


class StateData:
    """``PersonalData`` on ``state.db`` and the files beside it."""

    def __init__(
        self, db: Database, settings: Settings, budgets: BudgetRows, *, rate: LocalWindow | None = None
    ) -> None:
        """``rate``: this process's rate-limit window, which forgets the person too."""
        self.db = db
        self.settings = settings
        self.budgets = budgets
        self.rate = rate

    def _profile_dir(self, user: UserRef) -> Path:
        return self.settings.memories_dir / "users" / user.platform / user.user_id

    def _facts_db(self) -> Path:
        return provider_dir(self.settings.home, "holographic") / "facts.db"

    async def accounts(self, user: UserRef) -> tuple[UserRef, ...]:
        rows = await self.db.read(lambda conn: members_within(conn, str(user)))
        return tuple(UserRef.parse(m) for m in rows)

    async def count(self, account: UserRef) -> Found:
        from mnemo.providers.holographic.erasure import count_owner

        found: Found = await self.db.read(lambda conn: self._rows(conn, account, delete=False))
        self._files(account, found)
        found.counts["facts"] = await asyncio.to_thread(count_owner, self._facts_db(), str(account))
        return found

    async def delete(self, accounts: Sequence[UserRef]) -> list[Found]:
        from mnemo.providers.holographic.erasure import erase_owner

        def tx(conn: sqlite3.Connection) -> list[Found]:
            return [self._rows(conn, a, delete=True) for a in accounts]

        found = await self.db.write(tx)
        for account, f in zip(accounts, found, strict=True):
            self._files(account, f)
            f.counts["facts"] = await asyncio.to_thread(erase_owner, self._facts_db(), str(account))
            await asyncio.to_thread(_remove_tree, self._profile_dir(account))
            if self.rate is not None:
                self.rate.forget(str(account))
        await asyncio.to_thread(_compact, self.db.path)
        return found

    async def forget_session(self, session_id: str) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ?", (session_id,))]
            if ids:
                conn.execute(
                    "DELETE FROM message_vectors WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps(ids),),
                )
                _delete_messages(conn, ids)
            return len(ids)

        return int(await self.db.write(tx))

    def _files(self, user: UserRef, found: Found) -> None:
        folder = self._profile_dir(user)
        found.counts["profile"] = sum(1 for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0
        found.counts["rate_limits"] = 0  # kept in the process, never stored
        found.folders = (folder,)

    def _forget_at_provider(self, conn: sqlite3.Connection, user: UserRef, *, delete: bool) -> int:
        """Queue the external provider's delete for ``user`` (``forget_user``); 1 if queued."""
        name = self.settings.memory.provider
        if not name or name == "holographic":  # the built-in facts are erased above
            return 0
        if not delete:
            return 1
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
    ) -> Found:
        """Count (and with ``delete`` remove) their rows, and name the media files only
        their messages refer to."""
        p, u = user.platform, user.user_id
        who = {
            "p": p,
            "u": u,
            "kind": PROVIDER_WRITE,
            "scope": safe_id(str(user)),
            "forget": WriteOp.FORGET_USER.value,
        }
        own = [r[0] for r in conn.execute(_OWN_SESSIONS, who)]
        own_msgs = f"SELECT id FROM messages WHERE session_id IN ({_OWN_SESSIONS})"
        shared_msgs = (
            "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.platform = :p"
            f" AND m.author_id = :u AND m.role = 'user' AND m.session_id NOT IN ({_OWN_SESSIONS})"
        )
        inbox = (
            "SELECT id FROM inbox WHERE platform = :p AND (json_extract(payload, '$.user_id') = :u"
            " OR (chat_id = :u AND json_extract(payload, '$.chat_type') = 'dm'))"
        )
        outbox = (
            f"SELECT id FROM outbox WHERE session_id IN ({_OWN_SESSIONS})"
            " OR (platform = :p AND (mention_user_id = :u OR chat_id = :u))"
        )
        jobs = f"SELECT id FROM jobs WHERE session_id IN ({_OWN_SESSIONS}) UNION {_PROVIDER_JOBS}"
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
            "jobs": n(jobs),
            "pairing": n(pairing),
            "cron_jobs": n(cron),
            "usage": n("SELECT day FROM usage_days WHERE payer = :p || ':' || :u"),
            "media_usage": n("SELECT file FROM media_usage WHERE owner = :p || ':' || :u"),
            "links": n("SELECT member FROM identity_links WHERE member = :p || ':' || :u")
            + n("SELECT code_hash FROM link_codes WHERE user = :p || ':' || :u"),
            "mcp_tokens": n("SELECT id FROM mcp_tokens WHERE user = :p || ':' || :u"),
            "provider": self._forget_at_provider(conn, user, delete=False),
            "journal": journal_sqlite.erase_within(conn, str(user), time.time(), delete=False),
        }
        gone = [r[0] for r in conn.execute(f"{own_msgs} UNION {shared_msgs}", who)]
        found = Found(counts, _their_media(conn, gone))
        if not delete:
            return found
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
            _delete_messages(conn, gone)
            conn.execute(f"DELETE FROM outbox WHERE id IN ({outbox})", who)
            conn.execute(f"DELETE FROM inbox WHERE id IN ({inbox})", who)
            conn.execute(f"DELETE FROM jobs WHERE id IN ({jobs})", who)
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
            erase_usage_within(conn, str(user))
            conn.execute("DELETE FROM identity_links WHERE member = ?", (str(user),))
            conn.execute("DELETE FROM link_codes WHERE user = ?", (str(user),))
            conn.execute("DELETE FROM mcp_tokens WHERE user = ?", (str(user),))  # their MCP clients
            conn.execute("UPDATE identity_generation SET n = n + 1 WHERE id = 1")
            counts["provider"] = self._forget_at_provider(conn, user, delete=True)
            journal_sqlite.erase_within(conn, str(user), time.time(), delete=True)
            policy.erase_within(conn, str(user), delete=True)
            present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for index in (
                i for i in _FTS_INDEXES if i in present
            ):  # merge the segments: the tombstoned terms leave the index
                conn.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
        finally:
            conn.execute("PRAGMA secure_delete=OFF")
        return found


def _remove_tree(folder: Path) -> None:
    if folder.is_dir():
        shutil.rmtree(folder)


def _their_media(conn: sqlite3.Connection, ids: list[int]) -> list[str]:
    """The media files named by messages ``ids`` that no other message names (a file
    is named by its content's hash, so two people may share one)."""
    gone = json.dumps(ids)
    metas = [
        r[0]
        for r in conn.execute(
            "SELECT meta FROM messages WHERE id IN (SELECT value FROM json_each(?))", (gone,)
        )
    ]
    return sorted(
        name
        for name in media_names(metas)
        if conn.execute(
            "SELECT 1 FROM messages WHERE instr(meta, ?) > 0 AND id NOT IN (SELECT value FROM json_each(?)) LIMIT 1",
            (json.dumps(name), gone),
        ).fetchone()
        is None
    )


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
