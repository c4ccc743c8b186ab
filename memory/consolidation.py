"""Consolidation: what one request is asked about a memory file, and what of its answer
may become a proposal.

A curated file fills up with duplicates, stale entries and contradictions that nobody
tidies. Consolidation (``memory.consolidation``, the job in
``gateway/jobs/consolidation.py``) shows the model one file's entries, numbered, and
asks for a JSON list of suggestions — remove an entry, or replace it with a better one
(a merge is a replace plus a remove). Nothing here writes: each valid suggestion
becomes a journal entry with trust ``proposed`` that the person accepts or rejects
(``/memory proposals``); an accepted one goes through the file's normal scanned,
bounded write path. A suggestion the person rejected before, or one already waiting,
is not proposed again.

``parse_suggestions`` trusts nothing in the answer: an unknown operation, an entry
number out of range, a replacement equal to the entry or longer than the file allows,
a second suggestion about the same entry — each is dropped, never guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_SUGGESTIONS = 10
MAX_WHY = 200

CONSOLIDATION_SYSTEM = (
    "You tidy the long-term memory of a chat assistant. You read the entries of one memory file "
    "and suggest removals and replacements; a person decides on each. You never talk to the user."
)

_ASK = """The entries of {whose}, numbered:

{entries}

Find duplicates (two entries saying the same), stale entries (no longer true or useful) and \
contradictions (two entries that cannot both be true). For each, suggest one change:
- {{"op": "remove", "entry": N, "why": "…"}} to drop entry N;
- {{"op": "replace", "entry": N, "new": "…", "why": "…"}} to rewrite entry N (a merge of two \
duplicates: replace one with the merged text and remove the other).
Keep every fact that is still true; never invent one. Say in "why" which kind it is \
(duplicate, stale, contradiction) and why, in a few words.{rejected}
Answer with a JSON list only, [] when nothing needs to change."""

_REJECTED = """
The person already rejected these suggestions; do not make them again:
{lines}"""


@dataclass(frozen=True, slots=True)
class Suggestion:
    op: str  # "remove" | "replace"
    old: str  # the entry as it is in the file
    new: str | None  # the replacement (replace only)
    why: str

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What makes two suggestions the same one (for "rejected before")."""
        return (self.op, self.old.strip(), None if self.new is None else self.new.strip())


def consolidation_prompt(entries: Sequence[str], *, whose: str, rejected: Iterable[Suggestion] = ()) -> str:
    numbered = "\n".join(f"{i}. {e.strip()}" for i, e in enumerate(entries, 1))
    before = [f"- {s.op} “{s.old.strip()}”" + (f" → “{s.new.strip()}”" if s.new else "") for s in rejected][
        :20
    ]
    return _ASK.format(
        whose=whose,
        entries=numbered or "(none)",
        rejected=_REJECTED.format(lines="\n".join(before)) if before else "",
    )


def parse_suggestions(text: str, entries: Sequence[str], *, max_chars: int) -> list[Suggestion]:
    """The valid suggestions in a model's answer (module docstring), at most
    ``MAX_SUGGESTIONS``, at most one per entry; ``max_chars``: the file's limit."""
    items = _json_list(text)
    out: list[Suggestion] = []
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        op, number, why = item.get("op"), item.get("entry"), item.get("why")
        if op not in ("remove", "replace") or isinstance(number, bool) or not isinstance(number, int):
            continue
        if not 1 <= number <= len(entries) or number in seen:
            continue
        old = entries[number - 1]
        new: str | None = None
        if op == "replace":
            raw = item.get("new")
            if not isinstance(raw, str) or not raw.strip():
                continue
            new = " ".join(raw.split())
            if new == " ".join(old.split()) or len(new) > max_chars:
                continue
        reason = " ".join(why.split())[:MAX_WHY] if isinstance(why, str) else ""
        seen.add(number)
        out.append(Suggestion(op, old, new, reason))
        if len(out) == MAX_SUGGESTIONS:
            break
    return out


def _json_list(text: str) -> list[object]:
    """The first JSON list in ``text`` (a fenced block or bare), else []."""
    fenced = re.search(r"```(?:json)?\s*(\[.*?\])\s*```", text, re.S)
    candidates = [fenced.group(1)] if fenced else []
    start, end = text.find("["), text.rfind("]")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, list):
            return value
    return []
