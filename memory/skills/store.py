"""Skill folders on disk: shared ones and each user's own, with history.

Layout under ``$MNEMO_HOME/skills/``::

    <name>/SKILL.md                       shared (the CLI, admins)
    <category>/<name>/SKILL.md            shared, grouped by category
    users/<platform>/<id>/<name>/SKILL.md one user's own, visible only in their sessions
    .history/shared/<name>/<N>/…          previous versions of a shared skill
    .history/users/<platform>:<id>/<name>/<N>/…

Every write holds one flock (``skills/.lock``), is validated and guarded before anything
touches the disk, copies the current version into history, then replaces files with
:func:`mnemo.memory.atomic.replace_file` (temp + fsync + rename) — a new skill is built
in a temp folder and renamed into place — so a writer killed at any point leaves the old
or the new version. Nothing here executes skill content.

A **rollback** replaces a whole folder, which no single rename can do while the old one
is in place, so it leaves a trail a later reader can finish (roll forward)::

    .<name>.XXXX/      the restored copy being built (garbage if killed now)
    .<name>~rollback/  the restored copy, complete: from here on the rollback will happen
    .<name>~replaced/  the version being replaced, moved aside
    <name>/            the restored version; then ~replaced is removed

Whoever next scans the folder (any read or write, in any process) sees a ``~rollback``
or ``~replaced`` entry, takes the lock — so a rollback still running finishes first — and
completes what is left: moves ``~rollback`` into place and removes ``~replaced``. At every
moment the skill is the old version, the new one, or (for a reader racing a live
rollback, for one rename) briefly absent; after a crash it is never lost.

With a journal (``memory/journal.py``), every write is journaled under the same lock:
staged with the SHA-256 its file will have (``SKILL.md``, the file written or removed),
written, committed — so a writer killed in between leaves an entry the next writer or
the next process opening the backend keeps or drops by that hash. Entries name the
skill in ``note`` and hold the new ``SKILL.md`` (or file) text in ``new``; a skill's
older versions stay in its history folder (``rollback``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TypeVar

from mnemo.memory.atomic import ensure_folder, exclusive_lock, replace_file
from mnemo.memory.journal import (
    ABSENT,
    SHARED,
    DocumentJournal,
    FileEvidence,
    Layer,
    NewEntry,
    Provenance,
    commit_written,
    digest,
    settle_held,
)
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import guard
from mnemo.memory.skills.format import (
    MAX_FILE_CHARS,
    SKILL_FILE,
    SUBFOLDERS,
    SkillExists,
    SkillMeta,
    SkillRefused,
    check_category,
    check_file_path,
    check_name,
    parse_skill,
)

_RESERVED = ("users", ".history")
# Who created a user's skill in a conversation (the hidden marker file); no marker: an
# admin or the CLI did, and a background pass never changes it.
ORIGIN_FILE = ".origin"
CONVERSATION_AUTHORS = ("user", "review")
# A rollback's trail (module docstring). "~" is in no skill name and in no mkdtemp
# suffix, so a temp folder is never taken for a trail.
_STAGED = "~rollback"
_REPLACED = "~replaced"
T = TypeVar("T")


def _trail(entry: str) -> str | None:
    """The skill name of a rollback trail entry (``.<name>~rollback``), else None."""
    for suffix in (_STAGED, _REPLACED):
        if entry.startswith(".") and entry.endswith(suffix):
            return entry[1 : -len(suffix)] or None
    return None


@dataclass(frozen=True, slots=True)
class Skill:
    meta: SkillMeta
    path: Path
    owner: UserRef | None  # None: shared

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def scope(self) -> str:
        return "shared" if self.owner is None else "user"


def _guarded(text: str, what: str) -> None:
    refusal = guard.check(text)
    if refusal is not None:
        raise SkillRefused(f"Blocked ({refusal.rule}): {what} {refusal.detail}. Nothing was saved.")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (a copy about to be renamed into place)."""
    for dirpath, _dirs, names in os.walk(folder):
        for n in names:
            path = os.path.join(dirpath, n)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _no_symlinks(folder: Path, root: Path) -> None:
    for p in (folder, *folder.parents):
        if p == root or not p.is_relative_to(root):
            break
        if p.is_symlink():
            raise SkillRefused(f"invalid_path: {p.name} is a symbolic link; refusing to use it")


class SkillStore:
    def __init__(
        self,
        root: Path,
        max_visible: int = 200,
        *,
        journal: DocumentJournal | None = None,
        by: Provenance | None = None,
    ) -> None:
        self.root = root
        self.max_visible = max_visible
        self.journal = journal  # every write is journaled here (None: not journaled)
        self.by = by  # the provenance of writes that name none (``mnemo import``)
        # The flock is per open file: a thread that holds it and scans (which may
        # finish a crashed rollback under the lock) must not take it a second time.
        self._held = threading.local()

    # --- reading ------------------------------------------------------------------
    def _user_root(self, user: UserRef) -> Path:
        return self.root / "users" / user.platform / user.user_id

    def _history_root(self, name: str, owner: UserRef | None) -> Path:
        base = self.root / ".history"
        # One folder per user ("telegram:1"), not two: `mnemo export` caps archive depth.
        return base / "shared" / name if owner is None else base / "users" / str(owner) / name

    def _scan(self, base: Path, owner: UserRef | None, grouped: bool) -> list[Skill]:
        found: list[Skill] = []
        if not base.is_dir():
            return found
        entries = sorted(base.iterdir())
        if any(_trail(e.name) for e in entries):
            self._finish_rollbacks(base)
            entries = sorted(base.iterdir())
        for entry in entries:
            if entry.name.startswith(".") or entry.is_symlink() or not entry.is_dir():
                continue
            if owner is None and entry.name in _RESERVED:
                continue
            folders = [entry]
            if grouped and not (entry / SKILL_FILE).exists():
                inside = sorted(entry.iterdir())
                if any(_trail(p.name) for p in inside):
                    self._finish_rollbacks(entry)
                    inside = sorted(entry.iterdir())
                folders = [
                    p for p in inside if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                ]
            group = entry.name if folders != [entry] else None
            for folder in folders:
                skill = self._load(folder, owner, group)
                if skill is not None:
                    found.append(skill)
        return found

    def _load(self, folder: Path, owner: UserRef | None, group: str | None = None) -> Skill | None:
        md = folder / SKILL_FILE
        if md.is_symlink() or not md.is_file():
            return None
        try:
            meta = parse_skill(md.read_text(encoding="utf-8"), folder.name)
        except (SkillRefused, OSError, UnicodeDecodeError):
            return None  # a broken hand-edited skill is hidden, not fatal
        if meta.category is None and group is not None:
            meta = replace(meta, category=group)  # the category folder it is grouped in
        return Skill(meta, folder, owner)

    def shared(self) -> list[Skill]:
        return self._scan(self.root, None, grouped=True)

    def own(self, user: UserRef) -> list[Skill]:
        return self._scan(self._user_root(user), user, grouped=False)

    def visible(self, user: UserRef | None, platform: str | None = None) -> list[Skill]:
        """The user's own skills, then the shared ones they do not shadow; at most
        ``max_visible``. ``platform`` drops skills whose ``platforms`` exclude it."""
        mine = self.own(user) if user is not None else []
        names = {s.name for s in mine}
        skills = mine + [s for s in self.shared() if s.name not in names]
        if platform is not None:
            skills = [s for s in skills if s.meta.offered_on(platform)]
        return skills[: self.max_visible]

    def find(self, name: str, user: UserRef | None) -> Skill | None:
        """The skill ``name`` as ``user`` sees it (their own first), or ``None``."""
        check_name(name)
        return next((s for s in self.visible(user) if s.name == name), None)

    def _find_owned(self, name: str, owner: UserRef | None) -> Skill | None:
        check_name(name)
        skills = self.shared() if owner is None else self.own(owner)
        return next((s for s in skills if s.name == name), None)

    def read(self, skill: Skill, file_path: str | None = None) -> str:
        if file_path is None:
            return (skill.path / SKILL_FILE).read_text(encoding="utf-8")
        rel = check_file_path(file_path)
        target = skill.path / rel
        _no_symlinks(target, skill.path)
        if not target.is_file():
            raise SkillRefused(f"not_found: {skill.name} has no file {file_path!r}")
        return target.read_text(encoding="utf-8")

    def written_in_conversation(self, skill: Skill) -> bool:
        """True when a user's conversation (or its review) created the skill; False for
        shared skills and for what an admin or the CLI wrote, even into a user's folder."""
        marker = skill.path / ORIGIN_FILE
        if skill.owner is None or marker.is_symlink() or not marker.is_file():
            return False
        return marker.read_text(encoding="utf-8").strip() in CONVERSATION_AUTHORS

    def files(self, skill: Skill) -> list[str]:
        out: list[str] = []
        for sub in SUBFOLDERS:
            for p in sorted((skill.path / sub).rglob("*")) if (skill.path / sub).is_dir() else ():
                if p.is_file() and not p.is_symlink():
                    out.append(p.relative_to(skill.path).as_posix())
        return out

    # --- writing --------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        if getattr(self._held, "yes", False):
            yield
            return
        ensure_folder(self.root)
        with exclusive_lock(self.root / ".lock"):
            self._held.yes = True
            try:
                yield
            finally:
                self._held.yes = False

    def _journaled(
        self,
        op: str,
        name: str,
        owner: UserRef | None,
        where: Callable[[], tuple[Path, str | None]],
        by: Provenance | None,
        write: Callable[[], T],
    ) -> T:
        """``write`` under the lock, journaled: ``where`` says (under the lock, before
        the write) which file the write leaves and with what text (None: absent)."""
        journal = self.journal
        if journal is None:
            return write()
        target = SHARED if owner is None else str(owner)
        with self._lock():
            settle_held(journal, Layer.SKILLS, target)
            path, text = where()
            data = None if text is None else text.encode("utf-8")
            entry = NewEntry(
                Layer.SKILLS, target, op, None, text, by or self.by or Provenance.system(), note=name
            )
            evidence = FileEvidence(self.root / ".lock", path, digest(data) if data is not None else ABSENT)
            entry_id = journal.stage(entry, evidence)
            try:
                result = write()
            except BaseException:
                journal.abort(entry_id)
                raise
            commit_written(journal, entry_id)
            return result

    def _finish_rollbacks(self, parent: Path) -> None:
        """Complete every rollback whose trail is in ``parent`` (see the module docstring)."""
        with self._lock():
            names = {n for e in parent.iterdir() if (n := _trail(e.name)) is not None}
            for name in sorted(names):
                self._roll_forward(parent, name)

    def _roll_forward(self, parent: Path, name: str) -> None:
        """Under the lock: the two renames and the clean-up of one rollback, from
        wherever it stopped. Idempotent."""
        staged, replaced, target = parent / f".{name}{_STAGED}", parent / f".{name}{_REPLACED}", parent / name
        if staged.is_dir():
            if target.exists():
                if replaced.exists():
                    shutil.rmtree(replaced)  # left by an earlier one; target is the live copy
                os.rename(target, replaced)
            os.rename(staged, target)
            _fsync_dir(parent)
        if replaced.exists():
            shutil.rmtree(replaced)

    def _require(self, name: str, owner: UserRef | None) -> Skill:
        skill = self._find_owned(name, owner)
        if skill is None:
            where = "shared skills" if owner is None else f"the skills of {owner}"
            raise SkillRefused(f"not_found: no skill {name!r} in {where}")
        return skill

    def _snapshot(self, skill: Skill) -> int:
        """Copy the current version into history; return its number."""
        hist = self._history_root(skill.name, skill.owner)
        ensure_folder(hist, self.root)
        n = max((int(p.name) for p in hist.iterdir() if p.name.isdigit()), default=0) + 1
        tmp = Path(tempfile.mkdtemp(dir=hist, prefix=f".{n}."))
        shutil.copytree(skill.path, tmp, dirs_exist_ok=True, symlinks=True)
        os.replace(tmp, hist / str(n))
        _fsync_dir(hist)
        return n

    def create(
        self,
        content: str,
        owner: UserRef | None,
        category: str | None = None,
        files: dict[str, str] | None = None,
        *,
        written_by: str | None = None,
        by: Provenance | None = None,
    ) -> Skill:
        """``written_by``: who in a conversation created it (``user``, ``review``),
        kept in a hidden ``.origin`` file; None — an admin or the CLI — writes none."""
        meta = parse_skill(content)

        def where() -> tuple[Path, str | None]:
            base = self._user_root(owner) if owner is not None else self.root / (category or "")
            return base / meta.name / SKILL_FILE, content

        return self._journaled(
            "create",
            meta.name,
            owner,
            where,
            by,
            lambda: self._create(content, owner, category, files, written_by),
        )

    def _create(
        self,
        content: str,
        owner: UserRef | None,
        category: str | None,
        files: dict[str, str] | None,
        written_by: str | None,
    ) -> Skill:
        meta = parse_skill(content)
        if written_by is not None and written_by not in CONVERSATION_AUTHORS:
            raise ValueError(f"written_by must be one of {', '.join(CONVERSATION_AUTHORS)}")
        _guarded(content, "SKILL.md")
        for rel, text in (files or {}).items():
            check_file_path(rel)
            self._check_file(rel, text)
        if category is not None:
            check_category(category)
        with self._lock():
            if self._find_owned(meta.name, owner) is not None:
                raise SkillExists(meta.name)
            if owner is None:
                parent = self.root / category if category else self.root
                if category in _RESERVED or meta.name in _RESERVED:
                    raise SkillRefused(f"invalid_name: {meta.name!r} is reserved")
            else:
                parent = self._user_root(owner)
            ensure_folder(parent, self.root)
            _no_symlinks(parent, self.root)
            tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{meta.name}."))
            try:
                replace_file(tmp / SKILL_FILE, content.encode("utf-8"))
                if written_by is not None:
                    replace_file(tmp / ORIGIN_FILE, written_by.encode("utf-8"))
                for rel, text in (files or {}).items():
                    ensure_folder((tmp / rel).parent, tmp)
                    replace_file(tmp / rel, text.encode("utf-8"))
                os.rename(tmp, parent / meta.name)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _fsync_dir(parent)
        return Skill(meta, parent / meta.name, owner)

    def edit(self, name: str, content: str, owner: UserRef | None, by: Provenance | None = None) -> Skill:
        return self._edit("edit", name, content, owner, by)

    def _edit(self, op: str, name: str, content: str, owner: UserRef | None, by: Provenance | None) -> Skill:
        def where() -> tuple[Path, str | None]:
            return self._require(name, owner).path / SKILL_FILE, content

        return self._journaled(op, name, owner, where, by, lambda: self._write_skill(name, content, owner))

    def _write_skill(self, name: str, content: str, owner: UserRef | None) -> Skill:
        meta = parse_skill(content, name)
        _guarded(content, "SKILL.md")
        with self._lock():
            skill = self._require(name, owner)
            self._snapshot(skill)
            replace_file(skill.path / SKILL_FILE, content.encode("utf-8"))
        return Skill(meta, skill.path, owner)

    def patch(
        self, name: str, old_string: str, new_string: str, owner: UserRef | None, by: Provenance | None = None
    ) -> Skill:
        skill = self._require(name, owner)
        current = self.read(skill)
        count = current.count(old_string) if old_string else 0
        if count != 1:
            raise SkillRefused(
                f"no_unique_match: old_string matches {count} times in {name}/SKILL.md; it must match exactly once"
            )
        return self._edit("patch", name, current.replace(old_string, new_string, 1), owner, by)

    def _check_file(self, file_path: str, text: str) -> None:
        if len(text) > MAX_FILE_CHARS:
            raise SkillRefused(
                f"too_large: {file_path} has {len(text):,} characters, the limit is {MAX_FILE_CHARS:,}"
            )
        _guarded(text, file_path)

    def write_file(
        self,
        name: str,
        file_path: str,
        file_content: str,
        owner: UserRef | None,
        by: Provenance | None = None,
    ) -> Skill:
        rel = check_file_path(file_path)
        self._check_file(file_path, file_content)

        def where() -> tuple[Path, str | None]:
            return self._require(name, owner).path / rel, file_content

        return self._journaled(
            "write_file", name, owner, where, by, lambda: self._write_file(name, rel, file_content, owner)
        )

    def _write_file(self, name: str, rel: PurePosixPath, file_content: str, owner: UserRef | None) -> Skill:
        with self._lock():
            skill = self._require(name, owner)
            target = skill.path / rel
            _no_symlinks(target, skill.path)
            self._snapshot(skill)
            ensure_folder(target.parent, skill.path)
            replace_file(target, file_content.encode("utf-8"))
        return skill

    def remove_file(
        self, name: str, file_path: str, owner: UserRef | None, by: Provenance | None = None
    ) -> Skill:
        rel = check_file_path(file_path)

        def where() -> tuple[Path, str | None]:
            return self._require(name, owner).path / rel, None

        return self._journaled(
            "remove_file", name, owner, where, by, lambda: self._remove_file(name, file_path, rel, owner)
        )

    def _remove_file(self, name: str, file_path: str, rel: PurePosixPath, owner: UserRef | None) -> Skill:
        with self._lock():
            skill = self._require(name, owner)
            target = skill.path / rel
            _no_symlinks(target, skill.path)
            if not target.is_file():
                raise SkillRefused(f"not_found: {name} has no file {file_path!r}")
            self._snapshot(skill)
            target.unlink()
            _fsync_dir(target.parent)
        return skill

    def delete(self, name: str, owner: UserRef | None, by: Provenance | None = None) -> int:
        """Remove the skill; its last version stays in history (returns its number)."""

        def where() -> tuple[Path, str | None]:
            return self._require(name, owner).path / SKILL_FILE, None

        return self._journaled("delete", name, owner, where, by, lambda: self._delete(name, owner))

    def _delete(self, name: str, owner: UserRef | None) -> int:
        with self._lock():
            skill = self._require(name, owner)
            n = self._snapshot(skill)
            # Rename away first: the skill disappears in one step, then the copy goes.
            grave = Path(tempfile.mkdtemp(dir=skill.path.parent, prefix=f".{name}.deleted."))
            os.replace(skill.path, grave / name)
            _fsync_dir(skill.path.parent)
            shutil.rmtree(grave, ignore_errors=True)
        return n

    def history(self, name: str, owner: UserRef | None) -> list[int]:
        check_name(name)
        hist = self._history_root(name, owner)
        return sorted(int(p.name) for p in hist.iterdir() if p.name.isdigit()) if hist.is_dir() else []

    def rollback(
        self, name: str, owner: UserRef | None, to: int | None = None, by: Provenance | None = None
    ) -> int:
        """Restore version ``to`` (default: the latest kept); the current version is kept
        in history first. Returns the version restored."""
        versions = self.history(name, owner)
        if not versions:
            raise SkillRefused(f"not_found: {name!r} has no previous versions")
        n = versions[-1] if to is None else to
        if n not in versions:
            raise SkillRefused(
                f"not_found: {name!r} has no version {n} (kept: {', '.join(map(str, versions))})"
            )
        src = self._history_root(name, owner) / str(n)
        content = (src / SKILL_FILE).read_text(encoding="utf-8")
        parse_skill(content, name)

        def where() -> tuple[Path, str | None]:
            skill = self._find_owned(name, owner)
            parent = skill.path.parent if skill else (self.root if owner is None else self._user_root(owner))
            return parent / name / SKILL_FILE, content

        return self._journaled(
            "rollback", name, owner, where, by, lambda: self._rollback(name, owner, src, n)
        )

    def _rollback(self, name: str, owner: UserRef | None, src: Path, n: int) -> int:
        with self._lock():
            skill = self._find_owned(name, owner)
            parent = skill.path.parent if skill else (self.root if owner is None else self._user_root(owner))
            if skill is not None:
                self._snapshot(skill)
            ensure_folder(parent, self.root)
            _no_symlinks(parent, self.root)
            tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}."))
            try:
                shutil.copytree(src, tmp, dirs_exist_ok=True)
                _fsync_tree(tmp)
                # The commit point: once the complete copy has its trail name, any later
                # reader finishes the rollback (module docstring).
                os.rename(tmp, parent / f".{name}{_STAGED}")
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _fsync_dir(parent)
            self._roll_forward(parent, name)
        return n

    def promote(self, name: str, user: UserRef, by: Provenance | None = None) -> Skill:
        """Copy a user's own skill into the shared skills (re-guarded), then remove it
        from the user's folder."""
        skill = self._require(name, user)
        files = {rel: self.read(skill, rel) for rel in self.files(skill)}
        shared = self.create(self.read(skill), None, skill.meta.category, files, by=by)
        self.delete(name, user, by)
        return shared
