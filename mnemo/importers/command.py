"""``mnemo import --from hermes|openclaw PATH``: the command around the importers.

Exit codes as everywhere: 0 done (refused entries are listed, and do not fail the
import), 1 refused (the profile is in use, the source is damaged), 2 usage (a missing
path, the wrong kind of folder, a bad ``--user`` or ``--chat-map``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.importers.apply import Layer, Receipt, run
from mnemo.importers.chats import ChatMap, ChatMapError, read_mappings
from mnemo.importers.common import Bundle, SourceProblem
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef

TITLES = {"hermes": "Hermes Agent profile", "openclaw": "OpenClaw folder"}


def _user(args: argparse.Namespace) -> UserRef | None:
    if args.user is None:
        if args.source_kind == "hermes":
            raise CommandError(
                "--from hermes needs --user PLATFORM:ID: Hermes keeps one USER.md per profile; "
                "name the chat user it describes (e.g. --user telegram:12345)",
                EXIT_USAGE,
            )
        return None
    try:
        return UserRef.parse(args.user)
    except InvalidIdentifier as e:
        raise CommandError(f"--user: {e}", EXIT_USAGE) from None


def _chat_map(args: argparse.Namespace, settings: Settings) -> ChatMap:
    mappings = list(args.chat_map or [])
    try:
        for path in args.chat_map_file or []:
            mappings.extend(read_mappings(Path(path).expanduser()))
        return ChatMap(args.source_kind, mappings, group_per_user=settings.sessions.group_sessions_per_user)
    except ChatMapError as e:
        raise CommandError(f"--chat-map: {e}", EXIT_USAGE) from None


def _read(kind: str, path: Path, scratch: Path) -> Bundle:
    if kind == "hermes":
        from mnemo.importers import hermes

        return hermes.read(path, scratch)
    from mnemo.importers import openclaw

    return openclaw.read(path, scratch)


def import_foreign(args: argparse.Namespace, settings: Settings) -> int:
    if args.force:
        raise CommandError("--force applies to restoring a mnemo export, not to --from", EXIT_USAGE)
    user = _user(args)
    chats = _chat_map(args, settings)
    path = Path(args.file).expanduser()
    with tempfile.TemporaryDirectory(prefix="mnemo-import-src-") as scratch:
        try:
            bundle = _read(args.source_kind, path, Path(scratch))
            if args.dry_run:
                receipt = run(bundle, settings, chats, user, dry_run=True)
            else:
                from mnemo.gateway.storage import backend_for
                from mnemo.profile_lock import serving

                # Like a restore, never beside a bot that owns the store (SQLite's profile
                # lock). Replicas on PostgreSQL may keep serving: every write is a
                # transaction of its own, the sessions imported are new and ended.
                with serving(settings.home, shared_database=backend_for(settings).replicated):
                    receipt = run(bundle, settings, chats, user, dry_run=False)
        except SourceProblem as e:
            raise CommandError(str(e), EXIT_USAGE if e.usage else EXIT_REFUSED) from None
    if args.json:
        from mnemo.adapters.terminal import printable_json

        print(printable_json(json.dumps(receipt.to_json(), ensure_ascii=False, indent=2)))
    else:
        from mnemo.adapters.terminal import printable

        for line in report(receipt):
            print(printable(line))
    return EXIT_OK


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def report(r: Receipt) -> list[str]:
    """The receipt for people: counts per layer, sessions per chat, every refusal."""
    done, put = ("would be added", "would be imported") if r.dry_run else ("added", "imported")
    out = [f"{TITLES[r.kind]} {r.origin}" + (" — dry run, nothing was written" if r.dry_run else "")]

    def layer(title: str, layer_: Layer) -> None:
        out.append(
            f"{title}: {len(layer_.added)} {done}, {len(layer_.present)} already present, "
            f"{len(layer_.refused)} refused"
        )
        out.extend(f"  refused: {item!r} — {reason}" for item, reason in layer_.refused)
        out.extend(f"  note: {n}" for n in layer_.notes)

    layer("MEMORY.md entries", r.memory)
    layer(f"USER.md entries of {r.user_ref}" if r.user_ref else "USER.md entries", r.user)
    out.append(f"SOUL.md: {r.soul}")
    layer("skills", r.skills)
    if r.skills.added:
        out.append(f"  {'to install' if r.dry_run else 'installed'}: {', '.join(r.skills.added)}")
    out.append(
        f"sessions: {r.sessions_new} {put} ({_plural(r.messages_new, 'message')}), "
        f"{r.sessions_present} already imported"
    )
    for key, chat in sorted(r.chats.items()):
        sources = ", ".join(sorted(chat.sources))
        line = (
            f"  {key} ← {sources} ({chat.how}): {_plural(chat.sessions, 'session')}, "
            f"{_plural(chat.messages, 'message')}"
        )
        if chat.present_sessions:
            line += f", {chat.present_sessions} already imported"
        if chat.how == "unmapped":
            line += f"; map with --chat-map {sorted(chat.sources)[0]}=PLATFORM:CHAT_ID"
        out.append(line)
    left = [f"{n} {why}" for why, n in sorted(r.skipped_sessions.items())]
    if left:
        out.append(f"  sessions left out: {', '.join(left)}")
    left = [f"{n} {why}" for why, n in sorted(r.skipped_messages.items())]
    if left:
        out.append(f"  messages left out: {', '.join(left)}")
    out.extend(f"note: {n}" for n in r.notes)
    if r.refused:
        out.append(
            f"{_plural(r.refused, 'item')} refused (listed above); everything else is "
            f"{'ready to import' if r.dry_run else 'in place'}"
        )
    return out
