"""The backend-neutral form of a profile's data: the tables an archive holds, each
column's kind, and one JSON object per row (JSON lines, one file per table, member
``data/<group>/<table>.jsonl``). The same on every backend: a PostgreSQL archive
restores into SQLite and back.

Kinds and how a value is written (``null`` for a missing value in any kind)::

    text     a JSON string
    integer  a JSON number without fraction
    real     a JSON number
    boolean  true / false
    time     a string, ISO 8601 in UTC with microseconds: 2026-01-10T03:00:00.000000+00:00
    bytes    a string, base64 (RFC 4648, with padding)

Groups: ``state`` (sessions, messages and the gateway's tables, in load order:
parents before children) and ``holographic`` (the holographic provider's facts, only
when the profile has them). The curated memory is no table: MEMORY.md and every USER.md
go as the files they are on SQLite (``memories/…``), whichever backend holds them.

Never in an archive (``LOCAL``): what belongs to one database rather than to the
profile — its schema history, SQLite search's own indexes (rebuilt from the messages),
PostgreSQL's replicas, claims and leases, the rate limit's one-minute window. A
restore starts them afresh.

A column list only grows: a later mnemo that adds a column reads older archives (the
column gets its default); this one refuses an archive naming a column it does not
know (from a newer mnemo) rather than drop it silently.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, TypeAlias

from mnemo.gateway.errors import UnsafeArchive
from mnemo.memory.atomic import ensure_folder
from mnemo.memory.sessions import to_db_time

JsonValue: TypeAlias = str | int | float | bool | None
Row: TypeAlias = dict[str, Any]  # column -> value as the database takes it (decoded)


class Kind(StrEnum):
    TEXT = "text"
    INTEGER = "integer"
    REAL = "real"
    BOOLEAN = "boolean"
    TIME = "time"
    BYTES = "bytes"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class Table:
    group: str
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # the primary key

    @property
    def label(self) -> str:
        return f"{self.group}/{self.name}"

    @property
    def member(self) -> str:
        return f"data/{self.group}/{self.name}.jsonl"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def kind(self, column: str) -> Kind:
        for c in self.columns:
            if c.name == column:
                return c.kind
        raise KeyError(column)


STATE = "state"
HOLOGRAPHIC = "holographic"
MEMORIES = "memories"  # the folder of the curated files inside an archive


def _table(group: str, name: str, key: str, columns: str) -> Table:
    """``columns`` as "name kind, name kind, …" (read like a CREATE TABLE)."""
    pairs = [c.split() for c in columns.split(",") if c.strip()]
    return Table(group, name, tuple(Column(n, Kind(k)) for n, k in pairs), tuple(key.split(",")))


# Load order: a row's parents come first (chats, sessions, messages; cron jobs, runs).
STATE_TABLES: tuple[Table, ...] = (
    _table(STATE, "chats", "id", "id integer, chat_key text"),
    _table(
        STATE,
        "sessions",
        "id",
        """id text, chat_no integer, chat_key text, platform text, chat_id text, thread_id text,
        user_id text, agent_context text, source text, model text, system_prompt text,
        parent_session_id text, started_at time, ended_at time, end_reason text,
        message_count integer, tool_call_count integer, input_tokens integer, output_tokens integer,
        cache_read_tokens integer, cache_write_tokens integer, estimated_cost_usd real, title text""",
    ),
    _table(
        STATE,
        "messages",
        "id",
        """id integer, session_id text, chat_no integer, role text, content text, tool_calls text,
        tool_call_id text, tool_name text, is_error boolean, author_id text, author_name text,
        platform_message_id text, created_at time, token_count integer, finish_reason text,
        meta text, cjk text""",
    ),
    _table(
        STATE,
        "inbox",
        "id",
        """id integer, platform text, chat_id text, message_id text, payload text, state text,
        attempts integer, error text, received_at time, updated_at time""",
    ),
    _table(
        STATE,
        "outbox",
        "id",
        """id integer, platform text, chat_id text, thread_id text, text text, kind text,
        reply_to text, mention_user_id text, session_id text, inbox_id integer, state text,
        attempts integer, possible_duplicate boolean, not_before real, created_at real,
        sent_at real, platform_ids text, error text""",
    ),
    _table(
        STATE,
        "streams",
        "inbox_id",
        "inbox_id integer, platform text, chat_id text, thread_id text, message_id text, created_at real",
    ),
    _table(
        STATE,
        "pairings",
        "code",
        """code text, platform text, user_id text, user_name text, state text, created_at real,
        decided_at real, decided_by text""",
    ),
    _table(
        STATE,
        "jobs",
        "id",
        """id integer, kind text, session_id text, payload text, state text, attempts integer,
        not_before real, checkpoint text, error text, created_at real, updated_at real,
        started_at real, finished_at real, dedupe_key text""",
    ),
    _table(
        STATE,
        "cron_jobs",
        "id",
        """id text, platform text, chat_id text, chat_type text, thread_id text, user_id text,
        source text, created_by text, prompt text, schedule_kind text, schedule text,
        timezone text, start_at real, state text, next_run_at real, last_run_at real,
        last_result text, rev integer, created_at real, updated_at real""",
    ),
    _table(
        STATE,
        "cron_runs",
        "id",
        """id integer, job_id text, trigger text, state text, scheduled_for real,
        requested_at real, started_at real, finished_at real, pid integer, session_id text,
        outbox_id integer, detail text""",
    ),
    _table(
        STATE,
        "usage_days",
        "payer,day",
        "payer text, day text, cost_usd real, tokens integer, requests integer",
    ),
    _table(
        STATE,
        "budget_overrides",
        "payer",
        "payer text, daily_usd real, monthly_usd real, daily_tokens integer, updated_at real",
    ),
    _table(STATE, "budget_notices", "payer", "payer text, resets_at text"),
    _table(
        STATE,
        "upkeep_requests",
        "id",
        """id integer, at real, day text, session_id text, kind text, payer text, input_tokens integer,
        output_tokens integer, cache_read_tokens integer, cache_write_tokens integer, cost_usd real""",
    ),
    _table(STATE, "identity_links", "member", "member text, canonical text, linked_at real, linked_by text"),
    _table(STATE, "link_codes", "code_hash", "code_hash text, user text, expires_at real"),
    _table(
        STATE,
        "media_usage",
        "owner,kind,file",
        "owner text, kind text, file text, bytes integer, day text, created_at real",
    ),
    _table(
        STATE,
        "memory_journal",
        "id",
        """id integer, at real, layer text, target text, op text, old text, new text, since real,
        until real, actor text, trust text, speaker text, session text, message text, chat text,
        tool_call text, reverts integer, note text, state text, evidence text, dedupe text""",
    ),
    _table(
        STATE,
        "memory_policies",
        "scope,key",
        "scope text, key text, remember text, groups text, history text, updated_at real, updated_by text",
    ),
)

FACT_TABLES: tuple[Table, ...] = (
    _table(
        HOLOGRAPHIC,
        "facts",
        "id",
        """id integer, owner text, content text, category text, tags text, source text,
        trust real, retrieval_count integer, helpful_count integer, created_at real,
        updated_at real, vector bytes""",
    ),
    _table(HOLOGRAPHIC, "entities", "id", "id integer, name text, name_lc text, type text"),
    _table(HOLOGRAPHIC, "fact_entities", "fact_id,entity_id", "fact_id integer, entity_id integer"),
    _table(
        HOLOGRAPHIC,
        "memory_banks",
        "owner,category",
        "owner text, category text, fact_count integer, phasor_sum bytes, updated_at real",
    ),
    _table(HOLOGRAPHIC, "meta", "key", "key text, value text"),
)

TABLES: tuple[Table, ...] = STATE_TABLES + FACT_TABLES
BY_LABEL: dict[str, Table] = {t.label: t for t in TABLES}

# What is never archived, and why (README "Backups and export"; the format test checks
# that every table and column of both backends is either archived or listed here).
LOCAL: dict[str, str] = {
    "schema_migrations": "the database's own schema history (the target applies its own)",
    "identity_generation": "a change counter of the links cache in this database",
    "chat_speakers": "SQLite search's index, rebuilt from the messages",
    "search_reindex": "SQLite search's re-indexing progress",
    "message_vectors": "semantic search embeddings, recomputed in the background",
    "replicas": "the processes serving this PostgreSQL database",
    "rate_limit_users": "the rate limit's one-minute window",
    "rate_limit_hits": "the rate limit's one-minute window",
    "curated_memory": "MEMORY.md and USER.md rows: archived as the files memories/…",
    "journal_marks": "the crash evidence of a layer's own database (memory/journal.py), settled at start",
    "mcp_tokens": "MCP client credentials of this installation: create new tokens after a restore",
    "mcp_catalogs": "the MCP servers' tool lists, fetched again at start",
    "mcp_reloads": "MCP reload requests between the replicas of this database",
    "sessions.seq": "PostgreSQL's insertion order, given again on load",
    "messages.tsv": "PostgreSQL's generated search vector",
    "messages.cjk_tsv": "PostgreSQL's generated search vector",
    "facts.tsv": "PostgreSQL's generated search vector",
    "inbox.owner": "a replica's claim",
    "jobs.owner": "a replica's claim",
    "jobs.lease_until": "a replica's claim",
    "outbox.sender": "a replica's claim",
    "outbox.claimed_at": "a replica's claim",
}


# --- values ---------------------------------------------------------------------------
def normalize(kind: Kind, value: Any) -> Any:
    """A value as every ``Snapshot`` yields it, whichever database it came from: ``bool``
    for booleans (SQLite keeps 0/1), the ISO string for a time (PostgreSQL gives a
    ``datetime``), ``bytes`` for bytes (PostgreSQL gives a ``memoryview``)."""
    if value is None:
        return None
    if kind is Kind.BOOLEAN:
        return bool(value)
    if kind is Kind.INTEGER:
        return int(value)
    if kind is Kind.REAL:
        return float(value)
    if kind is Kind.TIME:
        return to_db_time(value) if isinstance(value, datetime) else str(value)
    if kind is Kind.BYTES:
        return bytes(value)
    return str(value)


def encode(kind: Kind, value: Any) -> JsonValue:
    """A normalized value as the archive writes it."""
    value = normalize(kind, value)
    if kind is Kind.BYTES and value is not None:
        return base64.b64encode(value).decode("ascii")
    return value  # type: ignore[no-any-return]  # normalize returned a JSON scalar for every other kind


def decode(kind: Kind, value: object, where: str) -> Any:
    """An archived value as a database takes it (``bytes`` for bytes, ``bool`` for
    booleans, the ISO string for a time). Raises ``UnsafeArchive`` naming ``where``."""
    if value is None:
        return None
    ok = True
    out: Any = value
    if kind is Kind.BOOLEAN:
        ok = isinstance(value, bool)
    elif kind is Kind.INTEGER:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is Kind.REAL:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        out = float(value) if ok else value  # type: ignore[arg-type]  # checked just above
    elif kind is Kind.TIME:
        try:
            out = to_db_time(datetime.fromisoformat(value)) if isinstance(value, str) else None
        except ValueError:
            out = None
        ok = out is not None
    elif kind is Kind.BYTES:
        try:
            out = base64.b64decode(value, validate=True) if isinstance(value, str) else None
        except (binascii.Error, ValueError):
            out = None
        ok = out is not None
    else:
        ok = isinstance(value, str)
    if not ok:
        raise UnsafeArchive(f"{where}: {str(value)[:40]!r} is not a valid {kind} value")
    return out


# --- JSON lines --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Written:
    """One table as written: its member name and how many rows it holds."""

    table: Table
    rows: int


def write_table(folder: Path, table: Table, rows: Iterable[Mapping[str, Any]]) -> Written:
    """``rows`` (database values, by column name) as ``folder/<table.member>``. A column
    missing from a row is written as null."""
    path = folder.joinpath(*PurePosixPath(table.member).parts)
    ensure_folder(path.parent)
    n = 0
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for row in rows:
            record = {c.name: encode(c.kind, row.get(c.name)) for c in table.columns}
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
            out.write("\n")
            n += 1
    return Written(table, n)


def read_table(folder: Path, table: Table) -> Iterator[Row]:
    """The rows of ``folder/<table.member>`` decoded (only the columns each names; a
    column this mnemo does not know refuses the archive). Nothing when it is absent."""
    path = folder.joinpath(*PurePosixPath(table.member).parts)
    if not path.is_file():
        return
    known = set(table.names)
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            where = f"{table.member} line {number}"
            try:
                record = json.loads(line)
            except ValueError as e:
                raise UnsafeArchive(f"{where} is not JSON: {e}") from None
            if not isinstance(record, dict):
                raise UnsafeArchive(f"{where} is not a JSON object")
            unknown = sorted(set(record) - known)
            if unknown:
                raise UnsafeArchive(
                    f"{where}: column {unknown[0]!r} is unknown to this mnemo (an archive from a newer version?)"
                )
            yield {k: decode(table.kind(k), v, f"{where} {k}") for k, v in record.items()}


def count_lines(path: Path) -> int:
    """Rows in a JSON lines file (what verification compares with the manifest)."""
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def tables_named(labels: Sequence[str]) -> list[Table]:
    """The tables of a manifest's labels, in load order; an unknown one refuses it."""
    unknown = sorted(set(labels) - set(BY_LABEL))
    if unknown:
        raise UnsafeArchive(
            f"table {unknown[0]!r} is unknown to this mnemo (an archive from a newer version?)"
        )
    wanted = set(labels)
    return [t for t in TABLES if t.label in wanted]
