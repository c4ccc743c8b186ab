"""Writing a :class:`~mnemo.importers.common.Bundle` into a mnemo profile.

Every layer goes through the path a conversation's writes take, so an import is held
to the same rules: memory entries through ``CuratedFile.add`` (limits, the ``§`` rule,
the threat scan; a duplicate is "already present"), the persona through the threat
scan, skills through ``SkillStore.create`` (validation and the skills guard), sessions
through ``SessionStore`` with ids derived from the source's (``stable_id``) and each
message tagged with its source id, so a second import adds only what is new.

Sessions and curated memory go through the configured backend's repositories (SQLite's
``state.db`` and files, or PostgreSQL's rows: ``StorageBackend.sessions`` and
``.files``), so an import into a PostgreSQL profile is as idempotent and resumable as
one into SQLite: each session is one transaction, and a run stopped half-way adds the
rest on the next.

A dry run does the same work against scratch copies of the curated memory and the
skills folder and only reads the store (which it does not even open when it holds
nothing yet), so what it reports is what the import would do — the same refusals
included — and nothing of the profile changes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemo.gateway.config import Settings
from mnemo.importers.chats import ChatMap
from mnemo.importers.common import Bundle, ForeignSession, ForeignSkill, stable_id
from mnemo.memory.atomic import ensure_folder, replace_file
from mnemo.memory.curated import CuratedFile, MemoryFiles, join_entries
from mnemo.memory.journal import Actor, Provenance, Trust
from mnemo.memory.ports import CuratedDocument, CuratedRepository, SessionRepository
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage
from mnemo.memory.skills import SkillRefused, SkillStore
from mnemo.memory.skills.format import PLATFORMS, SKILL_FILE, check_category, check_file_path, parse_skill
from mnemo.memory.threats import scan

PREVIEW = 80


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


@dataclass
class Layer:
    """One layer's outcome: what was (or would be) written, what was already there,
    and every refusal with its reason."""

    added: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "added": len(self.added),
            "present": len(self.present),
            "refused": [{"item": i, "reason": r} for i, r in self.refused],
            "notes": self.notes,
        }


@dataclass
class ChatReceipt:
    chat_key: str
    how: str
    sources: set[str] = field(default_factory=set)
    sessions: int = 0
    messages: int = 0
    present_sessions: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "from": sorted(self.sources),
            "sessions": self.sessions,
            "messages": self.messages,
            "already_imported_sessions": self.present_sessions,
        }


@dataclass
class Receipt:
    kind: str
    origin: str
    dry_run: bool
    memory: Layer = field(default_factory=Layer)
    user: Layer = field(default_factory=Layer)
    user_ref: str | None = None
    soul: str = "none in the source"
    skills: Layer = field(default_factory=Layer)
    chats: dict[str, ChatReceipt] = field(default_factory=dict)
    sessions_new: int = 0
    sessions_present: int = 0
    messages_new: int = 0
    skipped_messages: Counter[str] = field(default_factory=Counter)
    skipped_sessions: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def refused(self) -> int:
        return (
            len(self.memory.refused)
            + len(self.user.refused)
            + len(self.skills.refused)
            + (1 if self.soul.startswith("refused") else 0)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.kind,
            "path": self.origin,
            "dry_run": self.dry_run,
            "memory": self.memory.to_json(),
            "user": {**self.user.to_json(), "user": self.user_ref},
            "soul": self.soul,
            "skills": {
                **self.skills.to_json(),
                "installed_names": self.skills.added,
                "present_names": self.skills.present,
            },
            "sessions": {
                "imported": self.sessions_new,
                "already_imported": self.sessions_present,
                "messages": self.messages_new,
                "chats": {k: c.to_json() for k, c in sorted(self.chats.items())},
                "skipped_messages": dict(self.skipped_messages),
                "skipped_sessions": dict(self.skipped_sessions),
            },
            "notes": self.notes,
        }


# --- curated memory ---------------------------------------------------------------------
def _curated(file: CuratedDocument, entries: tuple[str, ...], layer: Layer, by: Provenance | None) -> None:
    for entry in entries:
        result = file.add(entry, by)
        if result.success and result.changed:
            layer.added.append(entry)
        elif result.success:
            layer.present.append(entry)
        else:
            reason = f"threat scan: {result.threat}" if result.threat is not None else result.message
            layer.refused.append((_preview(entry), reason))


def _memory(
    bundle: Bundle,
    files: CuratedRepository,
    user: UserRef | None,
    receipt: Receipt,
    by: Provenance | None = None,
) -> None:
    """``by``: the provenance the writes are journaled with (None in a dry run's scratch)."""
    _curated(files.shared(), bundle.memory, receipt.memory, by)
    receipt.user_ref = None if user is None else str(user)
    if bundle.user is None:
        receipt.user.notes.append("the source has no USER.md")
    elif user is None:
        receipt.user.notes.append(
            f"USER.md ({len(bundle.user)} entries) not imported: name whose profile it is with --user PLATFORM:ID"
        )
    else:
        _curated(files.user(user), bundle.user, receipt.user, by)


def _soul(bundle: Bundle, path: Path, dry_run: bool) -> str:
    if bundle.soul is None or not bundle.soul.strip():
        return "none in the source"
    threat = scan(bundle.soul)
    if threat is not None:
        return f"refused: threat scan: {threat}"
    if path.is_file():
        current = path.read_text(encoding="utf-8-sig")
        if current.strip() == bundle.soul.strip():
            return "already present"
        return (
            f"kept the existing {path.name} (it differs from the imported one; compare with {bundle.origin})"
        )
    if not dry_run:
        replace_file(path, bundle.soul.encode("utf-8"))
    return "imported" if not dry_run else "would be imported"


# --- skills -----------------------------------------------------------------------------
def _adapt_front_matter(content: str) -> tuple[str, str | None]:
    """Hermes and OpenClaw skills list operating systems under ``platforms``
    (``[linux, macos]``); mnemo's are chat platforms. Drop the ones mnemo does not
    know (and say so) rather than refuse the skill."""
    import yaml

    lines = content.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return content, None
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        return content, None
    try:
        data = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError:
        return content, None
    platforms = data.get("platforms") if isinstance(data, dict) else None
    if isinstance(platforms, str):
        platforms = [platforms]
    if not isinstance(platforms, list) or all(p in PLATFORMS for p in platforms):
        return content, None
    kept = [p for p in platforms if p in PLATFORMS]
    dropped = [str(p) for p in platforms if p not in PLATFORMS]
    if kept:
        data["platforms"] = kept
    else:
        data.pop("platforms")
    front = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return (
        f"---\n{front}---\n{''.join(lines[end + 1 :])}",
        f"platforms {', '.join(dropped)} dropped (not chat platforms)",
    )


def _skill_files(folder: Path, skipped: list[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel.split("/")[0].startswith("."):
            continue  # .git, .DS_Store: not part of the skill
        if p.is_symlink():
            skipped.append(f"{rel} (a link)")
            continue
        if p.is_dir() or rel == SKILL_FILE:
            continue
        try:
            check_file_path(rel)
        except SkillRefused:
            skipped.append(f"{rel} (outside references/, templates/, scripts/, assets/)")
            continue
        try:
            files[rel] = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            skipped.append(f"{rel} (not text)")
    return files


def _skills(skills: tuple[ForeignSkill, ...], store: SkillStore, layer: Layer) -> None:
    for fs in skills:
        label = fs.path.name
        try:
            content, note = _adapt_front_matter((fs.path / SKILL_FILE).read_text(encoding="utf-8"))
            meta = parse_skill(content)
            label = meta.name
            existing = store.find(meta.name, None)
            if existing is not None:
                if store.read(existing) == content:
                    layer.present.append(meta.name)
                else:
                    layer.refused.append(
                        (meta.name, "a different shared skill with this name exists; kept it")
                    )
                continue
            skipped: list[str] = []
            files = _skill_files(fs.path, skipped)
            category = fs.category
            if category is not None:
                try:
                    check_category(category)
                except SkillRefused:
                    category = None
            store.create(content, None, category, files)
        except SkillRefused as e:
            layer.refused.append((label, e.reason))
            continue
        except UnicodeDecodeError:
            layer.refused.append((label, f"{SKILL_FILE} is not UTF-8 text"))
            continue
        layer.added.append(meta.name)
        for what in ([note] if note else []) + [f"file {s} left out" for s in skipped]:
            layer.notes.append(f"{meta.name}: {what}")


# --- sessions ---------------------------------------------------------------------------
def _new_messages(kind: str, fs: ForeignSession, have: set[str]) -> list[NewMessage]:
    return [
        NewMessage(
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            tool_name=m.tool_name,
            is_error=m.is_error,
            author_id=m.author_id,
            created_at=m.created_at,
            meta={"import": {"from": kind, "session": fs.key, "message": m.key}},
        )
        for m in fs.messages
        if m.key not in have
    ]


def _keys(metas: Iterator[Any]) -> set[str]:
    out = set()
    for meta in metas:
        data = json.loads(meta) if isinstance(meta, str) else meta
        ref = data.get("import") if isinstance(data, dict) else None
        if isinstance(ref, dict) and "message" in ref:
            out.add(str(ref["message"]))
    return out


def _count(receipt: Receipt, fs: ForeignSession, chat_key: str, how: str, new: int, existed: bool) -> None:
    chat = receipt.chats.setdefault(chat_key, ChatReceipt(chat_key, how))
    chat.sources.add(fs.source_chat)
    receipt.skipped_messages.update(fs.skipped)
    if existed and not new:
        chat.present_sessions += 1
        receipt.sessions_present += 1
        return
    chat.sessions += 1
    chat.messages += new
    receipt.messages_new += new
    if existed:
        receipt.sessions_present += 1
    else:
        receipt.sessions_new += 1


async def _write_sessions(bundle: Bundle, chats: ChatMap, store: SessionRepository, receipt: Receipt) -> None:
    sessions = bundle.sessions()
    while (fs := await asyncio.to_thread(next, sessions, None)) is not None:
        if not fs.messages:
            receipt.skipped_sessions["with nothing to import"] += 1
            receipt.skipped_messages.update(fs.skipped)
            continue
        target, how = chats.resolve(fs)
        sid = stable_id(bundle.kind, fs.key)
        existing = await store.get_session(sid)
        have: set[str] = set()
        if existing is None:
            await store.create_session(
                chat_key=target.chat_key,
                platform=target.platform,
                chat_id=target.chat_id,
                thread_id=target.thread_id,
                user_id=target.user_id,
                agent_context="primary",
                source="import",
                model=fs.model or bundle.kind,
                system_prompt="",
                title=fs.title,
                started_at=fs.started_at,
                session_id=sid,
            )
        else:
            have = _keys(iter([m.meta for m in await store.load_messages(sid)]))
        new = _new_messages(bundle.kind, fs, have)
        await store.append_messages(sid, new)
        await store.end_session(sid, "imported")
        _count(
            receipt,
            fs,
            existing.chat_key if existing else target.chat_key,
            how,
            len(new),
            existing is not None,
        )


async def _plan_sessions(
    bundle: Bundle, chats: ChatMap, store: SessionRepository | None, receipt: Receipt
) -> None:
    """The dry run's view of the sessions: the store only read (None: it holds nothing)."""
    sessions = bundle.sessions()
    while (fs := await asyncio.to_thread(next, sessions, None)) is not None:
        if not fs.messages:
            receipt.skipped_sessions["with nothing to import"] += 1
            receipt.skipped_messages.update(fs.skipped)
            continue
        target, how = chats.resolve(fs)
        sid = stable_id(bundle.kind, fs.key)
        existing = await store.get_session(sid) if store is not None else None
        have: set[str] = set()
        if existing is not None and store is not None:
            have = _keys(iter([m.meta for m in await store.load_messages(sid)]))
        new = sum(1 for m in fs.messages if m.key not in have)
        _count(
            receipt, fs, existing.chat_key if existing else target.chat_key, how, new, existing is not None
        )


# --- the whole import -------------------------------------------------------------------
def run(
    bundle: Bundle, settings: Settings, chats: ChatMap, user: UserRef | None, *, dry_run: bool
) -> Receipt:
    receipt = Receipt(
        bundle.kind,
        str(bundle.origin),
        dry_run,
        notes=list(bundle.notes),
        skipped_sessions=Counter(bundle.skipped_sessions),
    )
    asyncio.run((_plan if dry_run else _apply)(bundle, settings, chats, user, receipt))
    unused = chats.unused(c for chat in receipt.chats.values() for c in chat.sources)
    if unused:
        receipt.notes.append(f"--chat-map sources that matched no conversation: {', '.join(unused)}")
    return receipt


async def _apply(
    bundle: Bundle, settings: Settings, chats: ChatMap, user: UserRef | None, receipt: Receipt
) -> None:
    from mnemo.gateway.storage import open_backend

    backend = await open_backend(settings)
    # Journaled as the importer's, trust "imported" (memory/journal.py), on either backend.
    by = Provenance(Actor.importer(bundle.kind), Trust.IMPORTED)
    try:
        await asyncio.to_thread(_memory, bundle, backend.files, user, receipt, by)
        skills = SkillStore(
            settings.skills_dir, settings.skills.max_visible, journal=backend.documents, by=by
        )
        await asyncio.to_thread(_skills, bundle.skills, skills, receipt.skills)
        receipt.soul = await asyncio.to_thread(_soul, bundle, settings.soul_path, False)
        await _write_sessions(bundle, chats, backend.sessions, receipt)
    finally:
        await backend.close()


async def _plan(
    bundle: Bundle, settings: Settings, chats: ChatMap, user: UserRef | None, receipt: Receipt
) -> None:
    from mnemo.gateway.storage import StorageBackend, backend_for, open_backend

    limits = (settings.memory.memory_char_limit, settings.memory.user_char_limit)
    holds_data = await asyncio.to_thread(lambda: backend_for(settings).archive().contents().holds_data)
    backend: StorageBackend | None = await open_backend(settings) if holds_data else None
    try:
        with tempfile.TemporaryDirectory(prefix="mnemo-import-") as scratch:
            # Scratch copies of what the import would add to: the same limits, the same
            # "already present", and the profile untouched.
            memories = MemoryFiles(Path(scratch) / "memories", *limits)
            if backend is not None:
                await asyncio.to_thread(_copy_curated, backend.files, memories, user)
            _memory(bundle, memories, user, receipt)
            skills = Path(scratch) / "skills"
            if settings.skills_dir.is_dir():
                shutil.copytree(
                    settings.skills_dir,
                    skills,
                    symlinks=True,
                    ignore=shutil.ignore_patterns(".lock", ".history"),
                )
            _skills(bundle.skills, SkillStore(skills, settings.skills.max_visible), receipt.skills)
        receipt.soul = _soul(bundle, settings.soul_path, dry_run=True)
        await _plan_sessions(bundle, chats, backend.sessions if backend is not None else None, receipt)
    finally:
        if backend is not None:
            await backend.close()


def _copy_curated(live: CuratedRepository, scratch: MemoryFiles, user: UserRef | None) -> None:
    """The profile's MEMORY.md (and ``user``'s USER.md), wherever the backend keeps them,
    as files in the dry run's scratch folder."""
    pairs: list[tuple[CuratedDocument, CuratedFile]] = [(live.shared(), scratch.shared())]
    if user is not None:
        pairs.append((live.user(user), scratch.own(user)))
    for source, copy in pairs:
        entries = source.load().entries
        if entries:
            ensure_folder(copy.path.parent)
            replace_file(copy.path, join_entries(entries).encode("utf-8"))
