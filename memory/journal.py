"""The memory journal: one entry per memory write, with where it came from.

Every write to every memory layer appends one entry — the curated files (``curated``:
MEMORY.md, a USER.md), holographic facts (``facts``), skills (``skills``), external
provider writes (``provider``), and the receipt an erasure leaves (``journal``). An
entry holds what changed (``op``, ``old``, ``new``) and its provenance: who or what
wrote it (``actor``), for whom (``speaker``), from which session, platform message and
tool call, and a trust label (:class:`Trust`). Undo and revert are writes like any
other, through the same scanned, bounded write path, with ``reverts`` naming the entry
they undo.

**Validity.** The value an entry wrote (``new``) is valid from the entry's ``time``
until a later entry replaces or removes it: that later write sets ``until`` on it in
the same transaction, and records in its own ``since`` when the value it replaced had
become valid. So past values stay answerable ("what did I use to prefer, since when")
while prompts carry only current entries.

**Same transaction.** Where the layer lives in the journal's own database (curated
rows on PostgreSQL, the holographic schema there, provider jobs) the entry is inserted
in the write's transaction. Where it does not (SQLite: the curated files, skills and
``facts.db`` are outside ``state.db``), a write goes in three steps under the layer's
own lock (:class:`DocumentJournal`)::

    stage   the entry is committed as ``staged`` with its evidence: what the layer
            will hold once written (a file's SHA-256, or a mark row in facts.db)
    apply   the layer is written (temp file + fsync + rename, or one SQLite transaction)
    commit  the entry becomes ``done`` (and closes the replaced value's interval)

A process killed between stage and commit leaves a staged entry. Whoever next takes
that layer's lock — the next write to it, or any process opening the backend
(:meth:`JournalRepository.settle`) — compares the evidence with what the layer holds:
there, the entry becomes ``done``; not there, it is deleted. Either way the write and
its entry end up both present or both absent. Readers only ever see ``done`` entries.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import structlog

from mnemo.memory.atomic import exclusive_lock
from mnemo.memory.errors import MemoryRefused, StoreError

log = structlog.get_logger(__name__)

SHARED = "shared"  # the target of shared memory (MEMORY.md, shared facts and skills)
ABSENT = "absent"  # the digest of a file that does not exist
MARKS_TABLE = "journal_marks"  # the evidence table in a layer's own SQLite file


class Trust(StrEnum):
    """How far an entry can be trusted."""

    STATED = "stated"  # the person said it (or confirmed it)
    INFERRED = "inferred"  # the model concluded it
    IMPORTED = "imported"  # came in with ``mnemo import``
    ADMIN = "admin"  # an operator wrote it (CLI, dashboard)
    PROPOSED = "proposed"  # waits for the person's confirmation (never a stored value)


class Layer(StrEnum):
    CURATED = "curated"
    FACTS = "facts"
    SKILLS = "skills"
    PROVIDER = "provider"
    JOURNAL = "journal"  # erasure receipts


class Actor:
    """Who wrote an entry (``actor``): a fixed word, or ``kind:detail``."""

    PERSON = "person"  # the person themselves (/memory undo, /forget, a confirmation)
    MODEL = "model"  # the model in a conversation turn
    ADMIN = "admin"  # an operator in the dashboard
    CLI = "cli"  # a shell command (mnemo memory, mnemo facts, mnemo skills)
    MCP = "mcp"  # a client of the MCP server
    LINKS = "links"  # linking or unlinking accounts moved a profile
    ERASURE = "erasure"
    MIRROR = "mirror"  # a curated write copied into another layer
    SYSTEM = "system"  # any other code path

    @staticmethod
    def job(kind: str) -> str:
        """A background job: ``job:review``, ``job:flush``, ``job:skill_review`` …"""
        return f"job:{kind}"

    @staticmethod
    def importer(source: str) -> str:
        return f"importer:{source}"


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where one write came from."""

    actor: str
    trust: Trust
    speaker: str | None = None  # the person (PLATFORM:ID) whose turn or request it was
    session: str | None = None
    message: str | None = None  # the platform's message id
    chat: str | None = None  # the conversation (its session key)
    tool_call: str | None = None
    reverts: int | None = None  # the entry this write undoes

    @classmethod
    def system(cls) -> Provenance:
        return cls(Actor.SYSTEM, Trust.ADMIN)

    def undoing(self, entry_id: int) -> Provenance:
        return replace(self, reverts=entry_id)


@dataclass(frozen=True, slots=True)
class NewEntry:
    layer: Layer
    target: str  # SHARED or the person's PLATFORM:ID (the owner of what was written)
    op: str  # add, replace, remove (curated, facts); create, edit, … (skills); …
    old: str | None
    new: str | None
    by: Provenance
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """One journaled write as read back (``to_json`` is ``mnemo memory history --json``)."""

    id: int
    time: datetime
    layer: str
    target: str
    op: str
    old: str | None
    new: str | None
    since: datetime | None  # when ``old`` had become valid (None: before the journal)
    until: datetime | None  # when ``new`` stopped being valid (None: still current)
    actor: str
    trust: str
    speaker: str | None
    session: str | None
    message: str | None
    chat: str | None
    tool_call: str | None
    reverts: int | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("time", "since", "until"):
            value = out[key]
            out[key] = None if value is None else value.isoformat()
        return out

    @property
    def undoable(self) -> bool:
        """A write of a layer this journal can invert through that layer's write path."""
        return self.layer == Layer.CURATED and self.op in ("add", "replace", "remove")


@dataclass(frozen=True, slots=True)
class JournalQuery:
    """Which entries to read, newest first. ``people``: entries about any of these
    accounts or made in their turns (their own entries); None: everyone's."""

    people: tuple[str, ...] | None = None
    layer: str | None = None
    target: str | None = None
    since: datetime | None = None
    limit: int = 50


# --- evidence of a staged write --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FileEvidence:
    """The write is there when ``path`` holds bytes with this SHA-256 (``ABSENT``: no file)."""

    lock: Path
    path: Path
    digest: str

    def present(self) -> bool:
        return file_digest(self.path) == self.digest


@dataclass(frozen=True, slots=True)
class MarkEvidence:
    """The write is there when the SQLite file ``path`` holds ``token`` in its
    ``journal_marks`` table (written in the layer's own transaction, ``mark_within``)."""

    lock: Path
    path: Path
    token: str

    def present(self) -> bool:
        if not self.path.is_file():
            return False
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute(f"SELECT 1 FROM {MARKS_TABLE} WHERE token = ?", (self.token,)).fetchone()
        except sqlite3.OperationalError:  # no marks table: nothing was ever marked
            return False
        finally:
            conn.close()
        return row is not None


Evidence = FileEvidence | MarkEvidence

MARKS_SQL = f"CREATE TABLE IF NOT EXISTS {MARKS_TABLE} (token TEXT PRIMARY KEY, at REAL NOT NULL)"


class Executes(Protocol):
    """A connection that runs one statement (``sqlite3.Connection`` and its look-alikes)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...


def mark_within(conn: Executes, token: str, now: float) -> None:
    """Record ``token`` in a layer's own transaction (its evidence, :class:`MarkEvidence`)."""
    conn.execute(f"INSERT OR IGNORE INTO {MARKS_TABLE}(token, at) VALUES (?, ?)", (token, now))


def evidence_json(evidence: Evidence) -> str:
    if isinstance(evidence, FileEvidence):
        body = {
            "kind": "file",
            "lock": str(evidence.lock),
            "path": str(evidence.path),
            "digest": evidence.digest,
        }
    else:
        body = {
            "kind": "mark",
            "lock": str(evidence.lock),
            "path": str(evidence.path),
            "token": evidence.token,
        }
    return json.dumps(body)


def evidence_of(text: str) -> Evidence | None:
    try:
        body = json.loads(text)
        if body["kind"] == "file":
            return FileEvidence(Path(body["lock"]), Path(body["path"]), str(body["digest"]))
        if body["kind"] == "mark":
            return MarkEvidence(Path(body["lock"]), Path(body["path"]), str(body["token"]))
    except (ValueError, KeyError, TypeError):
        return None
    return None


def digest(data: bytes | None) -> str:
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    try:
        return digest(path.read_bytes())
    except FileNotFoundError:
        return ABSENT
    except IsADirectoryError:
        return ABSENT


# --- the ports -------------------------------------------------------------------------
class DocumentJournal(Protocol):
    """The journal as a layer outside its database uses it (curated files on SQLite,
    skills, ``facts.db``), always under that layer's own lock, from a worker thread:
    ``stage`` before writing, ``commit`` after, ``abort`` when the write failed;
    ``staged`` lists what killed writers left (``settle_held``, ``settle_all``).
    Raises ``StoreError`` (or the driver's error) when the journal cannot be written:
    the caller then writes nothing."""

    def stage(self, entry: NewEntry, evidence: Evidence) -> int: ...

    def commit(self, entry_id: int) -> None: ...

    def abort(self, entry_id: int) -> None: ...

    def staged(self, layer: Layer | None = None, target: str | None = None) -> list[tuple[int, str | None]]:
        """(id, evidence JSON) of the entries left staged, of one document or all."""
        ...


def commit_written(journal: DocumentJournal, entry_id: int) -> None:
    """Commit after the layer was written. A commit that fails now leaves the entry
    staged; the next writer under the same lock finds the layer as staged and commits
    it — the write stands, and so will its entry."""
    try:
        journal.commit(entry_id)
    except (StoreError, sqlite3.Error) as e:
        log.warning("journal.commit_deferred", entry=entry_id, error=str(e))


def resolve(journal: DocumentJournal, entry_id: int, evidence_text: str | None) -> bool:
    """Keep (commit) or drop (abort) one staged entry by its evidence; True: kept.
    The caller holds the lock the evidence names."""
    evidence = evidence_of(evidence_text or "")
    present = evidence is not None and evidence.present()
    if present:
        journal.commit(entry_id)
    else:
        journal.abort(entry_id)
    return present


def settle_held(journal: DocumentJournal, layer: Layer, target: str) -> None:
    """Before a write, under the document's lock: resolve what an earlier writer of the
    same document left staged (it was killed between stage and commit)."""
    for entry_id, text in journal.staged(layer, target):
        resolve(journal, entry_id, text)


def settle_all(journal: DocumentJournal, lock_timeout_s: float = 0.2) -> int:
    """Resolve every staged entry whose lock is free (a process opening the backend);
    an entry whose lock stays held belongs to a live writer, which settles it itself."""
    done = 0
    for entry_id, text in journal.staged():
        evidence = evidence_of(text or "")
        if evidence is None:
            journal.abort(entry_id)
            done += 1
            continue
        try:
            with exclusive_lock(evidence.lock, lock_timeout_s):
                resolve(journal, entry_id, text)
        except MemoryRefused:
            continue
        except FileNotFoundError:  # the layer's folder is gone (erased): nothing was kept
            journal.abort(entry_id)
        done += 1
    return done


class JournalRepository(Protocol):
    """Reading the journal and appending to it (``StorageBackend.journal``): history
    and undo (``/memory``, ``mnemo memory history|revert``, the dashboard, the memory
    tool's ``history`` action), provider writes, trust labels for prompts."""

    async def append(self, entry: NewEntry, *, dedupe: str | None = None) -> int | None:
        """One entry in its own transaction; with ``dedupe``, at most one entry per key
        (None: already journaled)."""
        ...

    async def history(self, query: JournalQuery) -> list[Entry]:
        """``done`` entries, newest first."""
        ...

    async def get(self, entry_id: int) -> Entry | None: ...

    async def reverted(self, entry_ids: Sequence[int]) -> set[int]:
        """Which of ``entry_ids`` a later entry undid."""
        ...

    async def trusts(self, layer: Layer, target: str, values: Sequence[str]) -> dict[str, Trust]:
        """The trust of the newest entry that wrote each current value."""
        ...

    async def settle(self) -> int:
        """Resolve entries left staged by a killed writer (see the module docstring);
        how many were resolved. Called when a backend opens."""
        ...


class ProposalRepository(Protocol):
    """Writes waiting for a person's confirmation (``remember: ask``): the memory tool
    proposes, ``/memory confirm`` or ``/memory reject`` decides. A proposal is no
    stored value: only its confirmation writes, through the layer's write path."""

    async def propose(self, entry: NewEntry) -> int: ...

    async def proposals(self, people: Sequence[str]) -> list[Entry]:
        """Open proposals made in these accounts' turns, newest first."""
        ...

    async def decide(self, entry_id: int, accepted: bool) -> bool:
        """Close an open proposal; False when it was not open."""
        ...

    async def rejected(self, people: Sequence[str]) -> list[Entry]:
        """Proposals made for these accounts that were rejected, newest first (so a
        consolidation does not propose them again)."""
        ...


# --- presentation ------------------------------------------------------------------------
MARKERS = {Trust.INFERRED: "(inferred) ", Trust.IMPORTED: "(imported) "}


def marked(entries: Iterable[str], trusts: Mapping[str, Trust]) -> dict[str, str]:
    """The one compact marker per entry the prompt shows for less certain entries:
    ``(inferred) `` or ``(imported) `` in front; stated and admin entries unmarked."""
    return {e: MARKERS[t] for e in entries if (t := trusts.get(e)) in MARKERS}


def effective_trust(requested: Trust, *, background: bool) -> Trust:
    """A background pass (review, flush, cron) only ever infers: it may never record an
    entry as ``stated``, whatever the model claims."""
    if background and requested is Trust.STATED:
        return Trust.INFERRED
    return requested


def when(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def line(entry: Entry, *, reverted: bool = False) -> str:
    """One entry for people (``/memory history``, ``mnemo memory history``)."""
    what = {
        "add": f"added “{entry.new}”",
        "replace": f"replaced “{entry.old}” with “{entry.new}”",
        "remove": f"removed “{entry.old}”",
    }.get(entry.op, f"{entry.op} {entry.new or entry.old or ''}".strip())
    where = "shared memory" if entry.target == SHARED else f"profile of {entry.target}"
    source = f", message {entry.message}" if entry.message else ""
    chat = f" in {entry.chat}" if entry.chat else ""
    undone = " [undone]" if reverted else ""
    undo = f" (undoes #{entry.reverts})" if entry.reverts is not None else ""
    return (
        f"#{entry.id} {entry.time:%Y-%m-%d %H:%M} UTC — {entry.layer}, {where}: {what}{undo}{undone}"
        f" · {entry.actor}, {entry.trust}{chat}{source}"
    )


def clip(text: str | None, limit: int = 160) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
