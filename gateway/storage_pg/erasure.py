"""A person's data on PostgreSQL (``PersonalData`` of ``gateway/people/erasure.py``): the
same layers as on SQLite (``erasure_state.py``), with the same rules — their own
sessions (DMs, per-member group sessions) go whole, what they wrote in shared rooms goes
and the room stays, every linked account goes together — but as rows of the server
every replica shares: their USER.md row (``curated_memory``), their rate-limit window
(``rate_limit_users``/``rate_limit_hits``) and their holographic facts (the
``holographic`` schema, ``providers/holographic/erasure.py``).

Every row goes in one transaction (READ COMMITTED, under the links' advisory lock so
no replica links or unlinks them meanwhile); a message's search index is its own
generated ``tsvector`` columns, so it goes with the row. Afterwards ``VACUUM`` runs on
each touched table: the dead rows' space is reclaimed and their index entries removed
instead of waiting for autovacuum. What PostgreSQL still keeps of the old bytes (WAL,
free space not yet overwritten, base backups, replicas' copies) is the operator's to
expire: README, "Erasure on PostgreSQL".

The backup archives are scrubbed by ``Erasure`` itself (the app's ``scrub``), the same
on both backends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from mnemo.gateway.config import Settings
from mnemo.gateway.people.erasure import PROVIDER_WRITE, Found, media_names
from mnemo.gateway.storage_pg.budgets import PgBudgets
from mnemo.gateway.storage_pg.links import LINKS_LOCK, members_of
from mnemo.memory.durable import forget_user
from mnemo.memory.pg import journal as pg_journal
from mnemo.memory.pg import policy as pg_policy
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.provider_config import provider_dir
from mnemo.memory.provider_scope import safe_id
from mnemo.memory.scope import UserRef
from mnemo.memory.writes import WriteOp

# Every table an erasure may change; VACUUMed afterwards (names are constants, never input).
TOUCHED = (
    "messages",
    "sessions",
    "chats",
    "inbox",
    "outbox",
    "streams",
    "jobs",
    "cron_jobs",
    "cron_runs",
    "pairings",
    "usage_days",
    "budget_overrides",
    "budget_notices",
    "upkeep_requests",
    "identity_links",
    "link_codes",
    "mcp_tokens",
    "curated_memory",
    "rate_limit_users",
    "rate_limit_hits",
    "media_usage",
    "memory_journal",
    "memory_policies",
)

# Their own sessions: their DMs (P:dm:CHAT — on Discord the chat is a DM channel, not
# their id) and per-member group sessions (…:ID as the last part of a group key that
# has more parts than P:group:CHAT).
_OWN_SESSIONS = """
SELECT id FROM sessions WHERE platform = %(p)s AND user_id = %(u)s AND (
    starts_with(chat_key, %(p)s || ':dm:')
    OR (starts_with(chat_key, %(p)s || ':group:') AND right(chat_key, length(%(u)s) + 1) = ':' || %(u)s
        AND length(chat_key) - length(replace(chat_key, ':', '')) >= 3)
)"""
_OWN_MESSAGES = f"SELECT id FROM messages WHERE session_id IN ({_OWN_SESSIONS})"
_SHARED_MESSAGES = (
    "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.platform = %(p)s"
    f" AND m.author_id = %(u)s AND m.role = 'user' AND m.session_id NOT IN ({_OWN_SESSIONS})"
)
_INBOX = (
    "SELECT id FROM inbox WHERE platform = %(p)s AND (payload::jsonb ->> 'user_id' = %(u)s"
    " OR (chat_id = %(u)s AND payload::jsonb ->> 'chat_type' = 'dm'))"
)
_OUTBOX = (
    f"SELECT id FROM outbox WHERE session_id IN ({_OWN_SESSIONS})"
    " OR (platform = %(p)s AND (mention_user_id = %(u)s OR chat_id = %(u)s))"
)
# Their sessions' jobs, and the provider writes that carry their words (every payload
# names the speaker's scope); a queued forget_user stays.
_JOBS = (
    f"SELECT id FROM jobs WHERE session_id IN ({_OWN_SESSIONS})"
    " UNION SELECT id FROM jobs WHERE kind = %(kind)s"
    " AND payload::jsonb #>> '{payload,scope,user_id}' = %(scope)s"
    " AND coalesce(payload::jsonb #>> '{payload,op}', '') != %(forget)s"
)
_STREAMS = f"SELECT inbox_id FROM streams WHERE inbox_id IN ({_INBOX})"
_COUNTS = {
    "messages": _OWN_MESSAGES,
    "shared_messages": _SHARED_MESSAGES,
    "inbox": _INBOX,
    "outbox": _OUTBOX,
    "jobs": _JOBS,
    "pairing": "SELECT code FROM pairings WHERE platform = %(p)s AND user_id = %(u)s",
    "cron_jobs": "SELECT id FROM cron_jobs WHERE platform = %(p)s AND user_id = %(u)s",
    "usage": "SELECT day FROM usage_days WHERE payer = %(who)s",
    "media_usage": "SELECT file FROM media_usage WHERE owner = %(who)s",
    "links": "SELECT member FROM identity_links WHERE member = %(who)s"
    " UNION ALL SELECT code_hash FROM link_codes WHERE usr = %(who)s",
    "mcp_tokens": 'SELECT id FROM mcp_tokens WHERE "user" = %(who)s',
    "profile": "SELECT owner FROM curated_memory WHERE target = 'user' AND owner = %(who)s",
    "rate_limits": "SELECT key FROM rate_limit_users WHERE key = %(who)s",  # their window (hits go with it)
}


async def _column(conn: Connection, sql: str, args: dict[str, Any] | Sequence[Any]) -> list[Any]:
    return [next(iter(r.values())) for r in await (await conn.execute(sql, args)).fetchall()]


class PgPersonalData:
    """``PersonalData`` on PostgreSQL (plus a ``facts.db`` left in the home from before
    ``mnemo migrate``, whose facts of the person go too)."""

    def __init__(self, db: PgDatabase, settings: Settings, budgets: PgBudgets) -> None:
        self.db = db
        self.settings = settings
        self.budgets = budgets

    async def accounts(self, user: UserRef) -> tuple[UserRef, ...]:
        async def q(conn: Connection) -> list[str]:
            return await members_of(conn, str(user))

        return tuple(UserRef.parse(m) for m in await self.db.read(q))

    async def count(self, account: UserRef) -> Found:
        found: Found = await self.db.read(lambda conn: self._rows(conn, account, delete=False))
        found.counts["facts"] = await asyncio.to_thread(self._facts, account, delete=False)
        return found

    async def delete(self, accounts: Sequence[UserRef]) -> list[Found]:
        async def tx(conn: Connection) -> list[Found]:
            await conn.execute(LINKS_LOCK)  # no replica links or unlinks them meanwhile
            return [await self._rows(conn, a, delete=True) for a in accounts]

        found = await self.db.write(tx)
        for account, f in zip(accounts, found, strict=True):
            f.counts["facts"] = await asyncio.to_thread(self._facts, account, delete=True)
        await self.db.vacuum(TOUCHED)
        return found

    async def forget_session(self, session_id: str) -> int:
        async def tx(conn: Connection) -> int:
            cur = await conn.execute("DELETE FROM messages WHERE session_id = %s", (session_id,))
            return cur.rowcount

        return int(await self.db.write(tx))

    def _facts(self, account: UserRef, *, delete: bool) -> int:
        """Their holographic facts on the server, and in a ``facts.db`` left from SQLite."""
        from mnemo.providers.holographic import erasure

        leftover = provider_dir(self.settings.home, "holographic") / "facts.db"
        if delete:
            return erasure.erase_owner_pg(self.db.url, str(account)) + erasure.erase_owner(
                leftover, str(account)
            )
        return erasure.count_owner_pg(self.db.url, str(account)) + erasure.count_owner(leftover, str(account))

    async def _rows(self, conn: Connection, user: UserRef, *, delete: bool) -> Found:
        who: dict[str, Any] = {
            "p": user.platform,
            "u": user.user_id,
            "who": str(user),
            "kind": PROVIDER_WRITE,
            "scope": safe_id(str(user)),
            "forget": WriteOp.FORGET_USER.value,
        }
        own = await _column(conn, _OWN_SESSIONS, who)
        counts = {"sessions": len(own)}
        for layer, sql in _COUNTS.items():
            counts[layer] = len(await _column(conn, sql, who))
        counts["provider"] = int(self._provider() is not None)
        counts["journal"] = await pg_journal.erase_within(conn, str(user), time.time(), delete=False)
        gone = await _column(conn, f"{_OWN_MESSAGES} UNION {_SHARED_MESSAGES}", who)
        found = Found(counts, await _their_media(conn, gone))
        if not delete:
            return found
        chats = await _column(
            conn, f"SELECT DISTINCT chat_no FROM sessions WHERE id IN ({_OWN_SESSIONS})", who
        )
        await conn.execute("DELETE FROM messages WHERE id = ANY(%s)", (gone,))
        await conn.execute(f"DELETE FROM streams WHERE inbox_id IN ({_STREAMS})", who)
        await conn.execute(f"DELETE FROM outbox WHERE id IN ({_OUTBOX})", who)
        await conn.execute(f"DELETE FROM inbox WHERE id IN ({_INBOX})", who)
        await conn.execute(f"DELETE FROM jobs WHERE id IN ({_JOBS})", who)
        await conn.execute("UPDATE cron_runs SET session_id = NULL WHERE session_id = ANY(%s)", (own,))
        await conn.execute("DELETE FROM cron_jobs WHERE platform = %(p)s AND user_id = %(u)s", who)
        await conn.execute(
            "UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id = ANY(%s) AND NOT id = ANY(%s)",
            (own, own),
        )
        await conn.execute("DELETE FROM sessions WHERE id = ANY(%s)", (own,))
        # A shared room they happened to open stays the room's; it no longer names them.
        await conn.execute(
            "UPDATE sessions SET user_id = NULL WHERE platform = %(p)s AND user_id = %(u)s", who
        )
        await conn.execute(
            "DELETE FROM chats c WHERE c.id = ANY(%s) AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.chat_no = c.id)",
            (chats,),
        )
        await conn.execute("DELETE FROM pairings WHERE platform = %(p)s AND user_id = %(u)s", who)
        await self.budgets.erase_within(conn, str(user))
        await conn.execute("DELETE FROM identity_links WHERE member = %(who)s", who)
        await conn.execute("DELETE FROM link_codes WHERE usr = %(who)s", who)
        await conn.execute('DELETE FROM mcp_tokens WHERE "user" = %(who)s', who)  # their MCP clients
        await conn.execute("UPDATE identity_generation SET n = n + 1 WHERE id = 1")
        await conn.execute("DELETE FROM curated_memory WHERE target = 'user' AND owner = %(who)s", who)
        await conn.execute("DELETE FROM rate_limit_hits WHERE key = %(who)s", who)
        await conn.execute("DELETE FROM rate_limit_users WHERE key = %(who)s", who)
        await conn.execute("DELETE FROM media_usage WHERE owner = %(who)s", who)
        await self._forget_at_provider(conn, user)
        await pg_journal.erase_within(conn, str(user), time.time(), delete=True)
        await pg_policy.erase_within(conn, str(user), delete=True)
        return found

    def _provider(self) -> str | None:
        """The external provider to send ``forget_user`` to (the built-in facts are
        erased here)."""
        name = self.settings.memory.provider
        return None if not name or name == "holographic" else name

    async def _forget_at_provider(self, conn: Connection, user: UserRef) -> None:
        """Queue the external provider's delete for ``user`` in this transaction."""
        name = self._provider()
        if name is None:
            return
        # A row as gateway/jobs/provider_writes.py queues it: no session, the write's
        # dedupe key, single flight on that key (a later erasure is sent again).
        payload = forget_user(str(user))
        key, now = f"{name}:{payload['key']}", time.time()
        # The same lock as PgJobStore.add takes for a key: the check and the insert see the same rows.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (f"jobs-key:{key}",))
        await conn.execute(
            "INSERT INTO jobs(kind, session_id, dedupe_key, payload, not_before, created_at, updated_at)"
            " SELECT %s, '', %s, %s, %s, %s, %s WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE dedupe_key = %s"
            " AND state IN ('queued', 'running')) ON CONFLICT DO NOTHING",
            (PROVIDER_WRITE, key, json.dumps({"provider": name, "payload": payload}), now, now, now, key),
        )


async def _their_media(conn: Connection, ids: list[int]) -> list[str]:
    """The media files named by messages ``ids`` that no other message names (a file
    is named by its content's hash, so two people may share one)."""
    metas = await _column(conn, "SELECT meta FROM messages WHERE id = ANY(%s)", (ids,))
    theirs = []
    for name in sorted(media_names(metas)):
        other = await (
            await conn.execute(
                "SELECT 1 FROM messages WHERE strpos(meta, %s) > 0 AND NOT id = ANY(%s) LIMIT 1",
                (json.dumps(name), ids),
            )
        ).fetchone()
        if other is None:
            theirs.append(name)
    return theirs
