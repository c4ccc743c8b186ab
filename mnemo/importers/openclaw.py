"""Reading an OpenClaw state folder (``~/.openclaw``) or just its agent workspace.

What moves over:

* the workspace's ``MEMORY.md`` — free-form Markdown, split into curated entries (each
  list item or paragraph, with its section heading; a ``§``-separated file as it is);
* ``USER.md`` (to the chat user named with ``--user``) and ``SOUL.md``;
* ``memory/*.md`` — the daily notes: each file becomes one searchable session of notes
  (chat ``notes``), one message per paragraph or list item, dated by its file name;
* skills: ``<workspace>/skills`` and ``<state>/skills``, ``<name>/SKILL.md`` folders;
* session transcripts ``agents/<agentId>/sessions/<sessionId>.jsonl`` — one JSON event
  a line: a ``session`` header, then ``message`` events whose ``message`` has a
  ``role`` (``user``, ``assistant``, ``toolResult``), ``content`` (a string or blocks:
  ``text``, ``toolCall`` with ``id``/``name``/``arguments``, ``thinking``, ``image``)
  and a millisecond ``timestamp``; ``sessions.json`` beside them maps session keys
  (``agent:<agentId>:telegram:dm:<peer>``) to session ids, which tells the chat.

Left behind: ``openclaw.json`` (settings and secrets), ``AGENTS.md``, ``TOOLS.md``,
``IDENTITY.md``, ``HEARTBEAT.md`` (instructions for OpenClaw's own runtime), thinking
blocks, images, model-change and compaction events, and transcripts OpenClaw renamed
away after a reset (``*.jsonl.reset.*``, ``*.deleted.*``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemo.importers.common import (
    Bundle,
    ChatHint,
    ForeignMessage,
    ForeignSession,
    ForeignSkill,
    SourceProblem,
    markdown_entries,
    read_text,
    skill_folders,
)
from mnemo.memory.sessions import Role, ToolCall

NOTES_CHAT = "notes"
UNKEYED_CHAT = "unkeyed"
_WORKSPACE_MARKERS = ("MEMORY.md", "memory.md", "AGENTS.md", "SOUL.md", "USER.md", "memory")
_DAY = re.compile(r"(\d{4}-\d{2}-\d{2})")


def _workspace_of(path: Path) -> tuple[Path | None, Path | None]:
    """(state folder, workspace folder) for what the user named."""
    try:
        names = {p.name for p in path.iterdir()}
    except OSError as e:
        raise SourceProblem(f"{path}: cannot read the folder ({e.strerror or e})", usage=True) from None
    if "agents" in names or "openclaw.json" in names:
        workspace = path / "workspace"
        return path, workspace if workspace.is_dir() else None
    if names & set(_WORKSPACE_MARKERS):
        return None, path
    hint = ""
    if "state.db" in names or "memories" in names:
        hint = " (it looks like a Hermes profile: use --from hermes)"
    elif ".openclaw" in names:
        hint = f" (did you mean {path / '.openclaw'}?)"
    raise SourceProblem(
        f"{path}: not an OpenClaw folder: no agents/ or openclaw.json, and no workspace files"
        f" (MEMORY.md, memory/){hint}",
        usage=True,
    )


def read(path: Path, scratch: Path) -> Bundle:
    if not path.exists():
        raise SourceProblem(f"{path}: no such file or folder", usage=True)
    if not path.is_dir():
        raise SourceProblem(
            f"{path}: expected an OpenClaw state folder (~/.openclaw) or its workspace", usage=True
        )
    state, workspace = _workspace_of(path)
    bundle = Bundle(kind="openclaw", origin=path)
    notes: list[Path] = []
    skills: list[ForeignSkill] = []
    if workspace is not None:
        memory = read_text(workspace / "MEMORY.md", "MEMORY.md") or read_text(
            workspace / "memory.md", "memory.md"
        )
        user = read_text(workspace / "USER.md", "USER.md")
        bundle.memory = markdown_entries(memory) if memory else ()
        bundle.user = markdown_entries(user) if user is not None else None
        bundle.soul = read_text(workspace / "SOUL.md", "SOUL.md")
        skills.extend(skill_folders(workspace / "skills"))
        daily = workspace / "memory"
        if daily.is_dir():
            notes = sorted(p for p in daily.glob("*.md") if p.is_file() and not p.is_symlink())
            others = sorted(p.name for p in daily.iterdir() if p.is_file() and p.suffix != ".md")
            if others:
                bundle.notes.append(f"memory/: not Markdown, not imported: {', '.join(others)}")
    else:
        bundle.notes.append("no workspace folder: no memory files to import")
    transcripts: list[tuple[str, Path, dict[str, str]]] = []
    if state is not None:
        skills.extend(skill_folders(state / "skills"))
        for agent in sorted(p for p in (state / "agents").glob("*") if p.is_dir() and not p.is_symlink()):
            sessions = agent / "sessions"
            index = _index(sessions / "sessions.json", agent.name, bundle.notes)
            for f in sorted(sessions.glob("*.jsonl")):
                if f.is_file() and not f.is_symlink():
                    transcripts.append((agent.name, f, index))
    bundle.skills = tuple(skills)
    bundle.sessions = lambda: _all_sessions(notes, transcripts)
    return bundle


def _index(path: Path, agent: str, notes: list[str]) -> dict[str, str]:
    """session id (and transcript file name) -> the session key's part after
    ``agent:<agentId>:``."""
    text = read_text(path, "sessions.json")
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        notes.append(f"{path}: not valid JSON ({e}); its transcripts are imported into chat {UNKEYED_CHAT!r}")
        return {}
    out: dict[str, str] = {}
    prefix = f"agent:{agent}:"
    for key, entry in data.items() if isinstance(data, dict) else ():
        if not isinstance(entry, dict) or not isinstance(key, str):
            continue
        chat = key[len(prefix) :] if key.startswith(prefix) else key
        for ref in (entry.get("sessionId"), Path(str(entry.get("sessionFile") or "")).name or None):
            if isinstance(ref, str) and ref:
                out.setdefault(ref, chat)
    return out


def _all_sessions(
    notes: list[Path], transcripts: list[tuple[str, Path, dict[str, str]]]
) -> Iterator[ForeignSession]:
    for note in notes:
        yield _note_session(note)
    for agent, path, index in transcripts:
        yield _transcript(agent, path, index)


# --- daily notes -----------------------------------------------------------------------
def _note_session(path: Path) -> ForeignSession:
    text = read_text(path, path.name) or ""
    m = _DAY.search(path.stem)
    try:
        day = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC) if m else None
    except ValueError:
        day = None
    if day is None:
        day = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    # Keyed by content: a note file that grew since the last import adds its new blocks.
    messages = tuple(
        ForeignMessage(hashlib.sha256(block.encode()).hexdigest()[:20], "assistant", block, day)
        for block in dict.fromkeys(e for e in markdown_entries(text) if e.strip())
    )
    return ForeignSession(
        f"note:{path.name}", NOTES_CHAT, ChatHint(), day, f"daily note {path.stem}", None, messages
    )


# --- transcripts -----------------------------------------------------------------------
def _chat_hint(chat: str) -> ChatHint:
    parts = chat.split(":")
    if len(parts) >= 3 and parts[-2] == "dm":
        # <channel>:dm:<peer> or <channel>:<account>:dm:<peer>. The peer is the sender;
        # only on Telegram is a direct chat's id the sender's id.
        return ChatHint(parts[0], "dm" if parts[0] == "telegram" else None, parts[-1], None, parts[-1])
    if len(parts) >= 3 and parts[1] in ("group", "channel"):
        thread = parts[4] if len(parts) >= 5 and parts[3] in ("topic", "thread") else None
        return ChatHint(parts[0], "group", parts[2], thread)
    return ChatHint()


def _when(entry: dict[str, Any], message: dict[str, Any], fallback: datetime) -> datetime:
    ts = message.get("timestamp")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        try:
            return datetime.fromtimestamp(ts / 1000, UTC)
        except (OverflowError, OSError, ValueError):
            pass
    raw = entry.get("timestamp")
    if isinstance(raw, str):
        try:
            dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
        except ValueError:
            pass
    return fallback


def _blocks(content: Any, skipped: Counter[str]) -> tuple[str, tuple[ToolCall, ...]]:
    if isinstance(content, str):
        return content, ()
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("toolCall", "tool_use"):
            args = block.get("arguments", block.get("input", {}))
            calls.append(
                ToolCall(
                    str(block.get("id") or f"call_{len(calls)}"),
                    str(block.get("name") or "tool"),
                    args if isinstance(args, dict) else {"arguments": args},
                )
            )
        elif kind == "image":
            texts.append("[image]")
            skipped["images (kept as [image])"] += 1
        elif kind == "thinking":
            skipped["thinking blocks"] += 1
    return "\n".join(texts), tuple(calls)


_ROLE: dict[str, Role] = {"user": "user", "assistant": "assistant", "toolResult": "tool"}


def _transcript(agent: str, path: Path, index: dict[str, str]) -> ForeignSession:
    skipped: Counter[str] = Counter()
    header: dict[str, Any] = {}
    messages: list[ForeignMessage] = []
    started = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    model: str | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SourceProblem(f"{path}: cannot read the transcript ({e})", usage=False) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            skipped["unreadable lines"] += 1
            continue
        if not isinstance(entry, dict):
            skipped["unreadable lines"] += 1
            continue
        kind = entry.get("type")
        if kind == "session":
            header = entry
            started = _when(entry, {}, started)
            continue
        if kind == "model_change" and isinstance(entry.get("modelId"), str):
            model = entry["modelId"]
        if kind != "message" or not isinstance(entry.get("message"), dict):
            if kind == "compaction":
                skipped["compaction summaries"] += 1
            continue
        msg = entry["message"]
        role = _ROLE.get(str(msg.get("role")))
        if role is None:
            skipped[f"role {msg.get('role')!r}"] += 1
            continue
        text, calls = _blocks(msg.get("content"), skipped)
        if role != "assistant":
            calls = ()
        if not text.strip() and not calls:
            skipped["empty"] += 1
            continue
        if role == "assistant" and isinstance(msg.get("model"), str):
            model = msg["model"]
        messages.append(
            ForeignMessage(
                key=str(entry.get("id") or f"line-{n}"),
                role=role,
                content=text,
                created_at=_when(entry, msg, started),
                tool_calls=calls,
                tool_call_id=str(msg["toolCallId"]) if role == "tool" and msg.get("toolCallId") else None,
                tool_name=str(msg["toolName"]) if role == "tool" and msg.get("toolName") else None,
                is_error=bool(msg.get("isError")) if role == "tool" else False,
            )
        )
    session_id = str(header.get("id") or path.stem)
    chat = index.get(session_id) or index.get(path.name) or UNKEYED_CHAT
    return ForeignSession(
        key=f"{agent}:{session_id}",
        source_chat=chat,
        hint=_chat_hint(chat),
        started_at=started,
        title=None,
        model=model,
        messages=tuple(messages),
        skipped=skipped,
    )
