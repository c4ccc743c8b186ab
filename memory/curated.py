"""Layer 1: the bounded, curated memory files (shared MEMORY.md, one USER.md per user).

A file holds entries joined by ``ENTRY_DELIMITER``; its limit is in characters of the
joined text (model-independent, and the delimiters count). Two views of a file exist:

* a :class:`Snapshot`, taken by :meth:`CuratedFile.load` when a session starts. It is
  frozen: the system prompt is rendered from it once and sent byte for byte for the whole
  session, so later writes never change it (prompt caching depends on that);
* the file on disk, which every write changes at once.

Every write is a read-modify-write of the whole file under an exclusive lock on
``<file>.lock``, re-reading the file under the lock (another process may have written
since this one last looked) and replacing it atomically (``memory/atomic.py``). Readers
take no lock: they see the old file or the new one, never a part.

A file that exists but cannot be read or decoded refuses every write: treating it as
empty would overwrite what a human can still rescue. All methods here block; async
callers run them in a thread.

Every change is journaled (``memory/journal.py``) with the ``Provenance`` its caller
gives: under the file's lock, the entry is staged with the SHA-256 the file will have,
the file is replaced, and the entry committed — so a writer killed in between leaves
an entry the next locked writer (or the next process opening the backend) keeps or
drops by comparing that hash with the file. No journal (a bare ``MemoryFiles`` in a
tool or test): the file is written as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from mnemo.memory.atomic import ensure_folder, exclusive_lock, replace_file
from mnemo.memory.errors import InvalidIdentifier, MemoryRefused, MemoryUnreadable, StoreError
from mnemo.memory.identity import Identities
from mnemo.memory.journal import (
    SHARED,
    Actor,
    DocumentJournal,
    FileEvidence,
    Layer,
    NewEntry,
    Provenance,
    Trust,
    commit_written,
    digest,
    settle_held,
)
from mnemo.memory.scope import UserRef
from mnemo.memory.threats import Threat, ThreatCategory, scan

ENTRY_DELIMITER = "\n§\n"
SEPARATOR = "═" * 46
PREVIEW_CHARS = 80
DEFAULT_MEMORY_LIMIT = 2200
DEFAULT_USER_LIMIT = 1375

log = structlog.get_logger(__name__)


class Target(StrEnum):
    MEMORY = "memory"  # the bot's own notes, shared by every user
    USER = "user"  # who one chat user is


class Action(StrEnum):
    ADD = "add"
    REPLACE = "replace"
    REMOVE = "remove"


_HEADERS = {Target.MEMORY: "MEMORY (your personal notes)", Target.USER: "USER PROFILE (who the user is)"}


def _lf(text: str) -> str:
    """Every line ending as LF (CRLF from a file edited on Windows, or a lone CR)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def clean_text(text: object) -> str:
    """Entry text as stored: line endings as LF, outer whitespace gone."""
    return _lf(text).strip() if isinstance(text, str) else ""


def parse_entries(text: str) -> tuple[str, ...]:
    """Split file text into entries: strip each, drop empties, keep the first of duplicates."""
    if text.startswith("\ufeff"):
        text = text[1:]
    text = _lf(text)
    seen: dict[str, None] = {}
    for raw in text.split(ENTRY_DELIMITER):
        entry = raw.strip()
        if entry:
            seen.setdefault(entry, None)
    return tuple(seen)


def join_entries(entries: Iterable[str]) -> str:
    return ENTRY_DELIMITER.join(entries)


def _pct(chars: int, limit: int) -> int:
    return chars * 100 // limit if limit > 0 else 0


def _usage(chars: int, limit: int) -> str:
    return f"{_pct(chars, limit)}% — {chars:,}/{limit:,} chars"


def _shown(entry: str) -> str:
    """An entry as it may be shown to a model: a blocked one only by its category."""
    threat = scan(entry)
    return entry if threat is None else f"[BLOCKED: {threat.category}]"


def _preview(entry: str) -> str:
    flat = " ".join(_shown(entry).split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One file as loaded at one moment. Immutable: later writes never change it."""

    target: Target
    entries: tuple[str, ...]
    limit: int
    threats: tuple[Threat | None, ...]  # one per entry; None means the entry is clean
    warnings: tuple[str, ...] = ()
    readable: bool = True  # False: the file exists but could not be read (writes refused)

    @property
    def chars(self) -> int:
        return len(join_entries(self.entries))

    @property
    def pct(self) -> int:
        return _pct(self.chars, self.limit)

    @property
    def shown_entries(self) -> tuple[str, ...]:
        return tuple(
            e if t is None else f"[BLOCKED: {t.category}]"
            for e, t in zip(self.entries, self.threats, strict=True)
        )

    def render_block(self, marks: Mapping[str, str] | None = None) -> str:
        """The system-prompt block; "" for an empty file so no empty frame is sent.
        ``marks``: a compact prefix per entry (its trust, ``journal.marked``); the usage
        in the header is the file's own, without them."""
        if not self.entries:
            return ""
        header = f"{_HEADERS[self.target]} [{_usage(self.chars, self.limit)}]"
        shown = self.shown_entries
        if marks:
            shown = tuple(
                f"{marks.get(e, '')}{s}" if t is None else s
                for e, s, t in zip(self.entries, shown, self.threats, strict=True)
            )
        return f"{SEPARATOR}\n{header}\n{SEPARATOR}\n{join_entries(shown)}"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The outcome of one add/replace/remove; ``to_dict`` is the memory tool's result."""

    success: bool
    message: str
    action: Action
    target: Target
    chars: int  # usage after the write on success, the current usage on a refusal
    limit: int
    changed: bool = False  # False for refusals and no-ops (duplicate add, same content)
    entry: str | None = None  # the entry as stored (add/replace)
    old_entry: str | None = None  # the whole entry that was replaced or removed
    entries: tuple[str, ...] | None = None  # current entries, so the model can consolidate
    previews: tuple[str, ...] | None = None  # entries an ambiguous old_text matched
    threat: ThreatCategory | None = None
    journal_id: int | None = None  # the journal entry of a write that changed the file

    @property
    def pct(self) -> int:
        return _pct(self.chars, self.limit)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "success": self.success,
            "target": str(self.target),
            "chars": self.chars,
            "limit": self.limit,
            "pct": self.pct,
            "message": self.message,
        }
        if self.success:
            out["changed"] = self.changed
            if not self.changed and self.action is Action.ADD:
                out["duplicate"] = True
        if self.success and self.changed and self.old_entry is not None:
            out["replaced" if self.action is Action.REPLACE else "removed"] = self.old_entry
        if self.entries is not None:
            out["entries"] = list(self.entries)
        if self.previews is not None:
            out["matches"] = list(self.previews)
        if self.threat is not None:
            out["threat"] = str(self.threat)
        return out


@dataclass(frozen=True, slots=True)
class _Change:
    """What a decision wants written: the new entries and what to report."""

    entries: tuple[str, ...]
    message: str
    entry: str | None = None
    old_entry: str | None = None


class CuratedFile:
    """One bounded memory file. Thread- and process-safe; every method blocks."""

    def __init__(
        self,
        target: Target,
        path: Path,
        limit: int,
        *,
        root: Path | None = None,
        lock_timeout: float = 10.0,
        owner: str = SHARED,
        journal: DocumentJournal | None = None,
        by: Provenance | None = None,
    ) -> None:
        self.target = Target(target)
        self.path = Path(path)
        self.limit = limit
        self.owner = owner  # the journal's target: SHARED or the person's PLATFORM:ID
        self._root = root  # the folder this file must stay inside, checked before mkdir
        self._lock_timeout = lock_timeout
        self._journal = journal
        self._by = by  # the provenance of a write that names none (an importer's files)

    def __repr__(self) -> str:
        return f"CuratedFile({self.target}, {str(self.path)!r}, limit={self.limit})"

    @property
    def location(self) -> str:
        """Where this file is kept, as shown to people (``mnemo memory show``)."""
        return str(self.path)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # --- reading ---------------------------------------------------------------------
    def _read(self) -> tuple[str, ...]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return ()
        except OSError as e:
            raise MemoryUnreadable(f"{self.path.name} cannot be read ({e.strerror or e})") from e
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MemoryUnreadable(f"{self.path.name} is not valid UTF-8 (byte {e.start})") from e
        return parse_entries(text)

    def load(self) -> Snapshot:
        """Read the file now and freeze what it holds."""
        try:
            entries = self._read()
        except MemoryUnreadable as e:
            warning = f"{e}; writes to it are refused until a human fixes it"
            return Snapshot(self.target, (), self.limit, (), (warning,), readable=False)
        threats = tuple(scan(e) for e in entries)
        warnings: list[str] = []
        chars = len(join_entries(entries))
        if chars > self.limit:
            warnings.append(
                f"{self.path.name} is over its limit ({chars:,}/{self.limit:,} chars): "
                "new entries are refused until entries are replaced or removed"
            )
        for i, (entry, threat) in enumerate(zip(entries, threats, strict=True), 1):
            if threat is not None:
                warnings.append(
                    f"{self.path.name} entry {i} is blocked by the threat scan ({threat}); "
                    f"it stays on disk but is not shown to the model: {entry[:PREVIEW_CHARS]!r}"
                )
        return Snapshot(self.target, entries, self.limit, threats, tuple(warnings))

    # --- writing ---------------------------------------------------------------------
    def add(self, content: str, by: Provenance | None = None) -> WriteResult:
        def decide(current: tuple[str, ...]) -> _Change | WriteResult:
            entry = clean_text(content)
            if not entry:
                return self._refused(Action.ADD, current, "Content cannot be empty.")
            bad = self._check_content(Action.ADD, current, entry)
            if bad is not None:
                return bad
            if entry in current:
                return self._result(True, Action.ADD, current, "Entry already exists (no duplicate added).")
            new = (*current, entry)
            over = self._over_limit(Action.ADD, current, new, len(entry))
            return over or _Change(new, f"Entry added to {self.path.name}.", entry=entry)

        return self._transact(Action.ADD, decide, by)

    def replace(self, old_text: str, content: str, by: Provenance | None = None) -> WriteResult:
        def decide(current: tuple[str, ...]) -> _Change | WriteResult:
            old = clean_text(old_text)
            if not old:
                return self._refused(Action.REPLACE, current, "old_text cannot be empty.")
            entry = clean_text(content)
            if not entry:
                return self._refused(
                    Action.REPLACE, current, "Content cannot be empty (use remove to delete an entry)."
                )
            bad = self._check_content(Action.REPLACE, current, entry)
            if bad is not None:
                return bad
            found = self._find(Action.REPLACE, current, old)
            if isinstance(found, WriteResult):
                return found
            if current[found] == entry:
                return self._result(
                    True, Action.REPLACE, current, "The entry already says that; nothing changed."
                )
            new = parse_entries(join_entries((*current[:found], entry, *current[found + 1 :])))
            # A file already over its limit (edited by hand) may still shrink by a replace.
            grows = len(join_entries(new)) > len(join_entries(current))
            over = self._over_limit(Action.REPLACE, current, new, len(entry)) if grows else None
            if over is not None:
                return over
            merged = (
                " It now equals another entry, so the two were merged." if len(new) < len(current) else ""
            )
            return _Change(
                new, f"Entry replaced in {self.path.name}.{merged}", entry=entry, old_entry=current[found]
            )

        return self._transact(Action.REPLACE, decide, by)

    def remove(self, old_text: str, by: Provenance | None = None) -> WriteResult:
        def decide(current: tuple[str, ...]) -> _Change | WriteResult:
            old = clean_text(old_text)
            if not old:
                return self._refused(Action.REMOVE, current, "old_text cannot be empty.")
            found = self._find(Action.REMOVE, current, old)
            if isinstance(found, WriteResult):
                return found
            new = (*current[:found], *current[found + 1 :])
            return _Change(new, f"Entry removed from {self.path.name}.", old_entry=current[found])

        return self._transact(Action.REMOVE, decide, by)

    # --- decisions -------------------------------------------------------------------
    def _result(
        self, success: bool, action: Action, current: tuple[str, ...], message: str, **kw: Any
    ) -> WriteResult:
        return WriteResult(
            success, message, action, self.target, len(join_entries(current)), self.limit, **kw
        )

    def _refused(self, action: Action, current: tuple[str, ...], message: str, **kw: Any) -> WriteResult:
        return self._result(False, action, current, message, **kw)

    def _with_entries(self, action: Action, current: tuple[str, ...], message: str) -> WriteResult:
        return self._refused(action, current, message, entries=tuple(_shown(e) for e in current))

    def _check_content(self, action: Action, current: tuple[str, ...], entry: str) -> WriteResult | None:
        if any(line.strip() == "§" for line in entry.split("\n")):
            # A line holding only the separator would split the entry in two on disk.
            return self._refused(
                action, current, "Content cannot contain a line with only '§' (the entry separator)."
            )
        threat = scan(entry)
        if threat is not None:
            return self._refused(
                action,
                current,
                f"Blocked ({threat.category}): the content {threat.detail}. Memory is injected into every "
                "future system prompt, so it must not carry injection or exfiltration payloads. Nothing was saved.",
                threat=threat.category,
            )
        return None

    def _over_limit(
        self, action: Action, current: tuple[str, ...], new: tuple[str, ...], entry_len: int
    ) -> WriteResult | None:
        now, after = len(join_entries(current)), len(join_entries(new))
        if after <= self.limit:
            return None
        return self._with_entries(
            action,
            current,
            f"{self.path.name} would exceed its limit: it holds {now:,}/{self.limit:,} chars and this "
            f"{action} needs {after - now:+,} chars (the entry is {entry_len:,} chars). Free at least "
            f"{after - self.limit:,} chars first: replace several entries with one shorter entry or remove "
            "outdated ones, then retry. Current entries are listed.",
        )

    def _find(self, action: Action, current: tuple[str, ...], old: str) -> int | WriteResult:
        """The index of the one entry ``old`` names, or a refusal saying why not."""
        for i, entry in enumerate(current):
            if entry == old:  # an exact whole-entry match wins over substring ambiguity
                return i
        hits = [i for i, entry in enumerate(current) if old in entry]
        if not hits:
            return self._with_entries(
                action, current, f"No entry matched {old!r}. Current entries are listed."
            )
        if len({current[i] for i in hits}) > 1:
            return self._refused(
                action,
                current,
                f"{old!r} matches {len(hits)} different entries; be more specific (quote a longer, unique part).",
                previews=tuple(_preview(current[i]) for i in hits),
            )
        return hits[0]

    # --- the transaction -------------------------------------------------------------
    def journal_entry(self, action: Action, outcome: _Change, by: Provenance | None) -> NewEntry:
        return NewEntry(
            Layer.CURATED,
            self.owner,
            str(action),
            outcome.old_entry,
            outcome.entry,
            by or self._by or Provenance.system(),
        )

    def _transact(
        self,
        action: Action,
        decide: Callable[[tuple[str, ...]], _Change | WriteResult],
        by: Provenance | None = None,
    ) -> WriteResult:
        journal, entry_id = self._journal, None
        try:
            ensure_folder(self.path.parent, self._root)
            with exclusive_lock(self.lock_path, self._lock_timeout):
                if journal is not None:
                    settle_held(journal, Layer.CURATED, self.owner)  # a killed writer's entry first
                try:
                    current = self._read()
                except MemoryUnreadable as e:
                    return self._failure(
                        action,
                        f"{e}: every write is refused until a human fixes it, so nothing is overwritten.",
                    )
                outcome = decide(current)
                if isinstance(outcome, WriteResult):
                    return outcome
                data = join_entries(outcome.entries).encode("utf-8")
                if journal is not None:
                    evidence = FileEvidence(self.lock_path, self.path, digest(data))
                    entry_id = journal.stage(self.journal_entry(action, outcome, by), evidence)
                try:
                    replace_file(self.path, data)
                except BaseException:
                    if journal is not None and entry_id is not None:
                        journal.abort(entry_id)
                    raise
                if journal is not None and entry_id is not None:
                    commit_written(journal, entry_id)
        except MemoryRefused as e:
            return self._failure(action, f"{e.reason} Nothing was saved.")
        except (StoreError, sqlite3.Error) as e:
            return self._failure(action, f"The memory journal cannot be written ({e}). Nothing was saved.")
        except OSError as e:
            return self._failure(action, f"Writing {self.path.name} failed ({e.strerror or e}).")
        return self._saved(action, outcome, entry_id)

    def _saved(self, action: Action, outcome: _Change, journal_id: int | None = None) -> WriteResult:
        """The result of a write that is stored (files and rows alike)."""
        done = "Saved — the write is complete; do not repeat it."
        if action is not Action.REMOVE:
            done += " Your system prompt shows it from the next session on."
        return WriteResult(
            True,
            f"{outcome.message} {done}",
            action,
            self.target,
            len(join_entries(outcome.entries)),
            self.limit,
            changed=True,
            entry=outcome.entry,
            old_entry=outcome.old_entry,
            journal_id=journal_id,
        )

    def _failure(self, action: Action, message: str) -> WriteResult:
        """A refusal outside any decision, with the usage as far as it can be read."""
        try:
            chars = len(join_entries(self._read()))
        except MemoryUnreadable:
            chars = 0
        return WriteResult(False, message, action, self.target, chars, self.limit)


@dataclass(frozen=True, slots=True)
class MemoryBlocks:
    """The curated files of one moment, as every reader needs them: the system prompt
    and the shared-room fence take the ``*_block`` (an unreadable file gives no block),
    people (``/memory``, ``mnemo memory show``) and background memory passes take the
    ``*_text`` (which says that a file cannot be read instead of showing it as empty)."""

    memory: Snapshot
    user: Snapshot | None  # None: no speaker asked for (a shared room, a CLI without --user)
    memory_name: str = "MEMORY.md"

    @property
    def memory_block(self) -> str:
        return self.memory.render_block()

    @property
    def user_block(self) -> str | None:
        return None if self.user is None else self.user.render_block()

    @property
    def memory_text(self) -> str:
        return _for_people(self.memory, "the shared notes (MEMORY.md)")

    @property
    def user_text(self) -> str | None:
        return None if self.user is None else _for_people(self.user, "the profile (USER.md)")

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.memory.warnings + (self.user.warnings if self.user is not None else ())


def _for_people(snap: Snapshot, what: str) -> str:
    if not snap.readable:
        return f"({what} cannot be read: {'; '.join(snap.warnings)})"
    return snap.render_block()


class MemoryFiles:
    """Where the curated files of one profile live: ``<memories_dir>/MEMORY.md`` and
    ``<memories_dir>/users/<platform>/<user_id>/USER.md``.

    With ``identities`` (linked accounts, ``memory/identity.py``) a person's accounts
    share the USER.md of their canonical account: ``user`` resolves it, ``own`` is the
    file of exactly that account (linking merges and unlinking copies with it)."""

    def __init__(
        self,
        memories_dir: Path,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        user_limit: int = DEFAULT_USER_LIMIT,
        *,
        lock_timeout: float = 10.0,
        identities: Identities | None = None,
        journal: DocumentJournal | None = None,
        by: Provenance | None = None,
    ) -> None:
        self.memories_dir = Path(memories_dir)
        self.by = by  # the provenance of writes that name none (e.g. ``mnemo import``'s)
        self.memory_limit = memory_limit
        self.user_limit = user_limit
        self._lock_timeout = lock_timeout
        self.identities = identities
        self.journal = journal  # every file's writes are journaled here (None: not journaled)

    @property
    def users_dir(self) -> Path:
        return self.memories_dir / "users"

    def shared(self) -> CuratedFile:
        return CuratedFile(
            Target.MEMORY,
            self.memories_dir / "MEMORY.md",
            self.memory_limit,
            root=self.memories_dir,
            lock_timeout=self._lock_timeout,
            journal=self.journal,
            by=self.by,
        )

    def user(self, ref: UserRef) -> CuratedFile:
        """The USER.md of one chat user (their canonical account's when linked).
        Nothing is created until the first write."""
        return self.own(self.identities.canonical(ref) if self.identities is not None else ref)

    def own(self, ref: UserRef) -> CuratedFile:
        """The USER.md of exactly this account, links ignored."""
        path = self.users_dir / ref.platform / ref.user_id / "USER.md"
        # UserRef already rejects separators and "..": this catches a symlink in the tree.
        if not path.resolve().is_relative_to(self.users_dir.resolve()):
            raise InvalidIdentifier(f"the USER.md of {ref} would resolve outside {self.users_dir}")
        return CuratedFile(
            Target.USER,
            path,
            self.user_limit,
            root=self.users_dir,
            lock_timeout=self._lock_timeout,
            owner=str(ref),
            journal=self.journal,
            by=self.by,
        )

    def copy_own(self, source: UserRef, dest: UserRef) -> None:
        """``dest``'s own USER.md becomes a copy of ``source``'s own (removed if there is
        none): unlinking an account leaves it a copy of the shared profile. Blocks."""
        src, dst = self.own(source), self.own(dest)
        ensure_folder(dst.path.parent, self.users_dir)
        data = None
        if src.path.is_file():
            with exclusive_lock(src.lock_path, self._lock_timeout):
                data = src.path.read_bytes() if src.path.is_file() else None
        note = f"the profile became a copy of {source}'s (accounts unlinked)"
        with exclusive_lock(dst.lock_path, self._lock_timeout):
            self._journaled(dst, "copy", note, data, lambda: _put(dst.path, data))

    def drop_own(self, ref: UserRef) -> None:
        """Remove exactly this account's USER.md (its entries were merged into another's). Blocks."""
        file = self.own(ref)
        if not file.path.exists():
            return
        note = "the profile was merged into a linked account's"
        with exclusive_lock(file.lock_path, self._lock_timeout):
            self._journaled(file, "drop", note, None, lambda: file.path.unlink(missing_ok=True))

    def _journaled(
        self, file: CuratedFile, op: str, note: str, data: bytes | None, write: Callable[[], None]
    ) -> None:
        """A whole-file change of linking (under the file's lock), journaled as one entry."""
        journal = self.journal
        if journal is None:
            return write()
        settle_held(journal, Layer.CURATED, file.owner)
        entry = NewEntry(
            Layer.CURATED, file.owner, op, None, None, Provenance(Actor.LINKS, Trust.ADMIN), note
        )
        entry_id = journal.stage(entry, FileEvidence(file.lock_path, file.path, digest(data)))
        try:
            write()
        except BaseException:
            journal.abort(entry_id)
            raise
        commit_written(journal, entry_id)

    def blocks(self, speaker: UserRef | None) -> MemoryBlocks:
        """The one reader of the curated files for prompts and people: MEMORY.md and,
        with a speaker, their USER.md, read now (an unreadable file is reported, never
        shown as empty and never overwritten)."""
        return MemoryBlocks(self.shared().load(), None if speaker is None else self.user(speaker).load())


def _put(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    else:
        replace_file(path, data)
