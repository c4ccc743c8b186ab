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

The journal (``memory/journal.py``)::

    mnemo memory history [--user P] [--layer L] [--since T] [--limit N] [--json]
    mnemo memory revert ID [--yes]

``history`` lists memory writes newest first with their provenance (``--json``: one
object per entry, keys ``id time layer target op old new since until actor trust
speaker session message chat tool_call reverts note undone``); ``--user`` keeps the
entries about that person or made in their turns, ``--since`` takes a date, a time
(ISO 8601, UTC unless it says otherwise) or an age (``30m``, ``12h``, ``7d``).
``revert`` undoes one entry through the same write path, journaled as the CLI's.
Edits made here are journaled with actor ``cli`` and trust ``admin``.

Proposals (``remember: ask`` and ``memory.consolidation``)::

    mnemo memory proposals [--user P | --shared] [--json]
    mnemo memory proposals accept|reject ID|all [--user P | --shared] [--json]

list what waits for a decision (``--json``: one object per proposal, the history's
keys), or accept (written through the file's scanned, bounded write path, journaled as
the CLI's) or reject (remembered: consolidation does not propose it again). Without
``--user`` or ``--shared``: everyone's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import Actor, JournalQuery, Layer, Provenance, Trust, line
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

    history = sub.add_parser("history", help="memory writes, newest first, with their provenance")
    history.add_argument("--user", metavar="PLATFORM:ID", help="about this person or made in their turns")
    history.add_argument("--layer", choices=[str(layer) for layer in Layer], help="one memory layer only")
    history.add_argument("--since", metavar="T", help="from a date/time (ISO 8601) or an age: 30m, 12h, 7d")
    history.add_argument("--limit", type=int, default=50, metavar="N", help="at most N entries (default 50)")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(handler=_history)

    revert = sub.add_parser("revert", help="undo one journal entry (through the same write path)")
    revert.add_argument("entry", type=int, metavar="ID")
    revert.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    revert.add_argument("--json", action="store_true", help="print JSON")
    revert.set_defaults(handler=_revert)

    proposals = sub.add_parser(
        "proposals", help="memory changes waiting for a decision; accept or reject them"
    )
    proposals.add_argument(
        "decision", nargs="?", choices=("accept", "reject"), help="decide instead of listing"
    )
    proposals.add_argument("which", nargs="?", metavar="ID|all", help="the proposal to decide, or all")
    whose = proposals.add_mutually_exclusive_group()
    whose.add_argument("--user", metavar="PLATFORM:ID", help="this person's proposals only")
    whose.add_argument("--shared", action="store_true", help="the shared notes' (MEMORY.md) only")
    proposals.add_argument("--json", action="store_true", help="print JSON")
    proposals.set_defaults(handler=_proposals)


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
        actor=Actor.CLI,
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


_AGE = re.compile(r"^(\d+)\s*([mhd])$")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: an age (``30m``, ``12h``, ``7d``), a date or a date and time (UTC
    unless it names its zone). Raises ``CommandError`` for anything else."""
    now = now or datetime.now(UTC)
    age = _AGE.match(text.strip().lower())
    if age is not None:
        n, unit = int(age.group(1)), age.group(2)
        unit_name = {"m": "minutes", "h": "hours", "d": "days"}[unit]
        return now - timedelta(**{unit_name: n})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(
            f"--since: {text!r} is neither a date/time (2025-03-01, 2025-03-01T12:00) nor an age (30m, 12h, 7d)",
            EXIT_USAGE,
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _history(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable, printable_json

    ref = _user_ref(args.user)
    if args.limit < 1:
        raise CommandError("--limit must be at least 1", EXIT_USAGE)
    since = parse_since(args.since) if args.since else None

    async def body(backend: StorageBackend) -> int:
        people = None
        if ref is not None:
            people = tuple(dict.fromkeys((str(ref), str(backend.identities.canonical(ref)))))
        query = JournalQuery(people=people, layer=args.layer, since=since, limit=args.limit)
        entries = await backend.journal.history(query)
        undone = await backend.journal.reverted([e.id for e in entries])
        if args.json:
            rows = [{**e.to_json(), "undone": e.id in undone} for e in entries]
            print(printable_json(json.dumps(rows, ensure_ascii=False, indent=2)))
        elif not entries:
            print("no memory writes" + (f" about {ref}" if ref is not None else ""))
        else:
            for e in entries:
                print(printable(line(e, reverted=e.id in undone)))
        return EXIT_OK

    return _with_backend(settings, body)


def _revert(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable, printable_json
    from mnemo.memory.journal_undo import undo

    async def body(backend: StorageBackend) -> int:
        entry = await backend.journal.get(args.entry)
        if entry is None:
            raise CommandError(f"no journal entry #{args.entry}", EXIT_REFUSED)
        if await backend.journal.reverted([entry.id]):
            raise CommandError(f"#{entry.id} is undone already", EXIT_REFUSED)
        if not args.yes:
            if not sys.stdin.isatty():
                raise CommandError("revert needs --yes when not run interactively", EXIT_REFUSED)
            print(printable(line(entry)))
            if input("Revert this change? [y/N] ").strip().lower() not in ("y", "yes"):
                print("not reverted")
                return EXIT_REFUSED
        done = await asyncio.to_thread(undo, backend.files, entry, Provenance(Actor.CLI, Trust.ADMIN))
        if args.json:
            out = {"reverted": entry.id, "success": done.ok, "message": done.message}
            if done.result is not None:
                out["entry"] = done.result.journal_id
            print(printable_json(json.dumps(out, ensure_ascii=False, indent=2)))
        else:
            print(printable(done.message))
        return EXIT_OK if done.ok else EXIT_REFUSED

    return _with_backend(settings, body)


def _proposals(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable, printable_json
    from mnemo.gateway.inbound.memory_command import proposal_line
    from mnemo.memory.journal import SHARED
    from mnemo.memory.journal_undo import apply_proposal

    ref = _user_ref(args.user)
    if (args.decision is None) != (args.which is None):
        raise CommandError("give both a decision and ID|all: mnemo memory proposals accept 12", EXIT_USAGE)
    wanted: int | None = None
    if args.which is not None and args.which.lower() != "all":
        if not args.which.lstrip("#").isdigit():
            raise CommandError(f"not a proposal id: {args.which!r} (a number, or all)", EXIT_USAGE)
        wanted = int(args.which.lstrip("#"))

    async def body(backend: StorageBackend) -> int:
        if ref is not None:
            people: tuple[str, ...] = tuple(dict.fromkeys((str(ref), str(backend.identities.canonical(ref)))))
        elif args.shared:
            people = (SHARED,)
        else:
            people = tuple(await backend.directory.everyone()) + (SHARED,)
        found = await backend.proposals.proposals(people)
        if args.decision is None:
            if args.json:
                print(printable_json(json.dumps([e.to_json() for e in found], ensure_ascii=False, indent=2)))
            elif not found:
                print("nothing waits for a decision")
            else:
                for e in found:
                    print(printable(f"{proposal_line(e)} (for {e.speaker})"))
            return EXIT_OK
        chosen = [e for e in found if wanted is None or e.id == wanted]
        if not chosen:
            raise CommandError(
                f"no open proposal #{wanted}" if wanted is not None else "nothing waits for a decision",
                EXIT_REFUSED,
            )
        results = []
        for e in chosen:
            if args.decision == "reject":
                await backend.proposals.decide(e.id, False)
                results.append(
                    {
                        "id": e.id,
                        "decision": "rejected",
                        "success": True,
                        "message": "will not be proposed again",
                    }
                )
                continue
            done = await asyncio.to_thread(
                apply_proposal, backend.files, e, Provenance(Actor.CLI, Trust.ADMIN)
            )
            if done.ok:
                await backend.proposals.decide(e.id, True)
            results.append({"id": e.id, "decision": "accepted", "success": done.ok, "message": done.message})
        if args.json:
            print(printable_json(json.dumps(results, ensure_ascii=False, indent=2)))
        else:
            for r in results:
                print(
                    printable(f"#{r['id']} {r['decision'] if r['success'] else 'not done'}: {r['message']}")
                )
        return EXIT_OK if all(r["success"] for r in results) else EXIT_REFUSED

    return _with_backend(settings, body)
