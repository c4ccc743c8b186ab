"""The neutral recall-dataset format: loading, importing through the real write path,
and scoring session_search against it.

One file is one chat::

    {"sessions": [{"id", "started_at", "messages": [{"id", "speaker", "content"}]}],
     "questions": [{"id", "question", "evidence": [message ids], "category"}]}

``started_at`` may be ISO-8601 or free text (``"1:56 pm on 8 May, 2023"``); text that
is not a date keeps the session order and is kept as the session title. ``category``
is optional and unknown keys are ignored. A speaker named like an assistant
(``assistant``, ``bot``, ``ai``, ...) becomes an assistant turn; every other speaker is a
user turn with that display name (two-person chats keep both names).

Scores: for a question with evidence ids E and the ranked message ids R returned by
session_search, ``recall@k = |E ∩ R[:k]| / |E|`` and ``any_hit@k = 1 if E ∩ R[:k]``;
both are averaged over the questions that have at least one evidence id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
        questions.append(
            DatasetQuestion(
                str(q.get("id", qi)),
                str(_field(q, "question", where)),
                tuple(str(e) for e in evidence),
                None if category is None else str(category),
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


Progress = Callable[[int, int], None]  # (messages done, messages total)


async def import_dataset(
    store: SessionStorage, dataset: Dataset, chat_key: str, *, progress: Progress | None = None
) -> ImportReport:
    """Store every session of ``dataset`` in chat ``chat_key``: one transaction per session."""
    platform = chat_key.split(":", 1)[0] or "import"
    id_map: dict[str, int] = {}
    done, total = 0, dataset.message_count
    clock = datetime(2000, 1, 1, tzinfo=UTC)
    for s in dataset.sessions:
        started = parse_started_at(s.started_at)
        title = None
        if started is None:
            # Free text that is not a date: keep the order, keep the text for humans.
            started = clock + timedelta(minutes=1)
            title = s.started_at or None
        clock = started
        row = await store.create_session(
            chat_key=chat_key,
            platform=platform,
            chat_id=dataset.name,
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
        ids = await store.append_messages(row.id, new)
        id_map.update((m.id, i) for m, i in zip(s.messages, ids, strict=True))
        await store.end_session(row.id, "imported")
        done += len(new)
        if progress is not None:
            progress(done, total)
    return ImportReport(chat_key, len(dataset.sessions), done, id_map)


# --- scoring ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuestionOutcome:
    question_id: str
    category: str | None
    evidence: frozenset[str]
    ranked: tuple[str, ...]  # dataset ids of the returned messages, best first

    def recall_at(self, k: int) -> float:
        return len(self.evidence.intersection(self.ranked[:k])) / len(self.evidence)

    def any_hit_at(self, k: int) -> float:
        return 1.0 if self.evidence.intersection(self.ranked[:k]) else 0.0


def summarize(outcomes: Sequence[QuestionOutcome], ks: Sequence[int]) -> dict[str, float]:
    """``{"recall@K": mean, "any_hit@K": mean, ...}`` (0.0 for no questions)."""
    out: dict[str, float] = {}
    n = len(outcomes)
    for k in ks:
        out[f"recall@{k}"] = sum(o.recall_at(k) for o in outcomes) / n if n else 0.0
        out[f"any_hit@{k}"] = sum(o.any_hit_at(k) for o in outcomes) / n if n else 0.0
    return out


def scorable(dataset: Dataset) -> list[DatasetQuestion]:
    return [q for q in dataset.questions if q.evidence]


class HasMessageIds(Protocol):
    @property
    def message_ids(self) -> tuple[int, ...]: ...


class Searcher(Protocol):
    """What scoring needs from session_search (``memory.search.SessionSearch``)."""

    async def search(self, query: str, *, chat_keys: Sequence[str], limit: int) -> HasMessageIds: ...


async def ask_questions(
    search: Searcher, dataset: Dataset, report: ImportReport, limit: int
) -> list[QuestionOutcome]:
    """Ask every question with evidence in the dataset's chat; rank by the returned hits."""
    back = {v: k for k, v in report.id_map.items()}
    outcomes = []
    for q in scorable(dataset):
        result = await search.search(q.question, chat_keys=(report.chat_key,), limit=limit)
        ranked = tuple(back[i] for i in result.message_ids if i in back)
        outcomes.append(QuestionOutcome(q.id, q.category, frozenset(q.evidence), ranked))
    return outcomes
