"""What the ``session_search`` tool shows the model: windows of conversation within a
token budget.

A hit alone is often not the answer: a short reply ("usually about an hour") carries
its topic in the turn before it, a fact is confirmed in the turn after it. So every hit
comes with a window of its session (``before`` turns and ``after`` turns), windows
that overlap or touch are merged, and each session is shown once, its turns in the
order they were said, the date once in the session's header and the speaker once per
turn. Hits are added best first while the rendered text stays within ``max_tokens``
(``search.max_result_tokens``), so the model gets as many windows as the budget holds
instead of a fixed number of hits; at least the best hit is always shown (its window
shortened to fit, its text cut).

Every turn shown comes from a hit's own session, and every hit was checked against the
chat's scope by the search itself: a window never reaches outside the scope.
``build_view`` returns the text with the message ids it shows (``mnemo bench recall
--as-tool`` measures how much of the evidence reaches the model from exactly this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mnemo.memory.fts_query import parse
from mnemo.memory.search import SearchHit, SearchResult, SessionHits, make_snippet
from mnemo.memory.tokens import estimate_tokens

BUDGET_HITS = 40  # matches a budgeted result is filled from (20 filled a third of 2,000 tokens)


@dataclass(frozen=True, slots=True)
class ViewSettings:
    max_tokens: int = 2000  # 0: no budget, show ``max_hits`` hits
    max_hits: int = BUDGET_HITS  # with the budget on, as many as fit of these
    before: int = 2  # turns shown before each hit
    after: int = 2  # and after it
    hit_chars: int = 360  # a hit's text is cut around the words searched for
    turn_chars: int = 240  # a turn around a hit is cut at its end


@dataclass(frozen=True, slots=True)
class ToolView:
    text: str
    message_ids: frozenset[int]  # every message shown (hits and the turns around them)
    shown: int  # hits shown
    found: int  # hits the search returned
    tokens: int


@dataclass(frozen=True, slots=True)
class _Turn:
    message_id: int
    speaker: str
    created_at: datetime
    text: str
    hit: bool


@dataclass(frozen=True, slots=True)
class _Shown:
    """What is shown so far: each session's turns by id, which ids are known to follow
    each other, and which turns are known to open or close their session."""

    order: tuple[str, ...] = ()  # sessions, best hit first
    turns: tuple[tuple[str, _Turn], ...] = ()
    adjacent: frozenset[tuple[int, int]] = frozenset()
    firsts: frozenset[int] = frozenset()
    lasts: frozenset[int] = frozenset()
    hits: int = 0

    def add(self, hit: SearchHit, query: str, s: ViewSettings, before: int, after: int) -> _Shown:
        earlier = hit.turns_before[len(hit.turns_before) - before :] if before else ()
        later = hit.turns_after[:after]
        new = [_Turn(t.message_id, t.speaker, t.created_at, t.cut(s.turn_chars), False) for t in earlier]
        text = make_snippet(hit.content, parse(query), s.hit_chars) if hit.content else hit.snippet
        new.append(_Turn(hit.message_id, hit.speaker, hit.created_at, text, True))
        new += [_Turn(t.message_id, t.speaker, t.created_at, t.cut(s.turn_chars), False) for t in later]
        seq = (
            [t.message_id for t in hit.turns_before]
            + [hit.message_id]
            + [t.message_id for t in hit.turns_after]
        )
        by_id = {t.message_id: (sid, t) for sid, t in self.turns}
        for t in new:
            old = by_id.get(t.message_id)
            by_id[t.message_id] = (hit.session_id, old[1] if old and old[1].hit else t)
        firsts, lasts = set(self.firsts), set(self.lasts)
        if before >= len(hit.turns_before) and not hit.more_before:
            firsts.add(new[0].message_id)
        if after >= len(hit.turns_after) and not hit.more_after:
            lasts.add(new[-1].message_id)
        return _Shown(
            self.order if hit.session_id in self.order else (*self.order, hit.session_id),
            tuple(by_id.values()),
            self.adjacent | set(zip(seq, seq[1:], strict=False)),
            frozenset(firsts),
            frozenset(lasts),
            self.hits + 1,
        )

    @property
    def message_ids(self) -> frozenset[int]:
        return frozenset(t.message_id for _, t in self.turns)

    def render(self, query: str, result: SearchResult, notes: Sequence[str]) -> str:
        found = len(result.hits)
        head = f'session_search "{query}": {found} matching message{"s" if found != 1 else ""}'
        if self.hits < found:
            head += f", the best {self.hits} shown (search again with other words for more)"
        lines = [head + "; » marks a match, the turns around it are shown for context.", *notes]
        groups = {g.session_id: g for g in result.sessions}
        for sid in self.order:
            group = groups[sid]
            day = group.started_at.date()
            lines += ["", _header(group)]
            turns = sorted((t for s, t in self.turns if s == sid), key=lambda t: t.message_id)
            previous: int | None = None
            for t in turns:
                if (previous is None and t.message_id not in self.firsts) or (
                    previous is not None and (previous, t.message_id) not in self.adjacent
                ):
                    lines.append("…")
                when = "" if t.created_at.date() == day else f"[{t.created_at:%Y-%m-%d}] "
                lines.append(f"{'» ' if t.hit else ''}{when}{t.speaker}: {t.text}")
                previous = t.message_id
            if previous is not None and previous not in self.lasts:
                lines.append("…")
        return "\n".join(lines)


def _header(group: SessionHits) -> str:
    parts = [group.started_at.strftime("%Y-%m-%d (%a)")]
    if group.title:
        parts.append(f"“{group.title}”")
    if group.source == "cron":
        parts.append("a scheduled run")
    return "## conversation of " + ", ".join(parts)


def build_view(
    query: str,
    result: SearchResult,
    settings: ViewSettings,
    *,
    limit: int | None = None,
    notes: Sequence[str] = (),
) -> ToolView:
    """The tool's text for ``result``: hits best first, as many as fit the budget (at
    most ``limit`` when the model asked for a number, else ``settings.max_hits``)."""
    cap = settings.max_hits if limit is None else limit
    budget = settings.max_tokens
    shown = _Shown()
    text = shown.render(query, result, notes)
    for hit in result.hits[:cap]:
        # The full window; when even the best hit's does not fit, a shorter one.
        shapes = [(settings.before, settings.after)]
        if shown.hits == 0:
            shapes += [(min(1, settings.before), min(1, settings.after)), (0, 0)]
        for before, after in shapes:
            trial = shown.add(hit, query, settings, before, after)
            trial_text = trial.render(query, result, notes)
            if (
                not budget
                or estimate_tokens(trial_text) <= budget
                or (shown.hits == 0 and (before, after) == (0, 0))
            ):
                shown, text = trial, trial_text
                break
    if budget and estimate_tokens(text) > budget:
        text = text[: budget * 4 - 1].rstrip() + "…"  # one enormous message: cut, never overflow
    return ToolView(text, shown.message_ids, shown.hits, len(result.hits), estimate_tokens(text))
