"""The neutral recall-dataset format: loading, importing through the real write path,
and scoring session_search against it.

One file is one chat::

    {"sessions": [{"id", "started_at", "messages": [{"id", "speaker", "content"}]}],
     "questions": [{"id", "question", "evidence": [message ids], "category",
                    "evidence_sessions": [session ids], "asked_in": session id}]}

``started_at`` may be ISO-8601 or free text (``"1:56 pm on 8 May, 2023"``); text that
is not a date keeps the session order and is kept as the session title. ``category``
is optional and unknown keys are ignored. ``evidence_sessions`` (optional) names the
sessions that hold the answer when the data says which sessions but not which turns;
without it they are the sessions of the ``evidence`` messages. ``asked_in`` (optional)
places the question on the timeline: it is asked when the sessions before that one
have been stored and no later one exists yet (what a user asking at that moment could
find); without it the question is asked after the whole chat is stored. A speaker named like an assistant
(``assistant``, ``bot``, ``ai``, ...) becomes an assistant turn; every other speaker is a
user turn with that display name (two-person chats keep both names).

Scores: for a question with evidence ids E and the ranked message ids R returned by
session_search, ``recall@k = |E ∩ R[:k]| / |E|`` and ``any_hit@k = 1 if E ∩ R[:k]``;
both are averaged over the questions that have at least one evidence id.
``session_recall@k`` is the share of the evidence sessions holding at least one of
R[:k], averaged over the questions with evidence sessions. ``seen`` (with the tool's
output, ``mnemo bench recall --as-tool``) is the share of E present anywhere in what
the tool returned, hits and the turns around them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from mnemo.memory.errors import InvalidDataset
from mnemo.memory.ports import SessionStorage
from mnemo.memory.sessions import NewMessage

ASSISTANT_SPEAKERS = frozenset({"assistant", "bot", "ai", "model", "claude", "mnemo", "agent"})
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B %Y", "%B %d, %Y", "%Y/%m/%d %H:%M")


@dataclass(frozen=True, slots=True)
class DatasetMessage:
    id: str
    speaker: str
    content: str


@dataclass(frozen=True, slots=True)
class DatasetSession:
    id: str
    started_at: str
    messages: tuple[DatasetMessage, ...]


@dataclass(frozen=True, slots=True)
class DatasetQuestion:
    id: str
    question: str
    evidence: tuple[str, ...]
    category: str | None
    evidence_sessions: tuple[str, ...] = ()
    asked_in: str | None = None  # a session id: only the sessions before it exist yet


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    sessions: tuple[DatasetSession, ...]
    questions: tuple[DatasetQuestion, ...]

    @property
    def message_count(self) -> int:
        return sum(len(s.messages) for s in self.sessions)


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidDataset(f"{where}: missing {key!r}")
    return obj[key]


def parse_dataset(data: Any, name: str) -> Dataset:
    if not isinstance(data, dict):
        raise InvalidDataset(f"{name}: the top level must be an object with 'sessions'")
    sessions = []
    for si, s in enumerate(_field(data, "sessions", name)):
        where = f"{name}: sessions[{si}]"
        if not isinstance(s, dict):
            raise InvalidDataset(f"{where}: must be an object")
        msgs = []
        for mi, m in enumerate(_field(s, "messages", where)):
            mw = f"{where}.messages[{mi}]"
            if not isinstance(m, dict):
                raise InvalidDataset(f"{mw}: must be an object")
            content = _field(m, "content", mw)
            if not isinstance(content, str):
                raise InvalidDataset(f"{mw}: 'content' must be a string")
            msgs.append(DatasetMessage(str(_field(m, "id", mw)), str(m.get("speaker") or "user"), content))
        sessions.append(DatasetSession(str(s.get("id", si)), str(s.get("started_at") or ""), tuple(msgs)))
    session_ids = {s.id for s in sessions}
    session_of = {m.id: s.id for s in sessions for m in s.messages}
    questions = []
    for qi, q in enumerate(data.get("questions") or ()):
        where = f"{name}: questions[{qi}]"
        if not isinstance(q, dict):
            raise InvalidDataset(f"{where}: must be an object")
        evidence = q.get("evidence")
        if evidence is None:
            evidence = []
        if not isinstance(evidence, list):
            raise InvalidDataset(f"{where}: 'evidence' must be a list of message ids")
        category = q.get("category")
        in_sessions = q.get("evidence_sessions") or []
        if not isinstance(in_sessions, list):
            raise InvalidDataset(f"{where}: 'evidence_sessions' must be a list of session ids")
        asked_in = q.get("asked_in")
        if asked_in is not None and str(asked_in) not in session_ids:
            raise InvalidDataset(f"{where}: 'asked_in' names no session ({asked_in!r})")
        ids = tuple(str(e) for e in evidence)
        questions.append(
            DatasetQuestion(
                str(q.get("id", qi)),
                str(_field(q, "question", where)),
                ids,
                None if category is None else str(category),
                tuple(str(e) for e in in_sessions)
                or tuple(dict.fromkeys(session_of[e] for e in ids if e in session_of)),
                None if asked_in is None else str(asked_in),
            )
        )
    return Dataset(name, tuple(sessions), tuple(questions))


def load_dataset(path: Path) -> Dataset:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidDataset(f"{path}: cannot read: {e}") from e
    return parse_dataset(data, path.stem)


def dataset_files(paths: Iterable[Path]) -> list[Path]:
    """Expand folders into their ``*.json`` files (sorted); keep files as given."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.glob("*.json")))
        elif p.is_file():
            out.append(p)
        else:
            raise InvalidDataset(f"{p}: no such file or folder")
    if not out:
        raise InvalidDataset("no dataset files found")
    return out


def parse_started_at(text: str) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        for fmt in _DATE_FORMATS:
            try:
                dt = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
        else:
            return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ImportReport:
    chat_key: str
    sessions: int
    messages: int
    id_map: Mapping[str, int]  # dataset message id -> store message id
    session_map: Mapping[str, str] = field(default_factory=dict)  # dataset session id -> store session id


Progress = Callable[[int, int], None]  # (messages done, messages total)


class DatasetImport:
    """Stores the sessions of one dataset in chat ``chat_key`` in timeline order, a
    stretch at a time (``add``): the recall benchmark asks a question placed on the
    timeline when exactly the sessions before it are stored. One transaction per
    session, through the real write path."""

    def __init__(self, store: SessionStorage, dataset: Dataset, chat_key: str) -> None:
        self.store = store
        self.dataset = dataset
        self.chat_key = chat_key
        self.platform = chat_key.split(":", 1)[0] or "import"
        self.id_map: dict[str, int] = {}
        self.session_map: dict[str, str] = {}
        self.messages = 0
        self._clock = datetime(2000, 1, 1, tzinfo=UTC)

    async def add(self, sessions: Iterable[DatasetSession], progress: Progress | None = None) -> None:
        total = self.dataset.message_count
        for s in sessions:
            started = parse_started_at(s.started_at)
            title = None
            if started is None:
                # Free text that is not a date: keep the order, keep the text for humans.
                started = self._clock + timedelta(minutes=1)
                title = s.started_at or None
            self._clock = started
            row = await self.store.create_session(
                chat_key=self.chat_key,
                platform=self.platform,
                chat_id=self.dataset.name,
                thread_id=None,
                user_id=None,
                agent_context="primary",
                source="import",
                model="import",
                system_prompt="",
                title=title,
                started_at=started,
            )
            new = [
                NewMessage(
                    role="assistant" if m.speaker.strip().lower() in ASSISTANT_SPEAKERS else "user",
                    content=m.content,
                    author_name=m.speaker,
                    created_at=started + timedelta(seconds=i),
                    meta={"dataset_id": m.id},
                )
                for i, m in enumerate(s.messages)
            ]
            ids = await self.store.append_messages(row.id, new)
            self.id_map.update((m.id, i) for m, i in zip(s.messages, ids, strict=True))
            self.session_map[s.id] = row.id
            await self.store.end_session(row.id, "imported")
            self.messages += len(new)
            if progress is not None:
                progress(self.messages, total)

    def report(self) -> ImportReport:
        return ImportReport(
            self.chat_key, len(self.session_map), self.messages, dict(self.id_map), dict(self.session_map)
        )


async def import_dataset(
    store: SessionStorage, dataset: Dataset, chat_key: str, *, progress: Progress | None = None
) -> ImportReport:
    """Store every session of ``dataset`` in chat ``chat_key``: one transaction per session."""
    stretch = DatasetImport(store, dataset, chat_key)
    await stretch.add(dataset.sessions, progress)
    return stretch.report()


def timeline(dataset: Dataset) -> list[tuple[tuple[DatasetSession, ...], tuple[DatasetQuestion, ...]]]:
    """``(sessions to store, then questions to ask)`` stretches in timeline order: each
    question with ``asked_in`` right before its session is stored, the rest at the end."""
    at: dict[str, list[DatasetQuestion]] = {}
    last: list[DatasetQuestion] = []
    for q in scorable(dataset):
        (at.setdefault(q.asked_in, []) if q.asked_in is not None else last).append(q)
    out: list[tuple[tuple[DatasetSession, ...], tuple[DatasetQuestion, ...]]] = []
    pending: list[DatasetSession] = []
    for s in dataset.sessions:
        if s.id in at:
            out.append((tuple(pending), tuple(at[s.id])))
            pending = []
        pending.append(s)
    out.append((tuple(pending), tuple(last)))
    return out


# --- scoring ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuestionOutcome:
    question_id: str
    category: str | None
    evidence: frozenset[str]
    ranked: tuple[str, ...]  # dataset ids of the returned messages, best first
    evidence_sessions: frozenset[str] = frozenset()
    ranked_sessions: tuple[str, ...] = ()  # the dataset session of each of ``ranked``
    # With the tool's output (``--as-tool``): the dataset ids it shows, and its size.
    shown: frozenset[str] | None = None
    tokens: int | None = None

    def recall_at(self, k: int) -> float:
        return len(self.evidence.intersection(self.ranked[:k])) / len(self.evidence)

    def any_hit_at(self, k: int) -> float:
        return 1.0 if self.evidence.intersection(self.ranked[:k]) else 0.0

    def session_recall_at(self, k: int) -> float:
        return len(self.evidence_sessions.intersection(self.ranked_sessions[:k])) / len(
            self.evidence_sessions
        )

    @property
    def seen(self) -> float:
        assert self.shown is not None
        return len(self.evidence & self.shown) / len(self.evidence)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _percentile(values: Sequence[int], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the nearest ranks."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(outcomes: Sequence[QuestionOutcome], ks: Sequence[int]) -> dict[str, float]:
    """``{"recall@K": mean, "any_hit@K": mean, "session_recall@K": mean, ...}`` (0.0 for
    no questions); with the tool's output also ``seen``, ``tokens_median``, ``tokens_p95``.
    Message-level figures count the questions with evidence messages, session-level ones
    the questions with evidence sessions."""
    out: dict[str, float] = {}
    turn = [o for o in outcomes if o.evidence]
    whole = [o for o in outcomes if o.evidence_sessions]
    for k in ks:
        out[f"recall@{k}"] = _mean([o.recall_at(k) for o in turn])
        out[f"any_hit@{k}"] = _mean([o.any_hit_at(k) for o in turn])
    for k in ks:
        out[f"session_recall@{k}"] = _mean([o.session_recall_at(k) for o in whole])
    shown = [o for o in outcomes if o.shown is not None]
    if shown:
        out["seen"] = _mean([o.seen for o in shown if o.evidence])
        tokens = [o.tokens or 0 for o in shown]
        out["tokens_median"] = _percentile(tokens, 50)
        out["tokens_p95"] = _percentile(tokens, 95)
    return out


def scorable(dataset: Dataset) -> list[DatasetQuestion]:
    return [q for q in dataset.questions if q.evidence or q.evidence_sessions]


class HasMessageIds(Protocol):
    @property
    def message_ids(self) -> tuple[int, ...]: ...


class Searcher(Protocol):
    """What scoring needs from session_search (``memory.search.SessionSearch``)."""

    async def search(self, query: str, *, chat_keys: Sequence[str], limit: int) -> HasMessageIds: ...


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """What the ``session_search`` tool showed the model for one question."""

    message_ids: frozenset[int]  # every message present in the output
    tokens: int  # the output's estimated size


# One question asked the way the model asks it: (query, chat key) -> what it was shown.
AskTool = Callable[[str, str], Awaitable[ToolAnswer]]


async def ask_questions(
    search: Searcher,
    dataset: Dataset,
    report: ImportReport,
    limit: int,
    *,
    questions: Sequence[DatasetQuestion] | None = None,
    as_tool: AskTool | None = None,
) -> list[QuestionOutcome]:
    """Ask every question with evidence (or ``questions``) in the dataset's chat; rank by
    the returned hits. ``as_tool``: also ask through the tool and record what it shows."""
    back = {v: k for k, v in report.id_map.items()}
    session_of = {m.id: s.id for s in dataset.sessions for m in s.messages}
    outcomes = []
    for q in scorable(dataset) if questions is None else questions:
        result = await search.search(q.question, chat_keys=(report.chat_key,), limit=limit)
        ranked = tuple(back[i] for i in result.message_ids if i in back)
        shown: frozenset[str] | None = None
        tokens: int | None = None
        if as_tool is not None:
            answer = await as_tool(q.question, report.chat_key)
            shown = frozenset(back[i] for i in answer.message_ids if i in back)
            tokens = answer.tokens
        outcomes.append(
            QuestionOutcome(
                q.id,
                q.category,
                frozenset(q.evidence),
                ranked,
                frozenset(q.evidence_sessions),
                tuple(session_of[r] for r in ranked),
                shown,
                tokens,
            )
        )
    return outcomes
