"""What people read of a search: ``/search``, ``mnemo sessions search`` and the dashboard.

The session_search *tool* renders the same ``SearchResult`` for the model (memory/);
this module renders it for a person, who reads a search result like a transcript:

* hits grouped per conversation, conversations and lines in time order (a hit and
  the turns right before and after it, each message once);
* each line ``date · speaker: text``, never a blank line;
* no tool traffic: tool results (raw JSON) and empty assistant turns (a tool call
  with no words) are left out;
* names, not ids: the author's display name; the person searching is "you"; the bot
  is "mnemo"; an account known only by an opaque id (the web chat's 32 hex digits)
  is "web user 3f9a1c".

``conversations`` builds the typed view; ``render_text`` is the plain text of a chat
reply or a terminal; the dashboard builds its HTML from the same view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo

from mnemo.memory.search import SearchHit, SearchResult, SessionHits

BOT_NAME = "mnemo"
YOU = "you"
# An id nobody can read: long runs of hex digits or random characters (web chat ids).
_OPAQUE = re.compile(r"[0-9a-fA-F-]{16,}|[A-Za-z0-9_-]{24,}")
_SPEAKING_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class Line:
    message_id: int
    at: datetime
    speaker: str
    text: str
    hit: bool  # a match of the query (else a turn around one)


@dataclass(frozen=True, slots=True)
class Conversation:
    session_id: str
    chat_key: str
    title: str | None
    started_at: datetime
    lines: tuple[Line, ...]  # in time order


def person(author_id: str | None, author_name: str | None, platform: str, me: str | None = None) -> str:
    """The name a person is shown by."""
    if me is not None and author_id == me:
        return YOU
    if author_name and author_name != author_id:
        return author_name
    if not author_id:
        return "someone"
    if _OPAQUE.fullmatch(author_id):
        return f"{platform} user {author_id[:6]}".strip()
    return author_id


def conversations(result: SearchResult, *, me: str | None = None) -> list[Conversation]:
    """The readable view of ``result``: conversations oldest first, lines in time order.
    ``me`` is the searching person's id on the chat's platform (shown as "you")."""
    out = []
    for group in result.sessions:
        lines = _lines(group, me)
        if lines:
            out.append(Conversation(group.session_id, group.chat_key, group.title, group.started_at, lines))
    out.sort(key=lambda c: (c.started_at, c.session_id))
    return out


def _lines(group: SessionHits, me: str | None) -> tuple[Line, ...]:
    platform = group.chat_key.split(":", 1)[0]
    hits = [h for h in group.hits if h.role in _SPEAKING_ROLES and _clean(h.snippet)]
    names = {h.author_id: _hit_speaker(h, platform, me) for h in hits if h.author_id}
    by_id: dict[int, Line] = {}
    for h in hits:
        by_id[h.message_id] = Line(
            h.message_id, h.created_at, _hit_speaker(h, platform, me), _clean(h.snippet), True
        )
    for h in hits:
        for turn in (h.before, h.after):
            if turn is None or turn.message_id in by_id:
                continue
            text = _clean(turn.text)
            if not text or turn.speaker == "tool":
                continue
            speaker = _context_speaker(turn.speaker, names, platform, me)
            by_id[turn.message_id] = Line(turn.message_id, turn.created_at, speaker, text, False)
    return tuple(sorted(by_id.values(), key=lambda line: (line.at, line.message_id)))


def _hit_speaker(hit: SearchHit, platform: str, me: str | None) -> str:
    if hit.role == "assistant":
        return BOT_NAME
    return person(hit.author_id, hit.author_name, platform, me)


def _context_speaker(speaker: str, names: dict[str, str], platform: str, me: str | None) -> str:
    """A context turn carries one ``speaker`` string: its author's name, else id, else role."""
    if speaker == "assistant":
        return BOT_NAME
    if speaker in names:
        return names[speaker]
    if speaker == "user":
        return "someone"
    return person(speaker, None, platform, me)


def _clean(text: str) -> str:
    return " ".join(text.split())


def render_text(
    found: list[Conversation], *, tz: tzinfo | None = None, with_keys: bool = False, indent: str = "  "
) -> str:
    """Plain text: a heading per conversation, then its lines. ``with_keys`` adds the
    session id and chat key to each heading (the operator's view)."""
    out: list[str] = []
    for c in found:
        head = f"Conversation of {_local(c.started_at, tz):%Y-%m-%d %H:%M}"
        if c.title:
            head += f" · {c.title}"
        if with_keys:
            head += f"  [{c.session_id} in {c.chat_key}]"
        out.append(head)
        out += [f"{indent}{line_text(line, tz)}" for line in c.lines]
    return "\n".join(out)


def line_text(line: Line, tz: tzinfo | None = None) -> str:
    return f"{_local(line.at, tz):%Y-%m-%d %H:%M} · {line.speaker}: {line.text}"


def _local(at: datetime, tz: tzinfo | None) -> datetime:
    return at.astimezone(tz) if tz is not None and at.tzinfo is not None else at
