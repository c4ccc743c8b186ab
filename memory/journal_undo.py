"""Undo (``/memory undo``), revert (``mnemo memory revert``, the dashboard) and confirm
(``/memory confirm``): a journal entry turned back into a write, through the same
scanned, bounded write path as every other write (``CuratedDocument``), journaled with
``reverts`` naming the entry it undoes.

The inverse of a curated write: an ``add`` is undone by removing that exact entry, a
``replace`` by replacing the new text with the old, a ``remove`` by adding the old text
again. An entry whose value was changed since (its text is no longer in the file) is
not undone: the reason says which value is there instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

from mnemo.memory.curated import WriteResult
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import SHARED, Entry, Provenance
from mnemo.memory.ports import CuratedDocument, CuratedRepository
from mnemo.memory.scope import UserRef


@dataclass(frozen=True, slots=True)
class Undone:
    ok: bool
    message: str
    result: WriteResult | None = None


def document(files: CuratedRepository, target: str) -> CuratedDocument:
    """The curated file a journal target names (the owner's own USER.md: the entry was
    written to exactly that file). Raises ``InvalidIdentifier`` for a bad target."""
    return files.shared() if target == SHARED else files.own(UserRef.parse(target))


def undo(files: CuratedRepository, entry: Entry, by: Provenance) -> Undone:
    """Write the inverse of ``entry`` (blocking). ``by`` is who undoes it; the write is
    journaled with ``reverts = entry.id``."""
    if not entry.undoable:
        return Undone(False, f"#{entry.id} ({entry.layer} {entry.op}) cannot be undone here.")
    try:
        file = document(files, entry.target)
    except InvalidIdentifier as e:
        return Undone(False, f"#{entry.id} names no usable file ({e}).")
    by = by.undoing(entry.id)
    current = file.load().entries
    if entry.op in ("add", "replace") and entry.new not in current:
        return Undone(
            False, f"#{entry.id} cannot be undone: “{entry.new}” is no longer there (it changed since)."
        )
    if entry.op == "add":
        result = file.remove(entry.new or "", by)
    elif entry.op == "replace":
        result = file.replace(entry.new or "", entry.old or "", by)
    else:
        if entry.old in current:
            return Undone(False, f"#{entry.id} is undone already: “{entry.old}” is there again.")
        result = file.add(entry.old or "", by)
    if not result.success:
        return Undone(False, result.message, result)
    return Undone(True, f"Undone #{entry.id}: {_restored(entry)}", result)


def _restored(entry: Entry) -> str:
    if entry.op == "add":
        return f"“{entry.new}” is gone again."
    if entry.op == "replace":
        return f"back to “{entry.old}”."
    return f"“{entry.old}” is back."


def apply_proposal(files: CuratedRepository, proposal: Entry, by: Provenance) -> Undone:
    """Write what a proposal asked for (``/memory confirm``), as ``by`` (the person)."""
    try:
        file = document(files, proposal.target)
    except InvalidIdentifier as e:
        return Undone(False, f"#{proposal.id} names no usable file ({e}).")
    if proposal.op == "add":
        result = file.add(proposal.new or "", by)
    elif proposal.op == "replace":
        result = file.replace(proposal.old or "", proposal.new or "", by)
    elif proposal.op == "remove":
        result = file.remove(proposal.old or "", by)
    else:
        return Undone(False, f"#{proposal.id} is no proposal I can apply ({proposal.op}).")
    return Undone(result.success, result.message, result)
