"""``mnemo skills``: list, show, install, remove, promote and roll back skills.

The CLI is trusted like an admin: without ``--user`` it works on the shared skills;
with ``--user PLATFORM:ID`` on that user's own. Every write goes through the same
validation and guard as the model's ``skill_manage`` tool. Exit codes: 0 success,
1 refused (validation, guard, not found), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillExists, SkillRefused, SkillStore
from mnemo.memory.skills.archive import MAX_FILE_BYTES, is_archive, unpack
from mnemo.memory.skills.format import SKILL_FILE, SUBFOLDERS, check_file_path


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "skills",
        help="list, show, install and manage skills (SKILL.md folders)",
        description="Manage skills: shared ones by default, a user's own with --user PLATFORM:ID.",
    )
    sub = parser.add_subparsers(dest="skills_command", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="list skills (shared, or the ones a user sees with --user)")
    _user(ls)
    ls.add_argument(
        "--json", action="store_true", help="print a JSON list of {name, description, scope, ...}"
    )
    ls.set_defaults(handler=_list)

    show = sub.add_parser("show", help="print a skill's SKILL.md or one supporting file")
    show.add_argument("name", metavar="NAME")
    _user(show)
    show.add_argument("--file", metavar="PATH", help="a supporting file, e.g. references/api.md")
    show.add_argument("--json", action="store_true", help="print {name, scope, owner, file, content}")
    show.set_defaults(handler=_show)

    install = sub.add_parser("install", help="install a skill folder, .zip or .tar.gz")
    install.add_argument("path", metavar="PATH")
    _user(install)
    install.add_argument("--category", help="shared skills only: group under this category folder")
    install.set_defaults(handler=_install)

    remove = sub.add_parser("remove", help="delete a skill (its last version stays in history)")
    remove.add_argument("name", metavar="NAME")
    _user(remove)
    remove.set_defaults(handler=_remove)

    promote = sub.add_parser("promote", help="make a user's own skill a shared one")
    promote.add_argument("name", metavar="NAME")
    promote.add_argument("--user", metavar="PLATFORM:ID", required=True, help="whose skill")
    promote.set_defaults(handler=_promote)

    history = sub.add_parser("history", help="list the kept previous versions of a skill")
    history.add_argument("name", metavar="NAME")
    _user(history)
    history.add_argument("--json", action="store_true", help="print {name, versions}, oldest first")
    history.set_defaults(handler=_history)

    rollback = sub.add_parser("rollback", help="restore a previous version (default: the latest kept)")
    rollback.add_argument("name", metavar="NAME")
    _user(rollback)
    rollback.add_argument(
        "--to", type=int, metavar="N", help="the version number from `mnemo skills history`"
    )
    rollback.set_defaults(handler=_rollback)


def _user(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user", metavar="PLATFORM:ID", help="a chat user's own skills instead of the shared ones"
    )


def _ref(args: argparse.Namespace) -> UserRef | None:
    if args.user is None:
        return None
    try:
        return UserRef.parse(args.user)
    except InvalidIdentifier as e:
        raise CommandError(f"--user: {e}", EXIT_USAGE) from None


def _store(settings: Settings) -> SkillStore:
    return SkillStore(settings.skills_dir, settings.skills.max_visible)


def _refused(e: SkillRefused) -> CommandError:
    if isinstance(e, SkillExists):  # its reason names the model's actions, not a command
        return CommandError(
            f"a skill named {e.name!r} is already installed: remove it first "
            f"(mnemo skills remove {e.name}) or install the new one under another name",
            EXIT_REFUSED,
        )
    return CommandError(e.reason, EXIT_REFUSED)


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable, printable_json

    ref = _ref(args)
    store = _store(settings)
    skills = store.visible(ref) if ref is not None else store.shared()
    rows = [
        {
            "name": s.name,
            "description": s.meta.description,
            "scope": s.scope,
            "category": s.meta.category,
            "platforms": list(s.meta.platforms),
            "owner": None if s.owner is None else str(s.owner),
        }
        for s in skills
    ]
    if args.json:
        print(printable_json(json.dumps(rows, ensure_ascii=False, indent=2)))
    elif not rows:
        print("(no skills)")
    else:
        for row in rows:
            print(printable(f"{row['name']}  [{row['scope']}]  {row['description']}"))
    return EXIT_OK


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable

    skill = _store(settings).find(args.name, _ref(args))
    if skill is None:
        raise CommandError(f"no skill named {args.name!r}", EXIT_REFUSED)
    try:
        text = _store(settings).read(skill, args.file)
    except SkillRefused as e:
        raise _refused(e) from None
    if args.json:
        from mnemo.adapters.terminal import printable_json

        body = {
            "name": skill.name,
            "scope": skill.scope,
            "owner": None if skill.owner is None else str(skill.owner),
            "file": args.file or SKILL_FILE,
            "content": text,
        }
        print(printable_json(json.dumps(body, ensure_ascii=False, indent=2)))
    else:
        print(printable(text))
    return EXIT_OK


def _read_folder(folder: Path) -> tuple[str, dict[str, str]]:
    files: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            raise CommandError(f"{rel} is a symbolic link; refused", EXIT_REFUSED)
        if p.is_dir() or rel == SKILL_FILE:
            continue
        if rel.split("/")[0] not in SUBFOLDERS and rel.split("/")[0].startswith("."):
            continue  # .git, .DS_Store: not part of the skill
        try:
            check_file_path(rel)
            if p.stat().st_size > MAX_FILE_BYTES:  # before reading it: a skill file is text, bounded
                raise SkillRefused(
                    f"too_large: {rel} is {p.stat().st_size:,} bytes; a skill file holds at most {MAX_FILE_BYTES:,}"
                )
            files[rel] = p.read_text(encoding="utf-8")
        except SkillRefused as e:
            raise _refused(e) from None
        except UnicodeDecodeError:
            raise CommandError(f"{rel} is not UTF-8 text; skills hold text only", EXIT_REFUSED) from None
    return (folder / SKILL_FILE).read_text(encoding="utf-8"), files


def _install(args: argparse.Namespace, settings: Settings) -> int:
    ref = _ref(args)
    if ref is not None and args.category:
        raise CommandError("--category applies to shared skills only", EXIT_USAGE)
    source = Path(args.path)
    if not source.exists():
        raise CommandError(f"{source}: no such file or folder", EXIT_USAGE)
    if not source.is_dir() and not is_archive(source):
        raise CommandError(f"{source}: expected a folder, a .zip or a .tar.gz", EXIT_USAGE)
    with tempfile.TemporaryDirectory() as tmp:
        try:  # streamed under the skills' own limits (memory/skills/archive.py)
            folder = source if source.is_dir() else unpack(source, Path(tmp))
        except SkillRefused as e:
            raise _refused(e) from None
        if not (folder / SKILL_FILE).is_file():
            raise CommandError(f"{folder}: no {SKILL_FILE}", EXIT_REFUSED)
        content, files = _read_folder(folder)
        try:
            skill = _store(settings).create(content, ref, args.category, files)
        except SkillRefused as e:
            raise _refused(e) from None
    print(f"installed {skill.name} ({skill.scope}) in {skill.path}")
    return EXIT_OK


def _remove(args: argparse.Namespace, settings: Settings) -> int:
    try:
        n = _store(settings).delete(args.name, _ref(args))
    except SkillRefused as e:
        raise _refused(e) from None
    print(f"removed {args.name}; its last version is kept as version {n} (mnemo skills rollback {args.name})")
    return EXIT_OK


def _promote(args: argparse.Namespace, settings: Settings) -> int:
    ref = _ref(args)
    assert ref is not None  # --user is required
    try:
        skill = _store(settings).promote(args.name, ref)
    except SkillRefused as e:
        raise _refused(e) from None
    print(f"promoted {skill.name} to the shared skills")
    return EXIT_OK


def _history(args: argparse.Namespace, settings: Settings) -> int:
    try:
        versions = _store(settings).history(args.name, _ref(args))
    except SkillRefused as e:
        raise _refused(e) from None
    if args.json:
        print(json.dumps({"name": args.name, "versions": list(versions)}))
    else:
        print("\n".join(map(str, versions)) if versions else "(no previous versions)")
    return EXIT_OK


def _rollback(args: argparse.Namespace, settings: Settings) -> int:
    try:
        n = _store(settings).rollback(args.name, _ref(args), args.to)
    except SkillRefused as e:
        raise _refused(e) from None
    print(f"{args.name} restored to version {n}")
    return EXIT_OK
