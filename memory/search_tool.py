"""The ``session_search`` tool: its schema, and one call from arguments to the text the
model reads (``memory/search_view.py`` builds it from the search's hits).

Bad input never raises: an empty or missing query or a malformed limit comes back as
an error result the model can read and correct. When the index is incomplete (older
messages still being re-indexed, messages not embedded yet) the result says so, so the
model knows a miss may not mean "never said".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from mnemo.memory.search import IndexStatus, SearchDigest, SearchResult
from mnemo.memory.search_view import ToolView, ViewSettings, build_view

if TYPE_CHECKING:  # memory/ports.py imports memory/search.py
    from mnemo.memory.ports import SearchRepository

log = structlog.get_logger(__name__)

SESSION_SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "name": "session_search",
    "description": (
        "Search the earlier conversations of this chat (previous sessions, including ones "
        "that were compressed or reset). Use it when the user refers to something said before "
        "that is not in the current context, or asks what they told you in the past. Give a few "
        "distinctive words (names, places, things), not a whole sentence, and keep the names of "
        "people, pets and places in the query; quotes search an exact phrase. Returns the best "
        "matches with the turns around them, grouped by conversation with its date, as many as "
        "fit a fixed size. For a list (every trip, all the books) or when the answer is not "
        "there, search again with other words."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for, e.g. 'Biscuit vet appointment'."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "At most this many matches (default: as many as fit).",
            },
        },
        "required": ["query"],
    },
}


@dataclass(frozen=True, slots=True)
class SearchToolOutput:
    text: str
    is_error: bool = False
    view: ToolView | None = None  # what was shown (None for errors and digests)


def status_notes(status: IndexStatus | None) -> list[str]:
    """One line per way the index is incomplete, in words the model can act on."""
    if status is None:
        return []
    notes = []
    if not status.text_complete:
        notes.append(
            f"Note: the search index is being rebuilt ({status.text_percent:.0f}% done); until it "
            "finishes, matches are ranked the older way and some may be missing."
        )
    if status.vectors_pending:
        notes.append(
            f"Note: {status.vectors_pending_text} messages are not in the meaning-based index yet; "
            "they are found by their words only."
        )
    return notes


def _error(text: str) -> SearchToolOutput:
    return SearchToolOutput(f"Error: {text}", is_error=True)


def _digest_text(query: str, summary: str, result: SearchResult, notes: Sequence[str]) -> str:
    lines = [f'session_search "{query}": {len(result.hits)} matching messages, summarised:', *notes, summary]
    lines.append("Conversations: " + ", ".join(f"{s.started_at:%Y-%m-%d}" for s in result.sessions))
    return "\n".join(lines)


async def run_session_search_tool(
    search: SearchRepository,
    args: Mapping[str, Any],
    *,
    chat_key: str,
    current_session_id: str | None,
    view: ViewSettings,
    max_limit: int,
    digest: SearchDigest | None = None,
    also_chat_keys: Sequence[str] = (),
) -> SearchToolOutput:
    """Handle one ``session_search`` call. ``also_chat_keys``: other chats the caller may
    see (their DMs on linked accounts). ``view``: how much to show (its ``max_hits`` is
    what a search returns at most)."""
    query = args.get("query") if isinstance(args, Mapping) else None
    if not isinstance(query, str) or not query.strip():
        return _error("session_search needs a non-empty 'query': a few words to look for.")
    raw_limit = args.get("limit")
    limit: int | None = None
    if raw_limit is not None:
        if isinstance(raw_limit, bool) or not isinstance(raw_limit, int | float | str):
            return _error(f"'limit' must be a whole number between 1 and {max_limit}.")
        try:
            limit = max(1, min(int(raw_limit), max_limit))
        except ValueError:
            return _error(f"'limit' must be a whole number between 1 and {max_limit}.")
    excluded = (current_session_id,) if current_session_id else ()
    keys = (chat_key, *also_chat_keys)
    result = await search.search(
        query,
        chat_keys=keys,
        limit=view.max_hits if limit is None else limit,
        exclude_session_ids=excluded,
        around=(view.before, view.after),
    )
    notes = status_notes(await search.index_status())
    if not result.hits:
        text = "\n".join(
            [f'session_search "{query}": no earlier messages matched. Try other or fewer words.', *notes]
        )
        return SearchToolOutput(text)
    if digest is not None:
        try:
            summary = await digest.summarize(query, result)
        except Exception as e:  # any failure of the auxiliary model: the plain hits instead
            log.warning("session_search.digest_failed", error=repr(e))
        else:
            return SearchToolOutput(_digest_text(query, summary, result, notes))
    shown = build_view(query, result, view, limit=limit, notes=notes)
    return SearchToolOutput(shown.text, view=shown)
