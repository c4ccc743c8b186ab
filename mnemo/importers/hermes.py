"""Reading a Hermes Agent profile: ``~/.hermes`` (or a named profile's folder, or the
``.zip`` that ``hermes backup`` writes, or a ``.tar.gz`` of the folder).

What a Hermes profile holds that moves over:

* ``memories/MEMORY.md`` and ``memories/USER.md`` — the same ``§``-separated entries
  mnemo keeps (Hermes has one USER.md per profile; the importer is told whose it is);
* ``SOUL.md`` — the persona;
* ``skills/<name>/SKILL.md`` or ``skills/<category>/<name>/SKILL.md`` folders;
* ``state.db`` — Hermes' SessionDB (SQLite). Its schema has grown over many versions;
  what this reader relies on is what every published version has: ``sessions(id,
  source, started_at)`` and ``messages(id, session_id, role, timestamp)``, with
  ``content``, ``tool_calls`` (OpenAI-style JSON), ``tool_call_id``, ``tool_name``,
  ``title``, ``model``, ``user_id`` and — in later versions — ``chat_id``,
  ``chat_type``, ``thread_id`` and the ``active``/``compacted``/
  ``_compressed_summary``/``display_kind`` message flags read when present. Columns
  it does not know are ignored. The database is opened read-only and checked first.

Left behind: ``config.yaml`` (Hermes settings have no mnemo equivalent), ``.env`` and
``auth.json`` (secrets stay on their machine), cron jobs, logs, the FTS index (mnemo
builds its own), subagent runs and Hermes' compression summaries.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemo.importers.archive import is_archive, unpack
from mnemo.importers.common import (
    SQLITE_MAGIC,
    Bundle,
    ChatHint,
    ForeignMessage,
    ForeignSession,
    SourceProblem,
    open_readonly,
    read_text,
    skill_folders,
)
from mnemo.memory.curated import parse_entries
from mnemo.memory.sessions import ToolCall

_ROLES = ("user", "assistant", "tool")
# Delegated child runs: Hermes' own search hides them; they are not conversations.
_SKIPPED_SOURCES = {"subagent": "subagent runs", "tool": "tool sessions"}
_GROUP_TYPES = frozenset({"group", "supergroup", "channel", "forum"})
_MARKERS = ("state.db", "memories", "SOUL.md", "skills")


def _root_of(parts: tuple[str, ...]) -> tuple[str, ...] | None:
    for tail in (("state.db",), ("memories", "MEMORY.md"), ("memories", "USER.md"), ("SOUL.md",)):
        if len(parts) >= len(tail) and parts[-len(tail) :] == tail:
            return parts[: -len(tail)]
    return None


def _wanted(rel: tuple[str, ...]) -> bool:
    return rel in {("state.db",), ("memories", "MEMORY.md"), ("memories", "USER.md"), ("SOUL.md",)} or (
        rel[0] == "skills" and len(rel) > 1
    )


def locate(path: Path, scratch: Path) -> Path:
    """The profile folder to read: ``path`` itself, or what its archive unpacks to."""
    if not path.exists():
        raise SourceProblem(f"{path}: no such file or folder", usage=True)
    if path.is_file():
        if not is_archive(path):
            raise SourceProblem(
                f"{path}: expected a Hermes profile folder (~/.hermes) or its backup (.zip, .tar.gz)",
                usage=True,
            )
        return unpack(path, scratch, _root_of, _wanted)
    try:
        names = {p.name for p in path.iterdir()}
    except OSError as e:
        raise SourceProblem(f"{path}: cannot read the folder ({e.strerror or e})", usage=True) from None
    if not names & set(_MARKERS):
        hint = ""
        if "agents" in names or "openclaw.json" in names or "AGENTS.md" in names:
            hint = " (it looks like an OpenClaw folder: use --from openclaw)"
        elif ".hermes" in names:
            hint = f" (did you mean {path / '.hermes'}?)"
        raise SourceProblem(
            f"{path}: not a Hermes profile folder: no state.db, memories/, SOUL.md or skills/{hint}",
            usage=True,
        )
    return path


def read(path: Path, scratch: Path) -> Bundle:
    root = locate(path, scratch)
    memories = root / "memories"
    memory = read_text(memories / "MEMORY.md", "MEMORY.md")
    user = read_text(memories / "USER.md", "USER.md")
    bundle = Bundle(
        kind="hermes",
        origin=path,
        memory=parse_entries(memory) if memory else (),
        user=parse_entries(user) if user is not None else None,
        soul=read_text(root / "SOUL.md", "SOUL.md"),
        skills=skill_folders(root / "skills"),
    )
    db = root / "state.db"
    if db.is_file():
        schema = _check(db)
        bundle.skipped_sessions.update(_skipped_sessions(db))
        bundle.sessions = lambda: _sessions(db, schema)
    else:
        bundle.notes.append("no state.db: no conversations to import")
    return bundle


# --- the SessionDB ----------------------------------------------------------------------
def _connect(db: Path) -> sqlite3.Connection:
    conn = open_readonly(db)
    conn.row_factory = sqlite3.Row
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


Schema = tuple[frozenset[str], frozenset[str]]


def _check(db: Path) -> Schema:
    """The sessions and messages columns, after checking that ``db`` is a readable,
    undamaged Hermes SessionDB."""
    try:
        with db.open("rb") as f:
            magic = f.read(16)
    except OSError as e:
        raise SourceProblem(f"{db}: cannot read ({e.strerror or e})", usage=True) from None
    if magic != SQLITE_MAGIC:
        raise SourceProblem(
            f"{db}: not a SQLite database (Hermes' state.db is one); is the file damaged?", usage=False
        )
    try:
        conn = _connect(db)
        try:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise SourceProblem(
                    f"{db}: the database is damaged (quick_check: {'; '.join(problems)})", usage=False
                )
            sessions, messages = _columns(conn, "sessions"), _columns(conn, "messages")
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise SourceProblem(f"{db}: the database cannot be read ({e})", usage=False) from None
    missing = sorted({"id", "source", "started_at"} - sessions) + sorted(
        f"messages.{c}" for c in {"id", "session_id", "role", "timestamp"} - messages
    )
    if missing:
        raise SourceProblem(f"{db}: not a Hermes state.db (missing {', '.join(missing)})", usage=True)
    return frozenset(sessions), frozenset(messages)


def _skipped_sessions(db: Path) -> Counter[str]:
    conn = _connect(db)
    try:
        rows = conn.execute(
            f"SELECT source, count(*) FROM sessions WHERE source IN ({','.join('?' * len(_SKIPPED_SOURCES))})"
            " GROUP BY source",
            tuple(_SKIPPED_SOURCES),
        ).fetchall()
    finally:
        conn.close()
    return Counter({_SKIPPED_SOURCES[r[0]]: r[1] for r in rows})


def _time(value: Any) -> datetime:
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return datetime(1970, 1, 1, tzinfo=UTC)


def _text(value: Any) -> str | None:
    return None if value is None or str(value) == "" else str(value)


def _hint(s: sqlite3.Row, cols: frozenset[str]) -> tuple[str, ChatHint]:
    def col(name: str) -> str | None:
        return _text(s[name]) if name in cols else None

    platform = str(s["source"] or "unknown").strip().lower() or "unknown"
    chat, chat_type, thread, user = col("chat_id"), col("chat_type"), col("thread_id"), col("user_id")
    kind = "dm" if chat_type == "dm" else "group" if chat_type in _GROUP_TYPES else None
    if chat is None and user is not None and platform == "telegram" and "chat_id" not in cols:
        # Before Hermes recorded chat ids it kept the user's; a Telegram private chat's
        # id is its user's id, so the conversation is that direct chat.
        chat, kind = user, "dm"
    if chat is not None:
        source_chat = f"{platform}:{chat}" + (f":{thread}" if thread else "")
    else:
        source_chat = f"{platform}:{user}" if user else platform
    return source_chat, ChatHint(platform, kind, chat, thread, user)


def _tool_calls(raw: Any, skipped: Counter[str]) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        skipped["unreadable tool_calls (message kept)"] += 1
        return ()
    calls = []
    for i, c in enumerate(data if isinstance(data, list) else []):
        if not isinstance(c, dict):
            continue
        function = c.get("function")
        fn: dict[str, Any] = function if isinstance(function, dict) else c
        args: Any = fn.get("arguments", fn.get("input", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"arguments": args}
        if not isinstance(args, dict):
            args = {"arguments": args}
        calls.append(
            ToolCall(str(c.get("id") or c.get("call_id") or f"call_{i}"), str(fn.get("name") or "tool"), args)
        )
    return tuple(calls)


def _message(
    m: sqlite3.Row, cols: frozenset[str], author: str | None, skipped: Counter[str]
) -> ForeignMessage | None:
    role = m["role"]
    if role not in _ROLES:
        skipped[f"role {role!r}"] += 1
        return None
    if "_compressed_summary" in cols and m["_compressed_summary"]:
        skipped["compression summaries"] += 1
        return None
    if "active" in cols and not m["active"] and not ("compacted" in cols and m["compacted"]):
        skipped["superseded (rewound or retried)"] += 1
        return None
    if "display_kind" in cols and m["display_kind"] == "hidden":
        skipped["hidden scaffolding"] += 1
        return None
    content = str(m["content"]) if "content" in cols and m["content"] is not None else ""
    calls = _tool_calls(m["tool_calls"], skipped) if "tool_calls" in cols and role == "assistant" else ()
    if not content.strip() and not calls:
        skipped["empty"] += 1
        return None
    return ForeignMessage(
        key=str(m["id"]),
        role=role,
        content=content,
        created_at=_time(m["timestamp"]),
        tool_calls=calls,
        tool_call_id=_text(m["tool_call_id"]) if "tool_call_id" in cols and role == "tool" else None,
        tool_name=_text(m["tool_name"]) if "tool_name" in cols and role == "tool" else None,
        author_id=author if role == "user" else None,
    )


def _sessions(db: Path, schema: Schema) -> Iterator[ForeignSession]:
    scols, mcols = schema
    conn = _connect(db)
    try:
        wanted_s = [
            c
            for c in (
                "id",
                "source",
                "started_at",
                "title",
                "model",
                "user_id",
                "chat_id",
                "chat_type",
                "thread_id",
            )
            if c in scols
        ]
        wanted_m = [
            c
            for c in (
                "id",
                "role",
                "content",
                "timestamp",
                "tool_calls",
                "tool_call_id",
                "tool_name",
                "active",
                "compacted",
                "_compressed_summary",
                "display_kind",
            )
            if c in mcols
        ]
        marks = ",".join("?" * len(_SKIPPED_SOURCES))
        rows = conn.execute(
            f"SELECT {', '.join(wanted_s)} FROM sessions WHERE source IS NULL OR source NOT IN ({marks})"
            " ORDER BY started_at, id",
            tuple(_SKIPPED_SOURCES),
        ).fetchall()
        for s in rows:
            source_chat, hint = _hint(s, scols)
            skipped: Counter[str] = Counter()
            messages = []
            for m in conn.execute(
                f"SELECT {', '.join(wanted_m)} FROM messages WHERE session_id = ? ORDER BY id", (s["id"],)
            ):
                msg = _message(m, mcols, hint.user_id, skipped)
                if msg is not None:
                    messages.append(msg)
            yield ForeignSession(
                key=str(s["id"]),
                source_chat=source_chat,
                hint=hint,
                started_at=_time(s["started_at"]),
                title=_text(s["title"]) if "title" in scols else None,
                model=_text(s["model"]) if "model" in scols else None,
                messages=tuple(messages),
                skipped=skipped,
            )
    except sqlite3.DatabaseError as e:
        raise SourceProblem(f"{db}: the database cannot be read ({e})", usage=False) from None
    finally:
        conn.close()
