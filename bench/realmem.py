"""Convert RealMemBench dialogues into the recall dataset format (``memory/dataset.py``).

    python bench/realmem.py [--src ../shared/data/realmem] [--out /tmp/realmem]

RealMemBench (github.com/zhiyuan5986/RealMemBench, MIT) holds, per person, ~200 dated
user–assistant sessions over months. Some user turns are queries (``is_query``) asked at
that point of the timeline; the assistant turn right after a query names the sessions
it drew on (``memory_session_uuids``) and the facts it used (``memory_used``). Each
fact is one of the sessions' ``extracted_memory`` entries, which quote the turn they
came from (``source_content_snapshot``). So one person becomes one chat file with:

* ``sessions``: every session in timeline order, ``started_at`` its date plus half an
  hour per earlier session that day (the data has days, not times), every turn a
  message (``User`` keeps the person's name as speaker, ``Assistant`` is the bot);
* ``questions``: every query, ``asked_in`` its own session (only earlier sessions are
  searchable when it is asked), ``evidence_sessions`` the sessions the answer used and
  ``evidence`` the turns quoted by the facts it used (located by their text: exact,
  else the turn of that session sharing the most words), ``category`` the data's.

The data is not part of the project: read it from its copy and write the converted
files outside the repository. Queries are conversational openers ("I'm ready to plan
the Beijing trip"), not questions about the past: recall here measures what an
assistant finds without being asked.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "shared" / "data" / "realmem"
_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2}


def _listing(value: Any) -> list[Any]:
    """A field that is a list, or the Python repr of one (as the data stores it)."""
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
        return parsed if isinstance(parsed, list) else []
    return []


def _is_query(turn: dict[str, Any]) -> bool:
    return turn.get("is_query") in (True, "True", "true")


def _turn_of(snapshot: str, turns: list[dict[str, Any]]) -> int | None:
    """The index of the turn a fact quotes: the exact text, else the most shared words."""
    text = snapshot.strip()
    for i, t in enumerate(turns):
        if t.get("content", "").strip() == text:
            return i
    want = _words(text)
    if not want:
        return None
    best, at = 0.0, None
    for i, t in enumerate(turns):
        have = _words(t.get("content", ""))
        score = len(want & have) / len(want | have) if have else 0.0
        if score > best:
            best, at = score, i
    return at if best >= 0.5 else None


def convert(data: dict[str, Any], name: str) -> tuple[dict[str, Any], Counter[str]]:
    person = str(data.get("_metadata", {}).get("person_name") or name).replace("_", " ")
    dialogues = data["dialogues"]
    stats: Counter[str] = Counter()
    sessions = []
    per_day: Counter[str] = Counter()
    by_uuid: dict[str, dict[str, Any]] = {}
    for d in dialogues:
        uuid = str(d["session_uuid"])
        by_uuid[uuid] = d
        day = str(d.get("current_time", ""))[:10]
        started = datetime.fromisoformat(day) + timedelta(hours=9, minutes=30 * per_day[day])
        per_day[day] += 1
        sessions.append(
            {
                "id": uuid,
                "started_at": started.isoformat(),
                "messages": [
                    {
                        "id": f"{uuid}-t{i}",
                        "speaker": "assistant" if t.get("speaker") == "Assistant" else person,
                        "content": str(t.get("content", "")),
                    }
                    for i, t in enumerate(d["dialogue_turns"])
                ],
            }
        )
    questions = []
    for d in dialogues:
        turns = d["dialogue_turns"]
        for i, t in enumerate(turns):
            if not _is_query(t):
                continue
            answer = turns[i + 1] if i + 1 < len(turns) else {}
            in_sessions = [str(u) for u in _listing(answer.get("memory_session_uuids")) if str(u) in by_uuid]
            in_sessions = [u for u in dict.fromkeys(in_sessions) if u != d["session_uuid"]]
            evidence: list[str] = []
            for used in _listing(answer.get("memory_used")):
                if not isinstance(used, dict):
                    continue
                source = by_uuid.get(str(used.get("session_uuid")))
                if source is None or str(source["session_uuid"]) not in in_sessions:
                    continue
                fact = next(
                    (
                        e
                        for e in source.get("extracted_memory", [])
                        if e.get("content") == used.get("content")
                    ),
                    None,
                )
                at = (
                    _turn_of(str(fact.get("source_content_snapshot") or ""), source["dialogue_turns"])
                    if fact
                    else None
                )
                if at is None:
                    stats["facts without a turn"] += 1
                    continue
                evidence.append(f"{source['session_uuid']}-t{at}")
            if not in_sessions:
                stats["queries without earlier evidence"] += 1
                continue
            stats["queries"] += 1
            stats["with turn evidence"] += bool(evidence)
            questions.append(
                {
                    "id": str(t.get("query_id") or f"q{len(questions)}"),
                    "question": str(t.get("content", "")),
                    "evidence": list(dict.fromkeys(evidence)),
                    "evidence_sessions": in_sessions,
                    "asked_in": str(d["session_uuid"]),
                    "category": str(t.get("category_name") or "-"),
                }
            )
    return {"sessions": sessions, "questions": questions}, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=SRC, help="the folder of *_dialogues_256k.json files")
    ap.add_argument("--out", type=Path, default=Path("/tmp/realmem"), help="where to write the chat files")
    args = ap.parse_args()
    files = sorted(args.src.glob("*_dialogues_*.json"))
    if not files:
        raise SystemExit(f"no *_dialogues_*.json files in {args.src}")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in files:
        name = path.name.split("_dialogues_")[0].lower()
        chat, stats = convert(json.loads(path.read_text(encoding="utf-8")), name)
        (args.out / f"realmem_{name}.json").write_text(json.dumps(chat, ensure_ascii=False), encoding="utf-8")
        turns = sum(len(s["messages"]) for s in chat["sessions"])
        print(
            f"{args.out / f'realmem_{name}.json'}: {len(chat['sessions'])} sessions, {turns} messages, "
            + ", ".join(f"{v} {k}" for k, v in stats.items())
        )


if __name__ == "__main__":
    main()
