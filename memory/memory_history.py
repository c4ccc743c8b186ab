"""The memory tool's ``history`` action: past and current values of one curated file,
each with the interval it was valid (``since``, ``until``), read from the journal.

Scoped like every read of the tool: the speaker's own profile (their canonical
account's when linked) or the shared memory — never anyone else's — and in a group
not even the speaker's own unless they chose ``groups: shared``. Prompts keep carrying
only current entries; this is how the model answers "what did I use to prefer" and
"since when".
"""

from __future__ import annotations

import asyncio
from typing import Any

from mnemo.memory.curated import Target
from mnemo.memory.errors import InvalidIdentifier, StoreError
from mnemo.memory.journal import Entry, JournalQuery, JournalRepository, Layer
from mnemo.memory.ports import CuratedRepository
from mnemo.memory.scope import UserRef

HISTORY_ACTION = "history"
MAX_VALUES = 40


def _iso(entry_time: Any) -> str | None:
    return None if entry_time is None else entry_time.isoformat()


def values(entries: list[Entry]) -> list[dict[str, Any]]:
    """Each value the file held, newest first: what an entry wrote (valid from that
    entry until a later one replaced or removed it) and, for values older than the
    journal, what a replace or remove ended."""
    out: list[dict[str, Any]] = []
    for e in sorted(entries, key=lambda e: e.id):
        if e.old is not None and e.op in ("replace", "remove") and e.since is None:
            out.append({"value": e.old, "since": None, "until": _iso(e.time), "trust": None})
        if e.new is not None:
            out.append({"value": e.new, "since": _iso(e.time), "until": _iso(e.until), "trust": e.trust})
    out.reverse()
    return out[:MAX_VALUES]


async def past_values(
    files: CuratedRepository,
    journal: JournalRepository | None,
    target: Target,
    speaker: UserRef | None,
    *,
    private: bool,
) -> dict[str, Any]:
    if journal is None:
        return {"success": False, "message": "No memory history is kept here."}
    if target is Target.USER:
        if speaker is None:
            return {
                "success": False,
                "message": "There is no current speaker, so there is no profile history.",
            }
        if private:
            return {
                "success": False,
                "message": "Their profile is private in groups: its history is only shown in a direct message.",
            }
        try:
            file = files.user(speaker)
        except InvalidIdentifier as e:
            return {"success": False, "message": f"The user profile cannot be used: {e}."}
    else:
        file = files.shared()
    try:
        entries = await journal.history(JournalQuery(layer=Layer.CURATED, target=file.owner, limit=200))
    except StoreError as e:
        return {"success": False, "message": f"The memory history cannot be read ({e})."}
    current = (await asyncio.to_thread(file.load)).shown_entries
    return {
        "success": True,
        "target": str(target),
        "values": values(entries),
        "current": list(current),
        "message": "Past and current values, newest first; 'until' null means still current.",
    }
