"""What an importer reads out of another agent's files, in mnemo's terms.

A source module builds one :class:`Bundle`; ``apply.py`` writes it. Sessions are a
callable returning an iterator so a large history is read one conversation at a time
(once for a dry run, once for the import), never all of it at once.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from mnemo.memory.curated import ENTRY_DELIMITER, parse_entries
from mnemo.memory.sessions import Role, ToolCall

KINDS = ("hermes", "openclaw")
SQLITE_MAGIC = b"SQLite format 3\x00"


class SourceProblem(Exception):
    """The source cannot be imported as given: missing, unreadable, the wrong kind of
    folder (``usage=True``: the user named the wrong thing) or damaged (``usage=False``)."""

    def __init__(self, message: str, *, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True, slots=True)
class ChatHint:
    """Where a foreign conversation took place, as far as the source recorded it; the
    default chat mapping (``chats.py``) uses it when the ids are the platform's own."""

    platform: str | None = None
    kind: str | None = None  # "dm" or "group"
    chat_id: str | None = None
    thread_id: str | None = None
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class ForeignMessage:
    key: str  # the source's own message id: stable across imports
    role: Role
    content: str
    created_at: datetime
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    author_id: str | None = None


@dataclass(frozen=True, slots=True)
class ForeignSession:
    key: str  # the source's own session id
    source_chat: str  # what ``--chat-map SOURCE=…`` names, e.g. "telegram:12345"
    hint: ChatHint
    started_at: datetime
    title: str | None
    model: str | None
    messages: tuple[ForeignMessage, ...]
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> messages left out


@dataclass(frozen=True, slots=True)
class ForeignSkill:
    path: Path  # the folder holding SKILL.md
    category: str | None  # the category folder it was grouped in, if any


@dataclass
class Bundle:
    kind: str
    origin: Path
    memory: tuple[str, ...] = ()
    user: tuple[str, ...] | None = None  # None: the source has no profile file
    soul: str | None = None
    skills: tuple[ForeignSkill, ...] = ()
    sessions: Callable[[], Iterator[ForeignSession]] = lambda: iter(())
    # What was read but is not imported, in words (a file of the wrong kind, …).
    notes: list[str] = field(default_factory=list)
    skipped_sessions: Counter[str] = field(default_factory=Counter)


def stable_id(kind: str, *parts: str) -> str:
    """A mnemo session id for a foreign session: the same source id, the same id."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:24]
    return f"{kind}-{digest}"


def read_text(path: Path, what: str) -> str | None:
    """A text file of the source, or None when it does not exist; an unreadable or
    non-UTF-8 file is a ``SourceProblem`` (never read as empty)."""
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceProblem(f"{path}: {what} is not UTF-8 text (byte {e.start})", usage=False) from None
    except OSError as e:
        raise SourceProblem(f"{path}: cannot read {what} ({e.strerror or e})", usage=True) from None


_HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"(?:[-*+]|\d+[.)])\s+")


def markdown_entries(text: str) -> tuple[str, ...]:
    """Free-form Markdown notes as curated entries: ``§``-separated files as they are;
    otherwise each top-level list item and each paragraph is one entry, prefixed with
    the section heading it sits under (``Preferences: likes green tea``). Title lines
    of their own are not entries."""
    if ENTRY_DELIMITER.strip() in {line.strip() for line in text.splitlines()}:
        return parse_entries(text)
    entries: list[str] = []
    heading: str | None = None
    block: list[str] = []

    def flush() -> None:
        body = "\n".join(block).strip()
        block.clear()
        if body:
            entries.append(f"{heading}: {body}" if heading else body)

    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.rstrip()
        m = _HEADING.fullmatch(line.strip()) if not raw.startswith((" ", "\t")) else None
        if m is not None:
            flush()
            heading = m.group(1).strip() or None
        elif not line.strip():
            flush()
        elif _ITEM.match(line):  # a new top-level item ends the previous one
            flush()
            block.append(_ITEM.sub("", line, count=1))
        else:
            block.append(line.strip())
    flush()
    # The curated store keeps the first of duplicates; so do we, in order.
    return tuple(dict.fromkeys(e for e in entries if e.strip() != ENTRY_DELIMITER.strip()))


def skill_folders(root: Path) -> tuple[ForeignSkill, ...]:
    """``root/<name>/SKILL.md`` and ``root/<category>/<name>/SKILL.md`` (the layout both
    Hermes and OpenClaw use); hidden folders (archives, hub caches) and links skipped."""
    found: list[ForeignSkill] = []
    if not root.is_dir() or root.is_symlink():
        return ()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.is_symlink() or not entry.is_dir():
            continue
        if (entry / "SKILL.md").is_file():
            found.append(ForeignSkill(entry, None))
            continue
        for inner in sorted(entry.iterdir()):
            if not inner.name.startswith(".") and not inner.is_symlink() and (inner / "SKILL.md").is_file():
                found.append(ForeignSkill(inner, entry.name))
    return tuple(found)


def open_readonly(db: Path) -> sqlite3.Connection:
    """A connection that can change nothing on disk, not even side files: a WAL-mode
    database read with ``mode=ro`` creates ``-wal``/``-shm`` when they are missing, so a
    database without a ``-wal`` (all its content is in the file) is opened ``immutable``.
    One with a ``-wal`` (its program is running, or died) is read through it."""
    wal = db.with_name(db.name + "-wal")
    flags = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    # Advanced by worker threads one step at a time (never two at once): the connection
    # may move between threads.
    return sqlite3.connect(f"{db.resolve().as_uri()}?{flags}", uri=True, check_same_thread=False)
