"""``mnemo memory``: read and edit the curated memory files from a shell.

The edits go through the same ``memory`` tool the model uses, acting as an admin in a
primary context, so the same limits, threat scan and result texts apply; the tool's JSON
result is printed. Exit codes: 0 success, 1 refused, 2 usage error.

The configured backend is used (``open_backend``): files under ``memories/`` on SQLite,
rows when ``database.url`` is PostgreSQL (``memory/pg/curated.py``; the server is checked
and its schema migrated first, as ``mnemo run`` does).

``--user`` names an account; a linked account (``mnemo users link``, ``/link``) has no
USER.md of its own: show, add, replace and remove act on its person's shared profile,
and say which account keeps it (on stdout for ``show``, on stderr for the edits, whose
stdout is the tool's JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.memory_tool import MemoryCallContext, WriteAttempts, run_memory_tool
from mnemo.memory.scope import AgentContext, UserRef

if TYPE_CHECKING:
    from mnemo.gateway.storage import StorageBackend
    from mnemo.memory.ports import CuratedDocument


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "memory",
        help="show or edit the curated memory (MEMORY.md, USER.md)",
        description="Show or edit the curated memory files. Edits print the memory tool's JSON result.",
    )
    sub = parser.add_subparsers(dest="memory_command", metavar="ACTION", required=True)

    show = sub.add_parser("show", help="print the prompt blocks of MEMORY.md and, with --user, a USER.md")
    show.add_argument("--user", metavar="PLATFORM:ID", help="also show this chat user's USER.md")
    show.add_argument(
        "--json", action="store_true", help="print {memory, user} with location, entries, chars, limit"
    )
    show.set_defaults(handler=_show)

    add = sub.add_parser("add", help="add an entry")
    _target_arguments(add)
    add.add_argument("text", metavar="TEXT")
    add.set_defaults(handler=_edit, memory_action="add")

    replace = sub.add_parser("replace", help="replace the one entry containing OLD_TEXT with NEW_TEXT")
    _target_arguments(replace)
    replace.add_argument("old_text", metavar="OLD_TEXT")
    replace.add_argument("text", metavar="NEW_TEXT")
    replace.set_defaults(handler=_edit, memory_action="replace")

    remove = sub.add_parser("remove", help="remove the one entry containing OLD_TEXT")
    _target_arguments(remove)
    remove.add_argument("old_text", metavar="OLD_TEXT")
    remove.set_defaults(handler=_edit, memory_action="remove")


def _target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, choices=("memory", "user"), help="which file to edit")
    parser.add_argument("--user", metavar="PLATFORM:ID", help="whose USER.md (required with --target user)")


def _with_backend(settings: Settings, body: Callable[[StorageBackend], Awaitable[int]]) -> int:
    """Run ``body`` on the configured backend (one clear line if unreachable or too new)."""
    from mnemo.gateway.storage import open_backend

    async def main() -> int:
        backend = await open_backend(settings)
        try:
            return await body(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def _owner_note(backend: StorageBackend, ref: UserRef) -> str | None:
    """Who keeps ``ref``'s USER.md when ``ref`` is a linked account (None: ``ref`` itself)."""
    owner = backend.identities.canonical(ref)
    if owner == ref:
        return None
    return f"{ref} is linked: its USER.md is the shared profile of its person, kept under {owner}"


def _user_ref(text: str | None) -> UserRef | None:
    if text is None:
        return None
    try:
        return UserRef.parse(text)
    except InvalidIdentifier as e:
        raise CommandError(f"--user: {e}", EXIT_USAGE) from None


def _print_file(file: CuratedDocument) -> bool:
    """Print one file's prompt block; False if it cannot be read."""
    from mnemo.adapters.terminal import printable

    snap = file.load()
    for warning in snap.warnings:
        print(printable(f"warning: {warning}"), file=sys.stderr)
    print(printable(file.location))
    print(printable(snap.render_block() or ("(empty)" if snap.readable else "(cannot be read)")))
    return snap.readable


def _file_json(file: CuratedDocument) -> dict[str, Any]:
    snap = file.load()
    return {
        "location": file.location,
        "readable": snap.readable,
        "entries": list(snap.shown_entries),
        "chars": snap.chars,
        "limit": snap.limit,
        "warnings": list(snap.warnings),
    }


async def _show_json(backend: StorageBackend, ref: UserRef | None) -> int:
    from mnemo.adapters.terminal import printable_json

    files = backend.files
    body: dict[str, Any] = {"memory": await asyncio.to_thread(_file_json, files.shared()), "user": None}
    if ref is not None:
        try:
            profile = files.user(ref)
        except InvalidIdentifier as e:
            raise CommandError(f"--user: {e}", EXIT_USAGE) from None
        owner = backend.identities.canonical(ref)
        body["user"] = {
            "user": str(ref),
            "kept_under": str(owner),
            **await asyncio.to_thread(_file_json, profile),
        }
    print(printable_json(json.dumps(body, ensure_ascii=False, indent=2)))
    readable = body["memory"]["readable"] and (body["user"] is None or body["user"]["readable"])
    return EXIT_OK if readable else EXIT_REFUSED


def _show(args: argparse.Namespace, settings: Settings) -> int:
    ref = _user_ref(args.user)

    async def body(backend: StorageBackend) -> int:
        files = backend.files
        if args.json:
            return await _show_json(backend, ref)
        ok = await asyncio.to_thread(_print_file, files.shared())
        if ref is not None:
            print()
            try:
                profile = files.user(ref)
            except InvalidIdentifier as e:
                raise CommandError(f"--user: {e}", EXIT_USAGE) from None
            note = _owner_note(backend, ref)
            if note is not None:
                print(note)
            ok = await asyncio.to_thread(_print_file, profile) and ok
        return EXIT_OK if ok else EXIT_REFUSED

    return _with_backend(settings, body)


def _edit(args: argparse.Namespace, settings: Settings) -> int:
    ref = _user_ref(args.user)
    if args.target == "user" and ref is None:
        raise CommandError("--target user needs --user PLATFORM:ID (whose USER.md to edit)", EXIT_USAGE)
    if args.target == "memory" and ref is not None:
        raise CommandError("--user only applies to --target user; MEMORY.md is shared", EXIT_USAGE)
    tool_args: dict[str, str] = {"action": args.memory_action, "target": args.target}
    if args.memory_action in ("add", "replace"):
        tool_args["content"] = args.text
    if args.memory_action in ("replace", "remove"):
        tool_args["old_text"] = args.old_text
    ctx = MemoryCallContext(
        speaker=ref,
        agent_context=AgentContext.PRIMARY,
        is_admin=True,
        shared_write=settings.memory.shared_write,
    )
    from mnemo.adapters.terminal import printable, printable_json

    async def body(backend: StorageBackend) -> int:
        note = _owner_note(backend, ref) if ref is not None else None
        if note is not None:
            print(printable(f"note: {note}"), file=sys.stderr)
        result = await run_memory_tool(backend.files, tool_args, ctx, WriteAttempts())
        print(printable_json(json.dumps(result, ensure_ascii=False, indent=2)))
        return EXIT_OK if result["success"] else EXIT_REFUSED

    return _with_backend(settings, body)
